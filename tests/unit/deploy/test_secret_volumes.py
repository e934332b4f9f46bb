"""Every Secret a pod of ours mounts is readable by the user its containers run as: the kubelet
writes a Secret's files owned by root (group: the pod's fsGroup, if any) with the volume's
defaultMode (0644 when unset). The gateway's credentials at 0400 crashed its non-root pods."""

from __future__ import annotations

from typing import Any

from tests.deploy_manifests import objects, pod_specs

DEFAULT_MODE = 0o644


def _readable(mode: int, user: int, fs_group: int | None) -> bool:
    return bool((user == 0 and mode & 0o400) or (fs_group is not None and mode & 0o040) or mode & 0o004)


def _secret_mounts(spec: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(container, volume, mode) for every Secret volume a container mounts."""
    modes = {volume["name"]: volume["secret"].get("defaultMode", DEFAULT_MODE)
             for volume in spec.get("volumes", []) if "secret" in volume}
    return [(container["name"], mount["name"], modes[mount["name"]])
            for container in spec["containers"] for mount in container.get("volumeMounts", [])
            if mount["name"] in modes]


def test_every_mounted_secret_is_readable_by_its_containers_user() -> None:
    checked = 0
    for obj in objects():
        for spec in pod_specs(obj):
            pod_context = spec.get("securityContext", {})
            users = {container["name"]: container.get("securityContext", {}).get("runAsUser",
                                                                                 pod_context.get("runAsUser", 0))
                     for container in spec["containers"]}
            for container, volume, mode in _secret_mounts(spec):
                checked += 1
                assert _readable(mode, users[container], pod_context.get("fsGroup")), (
                    f"{obj['metadata']['name']}: container {container} (uid {users[container]}) cannot read "
                    f"Secret volume {volume} (mode {mode:o}, fsGroup {pod_context.get('fsGroup')})")
    assert checked >= 4  # the gateway's credentials, the webhook's certificate, the assignment key twice
