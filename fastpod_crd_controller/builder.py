"""The pure pod builder: one FaSTPod's pod, from its whole podSpec.

Nothing of the user's podSpec is dropped (init containers, tolerations, affinity, security
contexts, volumes, probes, ... all pass through untouched). The builder only adds:

- ``metadata``: ``generateName: <fastpod>-``, the FaSTPod's labels, its selector's
  ``matchLabels``, the name label and the revision label; the FaSTPod's annotations (the share
  among them, so the extender and the node agent read it from the pod); a controller owner
  reference, so the garbage collector deletes the pods with their FaSTPod;
- ``spec.schedulerName``: the fastgshare scheduler profile, unless the podSpec names one;
- ``spec.hostIPC: true`` only when the controller runs with ``--host-ipc`` (off by default: Pod
  Security's baseline level forbids it, and the MPS pipe directory that Allocate mounts is what
  MPS clients need on most drivers); a podSpec that sets ``hostIPC: true`` itself opts in, which
  passes through like everything else (issue 15, defect 10);
- on each GPU container: the ``fastgshare.caps.in.tum/vgpu: 1`` limit (and request, if the
  container lists requests), and the downward-API env ``FASTGSHARE_POD_NAME``,
  ``FASTGSHARE_POD_NAMESPACE`` and ``FASTGSHARE_POD`` (``<namespace>/<name>``), unless the
  container sets them. The node agent's Allocate adds the GPU, the hook and its socket.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import attrs

from fastgshare import keys
from fastpod_crd_controller.spec import FaSTPodSpec


@attrs.frozen(kw_only=True)
class PodConfig:
    """How the controller builds pods (from its flags)."""

    scheduler_name: str = keys.SCHEDULER_NAME
    host_ipc: bool = False  # give every pod hostIPC (--host-ipc); else only podSpecs that ask


def owner_reference(spec: FaSTPodSpec) -> dict[str, Any]:
    return {"apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND, "name": spec.name,
            "uid": spec.uid, "controller": True, "blockOwnerDeletion": True}


def make_pod(spec: FaSTPodSpec, config: PodConfig) -> dict[str, Any]:
    """The pod to create for ``spec`` (the API server completes the name)."""
    pod_spec = copy.deepcopy(dict(spec.pod_spec))
    pod_spec.setdefault("schedulerName", config.scheduler_name)
    if config.host_ipc:
        pod_spec.setdefault("hostIPC", True)
    pod_spec["containers"] = [
        gpu_container(container) if container["name"] in spec.gpu_containers else container
        for container in pod_spec["containers"]
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{spec.name}-",
            "namespace": spec.namespace,
            "labels": {**spec.pod_labels, keys.REVISION_LABEL: spec.revision},
            "annotations": dict(spec.annotations),
            "ownerReferences": [owner_reference(spec)],
        },
        "spec": pod_spec,
    }


def gpu_container(container: Mapping[str, Any]) -> dict[str, Any]:
    """``container`` with one vgpu slot and the downward-API env (a new dict; the input is kept)."""
    result = dict(container)
    resources = dict(result.get("resources") or {})
    resources["limits"] = {**(resources.get("limits") or {}), keys.VGPU_RESOURCE: "1"}
    if resources.get("requests"):
        resources["requests"] = {**resources["requests"], keys.VGPU_RESOURCE: "1"}
    result["resources"] = resources
    env = list(result.get("env") or [])
    taken = {item.get("name") for item in env if isinstance(item, Mapping)}
    env += [item for item in downward_env() if item["name"] not in taken]
    result["env"] = env
    return result


def downward_env() -> list[dict[str, Any]]:
    """The pod's identity for the hook's logs; FASTGSHARE_POD refers to the two before it."""
    return [
        {"name": keys.ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": keys.ENV_POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": keys.ENV_POD, "value": f"$({keys.ENV_POD_NAMESPACE})/$({keys.ENV_POD_NAME})"},
    ]
