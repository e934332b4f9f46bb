"""Finding a pod's UID in a process's cgroup file, for every cgroup layout kubelet makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from device_plugin.arbiter.identity import pod_uid_from_cgroup, pod_uid_of_pid

UID = "5f1c2d3e-aaaa-4bbb-8ccc-0123456789ab"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"0::/kubepods/burstable/pod{UID}/0123abcd\n", id="cgroup-v2-cgroupfs"),
        pytest.param(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}"
                     ".slice/cri-containerd-0123.scope\n", id="cgroup-v2-systemd"),
        pytest.param(f"12:memory:/kubepods/pod{UID}/abc\n11:cpu:/kubepods/pod{UID}/abc\n", id="cgroup-v1"),
    ],
)
def test_pod_uid_is_found(text: str) -> None:
    assert pod_uid_from_cgroup(text) == UID


@pytest.mark.parametrize("text", ["0::/user.slice/user-0.slice/session-1.scope\n", "", "0::/podcast/x\n"])
def test_processes_outside_pods_have_none(text: str) -> None:
    assert pod_uid_from_cgroup(text) is None


def test_reading_proc(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/pod{UID}/c\n")
    assert pod_uid_of_pid(42, proc=tmp_path) == UID
    assert pod_uid_of_pid(43, proc=tmp_path) is None
