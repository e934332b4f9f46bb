"""Finding a pod's UID in a process's cgroup file: kubelet's own layouts only.

Where the formats come from:

* kubelet names a pod's cgroup ``pod<uid>`` (``GetPodContainerName``, pkg/kubelet/cm/
  pod_container_manager_linux.go) below ``kubepods`` for Guaranteed pods and below
  ``kubepods/burstable`` or ``kubepods/besteffort`` for the other QoS classes
  (pkg/kubelet/cm/qos_container_manager_linux.go). The cgroupfs driver writes that name as a path,
  ``/kubepods/burstable/pod<uid>``; the systemd driver (``CgroupName.ToSystemd``,
  pkg/kubelet/cm/cgroup_manager_linux.go) joins the parts with ``-``, writes each ``-`` inside a part
  as ``_`` (``escapeSystemdCgroupName``) and expands the slice chain:
  ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice``.
* Below the pod: containerd names a container ``<id>`` (cgroupfs) or ``cri-containerd-<id>.scope``
  (systemd); CRI-O ``crio-<id>`` / ``crio-<id>.scope`` and, with ``conmon_cgroup = "pod"``, its
  monitor ``crio-conmon-<id>``; dockershim / cri-dockerd ``docker-<id>.scope``.
* ``/proc/<pid>/cgroup``: cgroup v1 has one ``N:controllers:/path`` line per hierarchy (controllers
  kubelet does not manage, such as ``rdma`` on older runtimes, stay at ``/``); cgroup v2 has the one
  line ``0::/path``. A reader in another cgroup namespace (on v2 every container has its own) sees
  paths relative to its namespace's root: one ``/..`` per level up (the kernel's
  ``cgroup_path_ns`` / ``kernfs_path_from_node``).

Lines marked "recorded" are copied from public reports (the issue named next to each), the
container ids and pod UIDs as they were; the rest are written by the rules above.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from device_plugin.arbiter.identity import pod_uid_from_cgroup, pod_uid_from_path, pod_uid_of_pid

UID = "5f1c2d3e-aaaa-4bbb-8ccc-0123456789ab"
SUID = UID.replace("-", "_")
OTHER = "0b1c2d3e-aaaa-4bbb-8ccc-0123456789ff"
SOTHER = OTHER.replace("-", "_")
CID = "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459"  # 64 hex digits, as runtimes use

V1_CONTROLLERS = ("pids", "hugetlb", "net_cls,net_prio", "cpu,cpuacct", "memory", "blkio", "freezer", "devices",
                  "perf_event", "cpuset")


def v1_file(path: str, *, unmanaged: str = "rdma", unified: str = "/") -> str:
    """A whole cgroup v1 file as runc writes it for a container at ``path`` on a hybrid host: every
    controller and ``name=systemd`` at ``path``, one controller the runtime leaves at ``/`` and the
    empty unified hierarchy (``0::``)."""
    lines = [f"{12 - n}:{controller}:{path}" for n, controller in enumerate(V1_CONTROLLERS)]
    lines += [f"2:{unmanaged}:/", f"1:name=systemd:{path}", f"0::{unified}"]
    return "\n".join(lines) + "\n"


# --- Accepted: each driver x cgroup version x runtime x QoS class ------------------------------------

FOUND = [
    # cgroupfs driver, cgroup v1 (kubeadm's default before 1.22; the real-node tier's node), containerd.
    pytest.param(v1_file(f"/kubepods/pod{UID}/{CID}"), UID, id="v1-cgroupfs-containerd-guaranteed"),
    pytest.param(v1_file(f"/kubepods/burstable/pod{UID}/{CID}"), UID, id="v1-cgroupfs-containerd-burstable"),
    pytest.param(v1_file(f"/kubepods/besteffort/pod{UID}/{CID}"), UID, id="v1-cgroupfs-containerd-besteffort"),
    # cgroupfs driver, cgroup v1, CRI-O: its cgroupfs manager names the container crio-<id>.
    pytest.param(v1_file(f"/kubepods/burstable/pod{UID}/crio-{CID}"), UID, id="v1-cgroupfs-crio-burstable"),
    pytest.param(v1_file(f"/kubepods/besteffort/pod{UID}/crio-conmon-{CID}"), UID, id="v1-cgroupfs-crio-conmon"),
    # systemd driver, cgroup v1, dockershim (recorded: lxc/lxc#3890, with its "12:rdma:/" line).
    pytest.param(v1_file("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d4424e6_bb13_42f4_a47a_"
                         "45a4828bf54d.slice/docker-d0b3604b67ac7930dd34ba3a796627e3e4717d12309e90a4afe3f38b6816ac98"
                         ".scope"), "7d4424e6-bb13-42f4-a47a-45a4828bf54d", id="v1-systemd-docker-burstable-recorded"),
    # systemd driver, cgroup v1, CRI-O (recorded: opencontainers/runc#4620, including its "11:files:/").
    pytest.param(v1_file("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda5c1f8d5_1919_434d_add7_"
                         "4afaafdaef89.slice/crio-5eed917563583925ffdbd40a64efb2aaffe58638e57add8becaf460fe74f5b1c"
                         ".scope", unmanaged="files"),
                 "a5c1f8d5-1919-434d-add7-4afaafdaef89", id="v1-systemd-crio-burstable-recorded"),
    pytest.param(v1_file(f"/kubepods.slice/kubepods-pod{SUID}.slice/cri-containerd-{CID}.scope"), UID,
                 id="v1-systemd-containerd-guaranteed"),
    pytest.param(v1_file(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/"
                         f"cri-containerd-{CID}.scope"), UID, id="v1-systemd-containerd-besteffort"),
    # cgroupfs driver, cgroup v2.
    pytest.param(f"0::/kubepods/pod{UID}/{CID}\n", UID, id="v2-cgroupfs-containerd-guaranteed"),
    pytest.param(f"0::/kubepods/burstable/pod{UID}/{CID}\n", UID, id="v2-cgroupfs-containerd-burstable"),
    pytest.param(f"0::/kubepods/besteffort/pod{UID}/crio-{CID}\n", UID, id="v2-cgroupfs-crio-besteffort"),
    pytest.param(f"0::/kubepods/pod{UID}\n", UID, id="v2-cgroupfs-pod-level"),
    # systemd driver, cgroup v2 (kubeadm's default since 1.22), containerd (recorded: netdata/netdata#4868).
    pytest.param("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod55c6c714_b240_4dec_9a45_"
                 "57b61696ab6e.slice/cri-containerd-2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6c4eb501ca132ac36"
                 ".scope\n", "55c6c714-b240-4dec-9a45-57b61696ab6e", id="v2-systemd-containerd-burstable-recorded"),
    pytest.param(f"0::/kubepods.slice/kubepods-pod{SUID}.slice/cri-containerd-{CID}.scope\n", UID,
                 id="v2-systemd-containerd-guaranteed"),
    pytest.param(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/"
                 f"cri-containerd-{CID}.scope\n", UID, id="v2-systemd-containerd-besteffort"),
    # systemd driver, cgroup v2, CRI-O (recorded: openshift/microshift#697, a container and the pause).
    pytest.param("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podc8bad552_5c99_4d4f_b71c_"
                 "c426c0cde014.slice/crio-15b6e0c6490cad17fcf69eb837794349b4df96f84ba96c6be9828fe281c055a9.scope\n",
                 "c8bad552-5c99-4d4f-b71c-c426c0cde014", id="v2-systemd-crio-besteffort-recorded"),
    # CRI-O's conmon in the pod's slice, conmon_cgroup = "pod" (recorded: opencontainers/runc#4620).
    pytest.param("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod207aaad1_659f_4db8_88e0_"
                 "46e0cdcc3004.slice/crio-conmon-32da98c8522068be05a7510a3eddb09cad6ed2f03286180d0e931d0d0b6224a6"
                 ".scope\n", "207aaad1-659f-4db8-88e0-46e0cdcc3004", id="v2-systemd-crio-conmon-recorded"),
    pytest.param(f"0::/kubepods.slice/kubepods-pod{SUID}.slice/crio-{CID}.scope\n", UID,
                 id="v2-systemd-crio-guaranteed"),
    # kind: systemd driver with --cgroup-root=/kubelet (recorded: containerd/nri#227).
    pytest.param("0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-"
                 "besteffort-pod1e597579_417e_482f_bf65_5fe170c3aebd.slice/cri-containerd-a09bc17f5aa29b0dbdec9ede5f"
                 "46cf1396d2405917ab02e6f1eb1019f388396e.scope\n", "1e597579-417e-482f-bf65-5fe170c3aebd",
                 id="v2-systemd-kind-cgroup-root-recorded"),
    # Seen by an agent in its own cgroup namespace (v2): the agent's container is at
    # kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<A>.slice/cri-containerd-<a>.scope.
    pytest.param(f"0::/../../../kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice/"
                 f"cri-containerd-{CID}.scope\n", UID, id="v2-systemd-namespaced-other-qos"),
    pytest.param(f"0::/../../kubepods-burstable-pod{SUID}.slice/cri-containerd-{CID}.scope\n", UID,
                 id="v2-systemd-namespaced-same-qos"),
    pytest.param(f"0::/../../../kubepods-pod{SUID}.slice/cri-containerd-{CID}.scope\n", UID,
                 id="v2-systemd-namespaced-guaranteed"),
    # ... and an agent at /kubepods/pod<A>/<a> (Guaranteed, cgroupfs driver).
    pytest.param(f"0::/../../besteffort/pod{UID}/{CID}\n", UID, id="v2-cgroupfs-namespaced-other-qos"),
    pytest.param(f"0::/../../pod{UID}/{CID}\n", UID, id="v2-cgroupfs-namespaced-same-qos"),
    pytest.param(f"0::/kubepods/burstable/pod{UID}/{CID}/nested/deeper\n", UID, id="sub-cgroup-inside-the-pod"),
]


@pytest.mark.parametrize(("text", "uid"), FOUND)
def test_pod_uid_is_found(text: str, uid: str) -> None:
    assert pod_uid_from_cgroup(text) == uid


# --- Refused: look-alikes ------------------------------------------------------------------------------

NOT_A_POD = [
    pytest.param("0::/user.slice/user-0.slice/session-1.scope\n", id="host-session"),
    pytest.param("", id="empty"),
    pytest.param("0::/podcast/x\n", id="pod-prefix-word"),
    # A pod<uid> at the root, in each driver's spelling.
    pytest.param(f"0::/pod{UID}\n", id="cgroupfs-pod-at-the-root"),
    pytest.param(f"0::/pod{UID}/{CID}\n", id="cgroupfs-pod-at-the-root-with-a-container"),
    pytest.param(f"0::/pod{UID}.scope\n", id="host-scope-named-like-a-pod"),
    pytest.param(f"0::/kubepods-burstable-pod{SUID}.slice/cri-containerd-{CID}.scope\n",
                 id="systemd-pod-slice-at-the-root"),
    pytest.param(f"0::/kubepods-burstable.slice/kubepods-burstable-pod{SUID}.slice/x.scope\n",
                 id="systemd-qos-slice-at-the-root"),
    # kubelet on the systemd driver and containerd on cgroupfs (SystemdCgroup = false): runc takes the
    # "slice:prefix:id" cgroupsPath as a directory name, outside kubelet's pod cgroups (recorded:
    # open-telemetry/opentelemetry-java#4507). Fix the runtime's configuration; the pod is refused.
    pytest.param("11:perf_event:/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_94b56cbab864.slice:cri-containerd:"
                 "ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459\n"
                 "10:blkio:/system.slice/containerd.service/kubepods-besteffort-pod0125ec2f_b64a_4868_8f5b_"
                 "94b56cbab864.slice:cri-containerd:ee4b20e90ac7f42a10bd004d05646b13d8ab5e2c5e7cbc01abf8006bac016459\n",
                 id="driver-mismatch-recorded"),
    # A pod<uid> outside the kubepods tree.
    pytest.param(f"0::/system.slice/pod{UID}.scope\n", id="host-scope-in-system-slice"),
    pytest.param(f"0::/mygroup/pod{UID}/x\n", id="self-made-cgroup"),
    pytest.param(f"0::/mygroup/kubepods/burstable/pod{UID}/x\n", id="self-made-kubepods-below-the-root"),
    pytest.param(f"0::/user.slice/user-1000.slice/user@1000.service/kubepods/pod{UID}\n", id="user-delegated"),
    pytest.param(f"0::/kubepods/burstable/x/pod{UID}\n", id="pod-not-directly-below-its-qos"),
    pytest.param(f"0::/kubepods/guaranteed/pod{UID}\n", id="no-guaranteed-qos-cgroup"),
    pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-besteffort-pod{SUID}.slice\n",
                 id="systemd-pod-in-another-qos-slice"),
    pytest.param(f"0::/other.slice/kubepods.slice/kubepods-pod{SUID}.slice\n", id="systemd-foreign-chain"),
    pytest.param(f"0::/system.slice/kubepods-pod{SUID}.slice\n", id="systemd-pod-slice-outside-kubepods"),
    pytest.param(f"0::/system.slice/crio-conmon-{CID}.scope\n", id="crio-conmon-in-system-slice"),
    pytest.param(f"0::/kubepods/burstable/kubepods-burstable-pod{SUID}.slice\n", id="drivers-mixed"),
    pytest.param("0::/kubepods.slice/kubepods-burstable.slice\n", id="qos-slice-itself"),
    pytest.param("0::/kubepods/burstable\n", id="qos-cgroup-itself"),
    # Not a pod UID: upper case, or a static pod's hash (kubelet's own UID, which no API pod has).
    pytest.param(f"0::/kubepods/burstable/pod{UID.upper()}/x\n", id="uppercase-uid"),
    pytest.param("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8daa50c3a64c9ff60bb9eab7b44b56fd"
                 ".slice/cri-containerd-2884d57c0e100d7a9a2f9487ce0bc2986bca3430e988af7a4865aff061f51ac5.scope\n",
                 id="static-pod-hash-recorded"),  # recorded: netdata/netdata#4868
    # .. and . components.
    pytest.param(f"0::/kubepods/burstable/pod{UID}/../../besteffort/pod{OTHER}\n", id="dot-dot-inside"),
    pytest.param(f"0::/kubepods/burstable/../besteffort/pod{UID}/x\n", id="dot-dot-inside-before-the-pod"),
    pytest.param(f"0::/kubepods/./pod{UID}/x\n", id="dot-inside"),
    pytest.param(f"0::/kubepods//pod{UID}/x\n", id="empty-component"),
    pytest.param(f"0::kubepods/pod{UID}/x\n", id="not-absolute"),
    pytest.param(f"0::/../../../foo/pod{UID}/x\n", id="namespaced-outside-kubepods"),
    # One level up from the reader is still inside the reader's own pod, where no other pod lives.
    pytest.param(f"0::/../pod{UID}/x\n", id="namespaced-one-level-up-cgroupfs"),
    pytest.param(f"0::/../kubepods-burstable-pod{SUID}.slice/x.scope\n", id="namespaced-one-level-up-systemd"),
    pytest.param(f"0::/../burstable/pod{UID}/x\n", id="namespaced-one-level-up-to-a-qos"),
    # Lines that name two pods name none.
    pytest.param(f"12:memory:/kubepods/pod{UID}/a\n11:cpu:/kubepods/pod{OTHER}/b\n", id="two-pods-in-one-file"),
    pytest.param(f"12:memory:/kubepods.slice/kubepods-pod{SUID}.slice/a.scope\n"
                 f"1:name=systemd:/kubepods.slice/kubepods-pod{SOTHER}.slice/a.scope\n", id="two-pods-systemd"),
]


@pytest.mark.parametrize("text", NOT_A_POD)
def test_everything_else_names_no_pod(text: str) -> None:
    assert pod_uid_from_cgroup(text) is None


def test_a_pod_cannot_claim_another_pod_from_a_nested_cgroup() -> None:
    # A root process in pod UID makes cgroups named after pod OTHER inside its own: it is still UID.
    assert pod_uid_from_cgroup(f"0::/kubepods/burstable/pod{UID}/c1/pod{OTHER}\n") == UID
    assert pod_uid_from_cgroup(f"0::/kubepods.slice/kubepods-pod{SUID}.slice/c.scope/kubepods.slice/"
                               f"kubepods-pod{SOTHER}.slice\n") == UID


def test_lines_that_name_no_pod_do_not_outvote_one_that_does() -> None:
    # cgroup v1: controllers the runtime does not manage stay at "/" (rdma on older runc).
    assert pod_uid_from_cgroup(v1_file(f"/kubepods/pod{UID}/{CID}")) == UID
    assert pod_uid_from_cgroup(v1_file("/system.slice/containerd.service")) is None


def test_a_path_is_parsed_on_its_own() -> None:
    assert pod_uid_from_path(f"/kubepods/besteffort/pod{UID}") == UID
    assert pod_uid_from_path(f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SUID}.slice") == UID
    assert pod_uid_from_path("/") is None


def test_reading_proc(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/pod{UID}/c\n")
    assert pod_uid_of_pid(42, proc=tmp_path) == UID
    assert pod_uid_of_pid(43, proc=tmp_path) is None
