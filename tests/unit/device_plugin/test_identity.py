"""Finding a pod's UID in a process's cgroup file: kubelet's own layouts only."""

from __future__ import annotations

from pathlib import Path

import pytest

from device_plugin.arbiter.identity import pod_uid_from_cgroup, pod_uid_of_pid

UID = "5f1c2d3e-aaaa-4bbb-8ccc-0123456789ab"
SUID = UID.replace("-", "_")
OTHER = "0b1c2d3e-aaaa-4bbb-8ccc-0123456789ff"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"0::/kubepods/burstable/pod{UID}/0123abcd\n", id="v2-cgroupfs-burstable"),
        pytest.param(f"0::/kubepods/besteffort/pod{UID}/0123abcd\n", id="v2-cgroupfs-besteffort"),
        pytest.param(f"0::/kubepods/pod{UID}/0123abcd\n", id="v2-cgroupfs-guaranteed"),
        pytest.param(f"0::/kubepods/pod{UID}\n", id="v2-cgroupfs-pod-level"),
        pytest.param(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}"
                     ".slice/cri-containerd-0123.scope\n", id="v2-systemd-besteffort"),
        pytest.param(f"0::/kubepods.slice/kubepods-pod{SUID}.slice/cri-containerd-0123.scope\n",
                     id="v2-systemd-guaranteed"),
        pytest.param(f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
                     f"kubelet-kubepods-burstable-pod{SUID}.slice/cri-containerd-1.scope\n", id="v2-systemd-kind-root"),
        pytest.param(f"12:memory:/kubepods/pod{UID}/abc\n11:cpu:/kubepods/pod{UID}/abc\n0::/\n", id="v1-cgroupfs"),
        pytest.param(f"12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/"
                     f"docker-1.scope\n1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
                     f"kubepods-burstable-pod{SUID}.slice/docker-1.scope\n", id="v1-systemd"),
        pytest.param(f"0::/../../besteffort/pod{UID}/c1\n", id="v2-cgroupfs-seen-from-a-cgroup-namespace"),
        pytest.param(f"0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/c.scope\n",
                     id="v2-systemd-seen-from-a-cgroup-namespace"),
        pytest.param(f"0::/kubepods/burstable/pod{UID}/c1/nested/deeper\n", id="sub-cgroup-inside-the-pod"),
    ],
)
def test_pod_uid_is_found(text: str) -> None:
    assert pod_uid_from_cgroup(text) == UID


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("0::/user.slice/user-0.slice/session-1.scope\n", id="host-session"),
        pytest.param("", id="empty"),
        pytest.param("0::/podcast/x\n", id="pod-prefix-word"),
        pytest.param(f"0::/pod{UID}.scope\n", id="host-scope-named-like-a-pod"),
        pytest.param(f"0::/system.slice/pod{UID}.scope\n", id="host-scope-in-system-slice"),
        pytest.param(f"0::/mygroup/pod{UID}/x\n", id="self-made-cgroup"),
        pytest.param(f"0::/mygroup/kubepods/burstable/pod{UID}/x\n", id="self-made-kubepods-below-the-root"),
        pytest.param(f"0::/user.slice/user-1000.slice/user@1000.service/kubepods/pod{UID}\n", id="user-delegated"),
        pytest.param(f"0::/kubepods/burstable/x/pod{UID}\n", id="pod-not-directly-below-its-qos"),
        pytest.param(f"0::/kubepods/burstable/pod{UID.upper()}/x\n", id="uppercase-uid"),
        pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{SUID}.slice\n",
                     id="systemd-pod-in-another-qos-slice"),
        pytest.param(f"0::/other.slice/kubepods.slice/kubepods-pod{SUID}.slice\n", id="systemd-foreign-chain"),
        pytest.param(f"0::/system.slice/kubepods-pod{SUID}.slice\n", id="systemd-pod-slice-outside-kubepods"),
        pytest.param(f"0::/../../../foo/pod{UID}/x\n", id="relative-outside-kubepods"),
        pytest.param(f"0::/kubepods/burstable/pod{UID}/../../pod{OTHER}\n", id="dot-dot-inside"),
        pytest.param(f"12:memory:/kubepods/pod{UID}/a\n11:cpu:/kubepods/pod{OTHER}/b\n", id="two-pods-in-one-file"),
    ],
)
def test_everything_else_names_no_pod(text: str) -> None:
    assert pod_uid_from_cgroup(text) is None


def test_a_pod_cannot_claim_another_pod_from_a_nested_cgroup() -> None:
    # A root process in pod UID makes a cgroup named after pod OTHER inside its own: it is still UID.
    assert pod_uid_from_cgroup(f"0::/kubepods/burstable/pod{UID}/c1/pod{OTHER}\n") == UID


def test_reading_proc(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/pod{UID}/c\n")
    assert pod_uid_of_pid(42, proc=tmp_path) == UID
    assert pod_uid_of_pid(43, proc=tmp_path) is None
