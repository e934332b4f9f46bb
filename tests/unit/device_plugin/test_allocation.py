"""Choosing the pod an Allocate call is for, and what its containers get."""

from __future__ import annotations

import stat
from pathlib import Path, PurePosixPath

import attrs
import pytest

from device_plugin.allocation import (
    SIMULATED_GPU_FILES,
    Allocator,
    AmbiguousAllocate,
    HostPaths,
    NoPendingPod,
    SimulatedDriver,
    answer_for,
    candidates,
    preferred_slots,
    vetted,
)
from device_plugin.arbiter.shares import share_of
from fastgshare import keys
from fastgshare.assignment_signature import AssignmentTrust
from fastgshare.share import ShareSpec, share_annotations
from simgpu.state import LOCK_FILE, STATE_FILE
from tests.builders import TEST_TRUST, make_share
from tests.builders_k8s import assignment, pod_record

NODE = "n1"
PATHS = HostPaths(hook_library="/var/lib/fastgshare/lib/libfastgshare-hook.1.so", run_dir="/var/lib/fastgshare/run",
                  mps_pipe_dir="/tmp/nvidia-mps")


def test_candidates_are_waiting_pods_on_this_node_oldest_first() -> None:
    pods = [
        pod_record("late", NODE, assigned=assignment(NODE, "G0", at_ms=30)),
        pod_record("early", NODE, assigned=assignment(NODE, "G1", at_ms=10)),
        pod_record("done", NODE, assigned=assignment(NODE, "G0", at_ms=1), allocated=True),
        pod_record("unassigned", NODE),
        pod_record("other-node", "n2", assigned=assignment("n2", "G0", at_ms=1)),
        pod_record("finished", NODE, assigned=assignment(NODE, "G0", at_ms=1), phase="Succeeded"),
    ]
    found, problems = candidates(pods, NODE)
    assert [c.pod.name for c in found] == ["early", "late"]
    assert problems == []


def test_unreadable_or_misdirected_assignments_are_reported_not_served() -> None:
    pods = [pod_record("bad", NODE, raw_assignment="{oops"),
            pod_record("moved", NODE, assigned=assignment("n9", "G0"))]
    found, problems = candidates(pods, NODE)
    assert found == []
    assert problems[0].startswith("pod team-a/bad: pod assignment: not valid JSON")
    assert problems[1] == "pod team-a/moved: assignment refused: it names node n9, but the pod is on node n1"


def test_no_pending_pod_message_explains_and_lists_problems() -> None:
    with pytest.raises(NoPendingPod) as caught:
        Allocator(NODE, PATHS).peek([pod_record("bad", NODE, raw_assignment="[]")])
    message = str(caught.value)
    assert "no pod bound to node n1 is waiting for a GPU" in message
    assert f"schedulerName: {keys.SCHEDULER_NAME}" in message
    assert "ignored: pod team-a/bad: pod assignment: expected a JSON object" in message


def test_grant_without_mps_sets_no_mps_environment() -> None:
    grant = Allocator(NODE, PATHS).grant([pod_record("p", NODE, assigned=assignment(NODE, "G7"))], 1,
                                         mps_enabled=False)
    [container] = grant.containers
    assert container.envs[keys.ENV_VISIBLE_DEVICES] == "G7"
    assert keys.ENV_MPS_THREAD_PERCENTAGE not in container.envs
    assert keys.ENV_MPS_PIPE_DIRECTORY not in container.envs
    assert [m.container_path for m in container.mounts] == [keys.CONTAINER_HOOK_PATH, keys.CONTAINER_RUN_DIR]
    assert grant.pod_complete


def _simulated_paths(root: Path) -> tuple[SimulatedDriver, HostPaths]:
    driver = SimulatedDriver(libcuda="/s/lib/libcuda-simulated.1.so", libnvidia_ml="/s/lib/libnvidia-ml-simulated.1.so",
                             gpu_dirs={"G7": str(root / "G7"), "G8": str(root / "G8")},
                             gpu_memory={"G7": 16 << 30, "G8": 8 << 30})
    return driver, HostPaths(hook_library=PATHS.hook_library, run_dir=PATHS.run_dir, mps_pipe_dir=PATHS.mps_pipe_dir,
                             simulated_driver=driver)


def test_simulated_gpus_get_the_simulated_driver_and_their_gpus_two_state_files(tmp_path: Path) -> None:
    driver, paths = _simulated_paths(tmp_path)
    grant = Allocator(NODE, paths).grant([pod_record("p", NODE, assigned=assignment(NODE, "G8"))], 1,
                                         mps_enabled=True)
    [container] = grant.containers
    mounts = {m.container_path: (m.host_path, m.read_only) for m in container.mounts}
    assert mounts["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] == (driver.libcuda, True)
    assert mounts["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] == (driver.libnvidia_ml, True)
    # The driver opens <FASTGSHARE_FAKE_GPU_DIR>/fake_gpu.state and .lock: the same container paths as
    # before, but only these two files are the GPU's; the directory around them is the container's own.
    view = PurePosixPath(keys.CONTAINER_FAKE_GPU_DIR)
    assert mounts[str(view / STATE_FILE)] == (str(tmp_path / "G8" / STATE_FILE), False)
    assert mounts[str(view / LOCK_FILE)] == (str(tmp_path / "G8" / LOCK_FILE), False)
    assert keys.CONTAINER_FAKE_GPU_DIR not in mounts
    assert container.envs[keys.ENV_FAKE_GPU_DIR] == keys.CONTAINER_FAKE_GPU_DIR
    assert container.envs[keys.ENV_FAKE_GPU_MEMORY] == str(8 << 30)


def test_nothing_a_tenant_may_write_is_a_directory_or_anything_but_the_simulated_gpus_own_files(tmp_path: Path) -> None:
    """Issue 42, row 8: the GPU's state directory was mounted writable into every GPU pod, so a
    file team B wrote there showed in team A's pod. Now a pod can create, replace or remove no
    file another pod sees: its only writable mounts are the simulated GPU's state and lock files
    (the simulated hardware every process of the GPU maps, as every GPU container opens
    /dev/nvidia*), single files, never a directory."""
    _, paths = _simulated_paths(tmp_path)
    grant = Allocator(NODE, paths).grant([pod_record("p", NODE, assigned=assignment(NODE, "G7"))], 1,
                                         mps_enabled=True)
    [container] = grant.containers
    writable = {m.host_path for m in container.mounts if not m.read_only}
    assert writable == {str(tmp_path / "G7" / STATE_FILE), str(tmp_path / "G7" / LOCK_FILE)}
    assert all(Path(path).is_file() for path in writable)


def test_allocate_makes_the_state_files_so_the_runtime_never_makes_directories_in_their_place(tmp_path: Path) -> None:
    """A bind mount whose host file is missing makes containerd create a directory there, which
    would break the simulated GPU for every pod: the files exist before the answer leaves."""
    _, paths = _simulated_paths(tmp_path)
    (tmp_path / "G7").mkdir()
    (tmp_path / "G7" / STATE_FILE).write_bytes(b"kept")  # a GPU in use keeps its state
    Allocator(NODE, paths).grant([pod_record("p", NODE, assigned=assignment(NODE, "G7"))], 1, mps_enabled=True)
    assert (tmp_path / "G7" / STATE_FILE).read_bytes() == b"kept"
    lock = tmp_path / "G7" / LOCK_FILE
    assert lock.read_bytes() == b""
    assert stat.S_IMODE(lock.stat().st_mode) == 0o666  # containers of any user attach to the simulated GPU


def test_allocate_that_cannot_make_the_state_files_refuses_with_the_path(tmp_path: Path) -> None:
    _, paths = _simulated_paths(tmp_path)
    (tmp_path / "G7" / LOCK_FILE).mkdir(parents=True)  # what a runtime leaves for a missing file
    with pytest.raises(NoPendingPod, match=f"simulated GPU G7: {tmp_path / 'G7' / LOCK_FILE} is a directory"):
        Allocator(NODE, paths).grant([pod_record("p", NODE, assigned=assignment(NODE, "G7"))], 1, mps_enabled=True)


def test_a_link_in_place_of_a_state_file_is_refused_never_mounted(tmp_path: Path) -> None:
    """A bind mount follows links: a link planted where the state file was (by a pod, when the
    directory was mounted writable) would give the next pod a host file of the link's choice."""
    _, paths = _simulated_paths(tmp_path)
    (tmp_path / "G7").mkdir()
    (tmp_path / "G7" / STATE_FILE).symlink_to("/etc/hostname")
    with pytest.raises(NoPendingPod, match=f"{tmp_path / 'G7' / STATE_FILE} is a symbolic link; remove it"):
        Allocator(NODE, paths).grant([pod_record("p", NODE, assigned=assignment(NODE, "G7"))], 1, mps_enabled=True)


def test_the_gpus_state_directory_is_no_longer_writable_by_all(tmp_path: Path) -> None:
    _, paths = _simulated_paths(tmp_path)
    (tmp_path / "G7").mkdir()
    (tmp_path / "G7").chmod(0o777)  # what agents before issue 42 made it, for pods to create the files
    Allocator(NODE, paths).grant([pod_record("p", NODE, assigned=assignment(NODE, "G7"))], 1, mps_enabled=True)
    assert stat.S_IMODE((tmp_path / "G7").stat().st_mode) == 0o755


def test_pods_on_one_simulated_gpu_get_the_same_answer(tmp_path: Path) -> None:
    """Allocate may serve waiting pods in unknown order when they would all get the same: the
    simulated GPU's mounts name no pod, so that still holds."""
    _, paths = _simulated_paths(tmp_path)
    pods = [pod_record("a", NODE, assigned=assignment(NODE, "G7", at_ms=1), namespace="team-a"),
            pod_record("b", NODE, assigned=assignment(NODE, "G7", at_ms=2), namespace="team-b")]
    assert answer_for(pods[0], paths, True) == answer_for(pods[1], paths, True)


def test_the_agent_names_the_files_the_simulated_driver_opens() -> None:
    assert SIMULATED_GPU_FILES == (STATE_FILE, LOCK_FILE)


def test_completed_pods_are_not_served_twice_even_if_the_cache_lags() -> None:
    allocator = Allocator(NODE, PATHS)
    pods = [pod_record("a", NODE, assigned=assignment(NODE, "G0", at_ms=1)),
            pod_record("b", NODE, assigned=assignment(NODE, "G0", at_ms=2))]
    assert allocator.grant(pods, 1, True).candidate.pod.name == "a"
    assert allocator.grant(pods, 1, True).candidate.pod.name == "b"  # same stale snapshot
    with pytest.raises(NoPendingPod):
        allocator.grant(pods, 1, True)


def test_a_pod_in_progress_stays_first() -> None:
    allocator = Allocator(NODE, PATHS)
    two = pod_record("two", NODE, assigned=assignment(NODE, "G0", at_ms=5), containers=("x", "y"))
    older = pod_record("older", NODE, assigned=assignment(NODE, "G0", at_ms=1))
    first = allocator.grant([two], 1, True)
    assert not first.pod_complete
    # An older pod appears meanwhile; the half-served pod still goes first.
    second = allocator.grant([two, older], 1, True)
    assert (second.candidate.pod.name, second.pod_complete) == ("two", True)


def test_one_request_for_several_containers() -> None:
    grant = Allocator(NODE, PATHS).grant(
        [pod_record("two", NODE, assigned=assignment(NODE, "G0"), containers=("x", "y"))], 2, True)
    assert len(grant.containers) == 2
    assert grant.pod_complete


def test_pods_that_left_are_forgotten() -> None:
    allocator = Allocator(NODE, PATHS)
    pod = pod_record("a", NODE, assigned=assignment(NODE, "G0"))
    allocator.grant([pod], 1, True)
    allocator.peek([pod, pod_record("b", NODE, assigned=assignment(NODE, "G0", at_ms=9))])
    # "a" disappears from the cache, then a pod with its uid comes back (same name re-created).
    with pytest.raises(NoPendingPod):
        allocator.peek([])
    assert allocator.peek([pod]).presumed.pod.name == "a"


@pytest.mark.parametrize(
    ("available", "must", "size", "gpu", "expected"),
    [
        (["A::0", "B::0", "B::1"], [], 1, "B", ["B::0"]),
        (["A::0", "B::0", "B::1"], [], 2, None, ["A::0", "B::0"]),
        (["A::0", "B::0", "B::1"], ["A::0"], 2, "B", ["A::0", "B::0"]),
        (["A::0", "AB::0"], [], 1, "A", ["A::0"]),  # prefix match needs the separator
        (["AB::0", "A::0"], [], 1, "A", ["A::0"]),
    ],
)
def test_preferred_slots(available: list[str], must: list[str], size: int, gpu: str | None,
                         expected: list[str]) -> None:
    assert preferred_slots(available, must, size, gpu) == expected


def test_tenants_get_the_arbiter_socket_directory_read_only() -> None:
    # A root process in a GPU pod must not be able to delete the arbiter's socket or bind its own
    # in its place; connecting to a socket works through a read-only mount.
    grant = Allocator(NODE, PATHS).grant([pod_record("p", NODE, assigned=assignment(NODE, "G7"))], 1,
                                         mps_enabled=True)
    [container] = grant.containers
    mounts = {m.container_path: (m.host_path, m.read_only) for m in container.mounts}
    assert mounts[keys.CONTAINER_RUN_DIR] == (PATHS.run_dir, True)
    assert mounts[keys.CONTAINER_HOOK_PATH] == (PATHS.hook_library, True)


def test_a_pod_record_decodes_its_assignment_once_when_it_is_made() -> None:
    """Issue 15: the assignment used to be decoded again on each path that read it."""
    good = pod_record("good", NODE, assigned=assignment(NODE, "GPU-1"))
    assert good.assignment == assignment(NODE, "GPU-1")
    assert good.assignment_problem is None
    bad = pod_record("bad", NODE, raw_assignment="{oops")
    assert bad.assignment is None
    assert bad.assignment_problem
    assert pod_record("none", NODE).assignment is None
    assert attrs.evolve(good, phase="Running").assignment == good.assignment


def test_with_kubelets_record_a_pod_waits_until_kubelet_shows_all_its_gpu_containers() -> None:
    pods = [pod_record("served", NODE, assigned=assignment(NODE, "G0", at_ms=1)),
            pod_record("half", NODE, assigned=assignment(NODE, "G0", at_ms=2), containers=("x", "y")),
            pod_record("marked-only", NODE, assigned=assignment(NODE, "G0", at_ms=3), allocated=True)]
    found, _ = candidates(pods, NODE, held={"team-a/served": 1, "team-a/half": 1})
    assert [c.pod.name for c in found] == ["half", "marked-only"]  # a mark alone proves nothing
    assert Allocator(NODE, PATHS).peek(pods, {"team-a/served": 1, "team-a/half": 1}).presumed.pod.name == "half"


def test_waiting_pods_with_different_answers_are_ambiguous_and_named() -> None:
    pods = [pod_record("a", NODE, assigned=assignment(NODE, "G0", at_ms=1)),
            pod_record("b", NODE, assigned=assignment(NODE, "G1", at_ms=2))]
    with pytest.raises(AmbiguousAllocate, match=r"team-a/a \(GPU G0, SM 50%\), team-a/b \(GPU G1, SM 50%\)"):
        Allocator(NODE, PATHS).peek(pods, {})
    # without MPS the SM percentage is not part of the answer, the GPU still is
    with pytest.raises(AmbiguousAllocate):
        Allocator(NODE, PATHS).peek(pods, {}, mps_enabled=False)


def test_waiting_pods_with_one_answer_are_served_unnamed_and_not_remembered_as_served() -> None:
    allocator = Allocator(NODE, PATHS)
    pods = [pod_record("a", NODE, assigned=assignment(NODE, "G0", at_ms=1)),
            pod_record("b", NODE, assigned=assignment(NODE, "G0", at_ms=2))]
    grant = allocator.grant(pods, 1, True, held={})
    assert not grant.choice.certain
    assert [c.pod.name for c in grant.choice.waiting] == ["a", "b"]
    assert keys.ENV_POD not in grant.containers[0].envs
    # kubelet's record says who it was: "b"; then "a" is the only one waiting, and named
    again = allocator.grant(pods, 1, True, held={"team-a/b": 1})
    assert again.choice.certain
    assert again.containers[0].envs[keys.ENV_POD] == "team-a/a"


def test_only_pods_that_request_the_vgpu_resource_are_candidates() -> None:
    """Issue 42, row 4: busybox pods without a vGPU request, carrying an assignment, took team A's
    Allocate calls. Annotations cannot make a pod a candidate."""
    pods = [pod_record("busybox", NODE, assigned=assignment(NODE, "G0", at_ms=1), containers=()),
            pod_record("gpu", NODE, assigned=assignment(NODE, "G0", at_ms=2))]
    found, problems = candidates(pods, NODE)
    assert [c.pod.name for c in found] == ["gpu"]
    assert problems == []


def test_forged_assignments_are_not_served() -> None:
    """Issue 42, row 1: unsigned, signed for another pod, or raised after signing: refused, named."""
    real = pod_record("real", NODE, assigned=assignment(NODE, "G0"))
    copied = attrs.evolve(real, uid="uid-other", name="copy")
    pods = [pod_record("unsigned", NODE, assigned=assignment(NODE, "G0"), signed=False),
            vetted(copied, TEST_TRUST)]
    found, problems = candidates(pods, NODE)
    assert found == []
    assert problems == [
        "pod team-a/unsigned: assignment refused: it carries no signature of the fastgshare scheduler extender",
        "pod team-a/copy: assignment refused: its signature does not match (not written by the fastgshare "
        "scheduler extender for this pod)"]
    with pytest.raises(NoPendingPod, match="carries no signature"):
        Allocator(NODE, PATHS).grant(pods[:1], 1, mps_enabled=True)


def test_an_assignment_beyond_the_pods_own_share_is_not_served() -> None:
    """Issue 42, rows 1 and 6: the hook's memory limit is never above the pod's own gpu_mem, even for
    an assignment that verifies."""
    big = attrs.evolve(assignment(NODE, "G0"), share=make_share(request=300, limit=600, sm=50, mem=16 << 30))
    pod = pod_record("p", NODE, assigned=big, own=share_annotations(make_share(request=300, limit=600, sm=50,
                                                                               mem=256 << 20)))
    assert pod.assignment is None
    assert "memoryBytes 17179869184 > 268435456" in (pod.assignment_problem or "")
    assert share_of(pod) is None  # what the arbiter would give the hook


@pytest.mark.parametrize(("given", "own"), [
    pytest.param(make_share(request=0, limit=0, sm=50), make_share(request=0, limit=0, sm=50), id="parked"),
    pytest.param(make_share(request=0, limit=400, sm=50), make_share(request=400, limit=400, sm=50),
                 id="woken-without-its-request"),
    pytest.param(make_share(request=300, limit=600, sm=50), make_share(request=800, limit=800, sm=50),
                 id="a-refused-raise"),
])
def test_an_assignment_giving_less_time_than_the_pods_own_share_asks_for_is_served(given: ShareSpec,
                                                                                   own: ShareSpec) -> None:
    """A parked pod (0/0), and the extender's answers to a share its annotations ask for that did not fit:
    a parked pod woken with request 0 and its new limit, or a raise refused (the old share stays).
    The node agent serves what the extender signed as long as it gives no more than the pod asks for."""
    pod = pod_record("p", NODE, assigned=attrs.evolve(assignment(NODE, "G0"), share=given), own=share_annotations(own))
    assert pod.assignment is not None, pod.assignment_problem
    served = share_of(pod)
    assert served is not None
    assert (served.time.request_permille, served.time.limit_permille) == (given.request_permille,
                                                                         given.limit_permille)


def test_unsigned_assignments_are_served_only_when_allowed() -> None:
    pod = pod_record("p", NODE, assigned=assignment(NODE, "G0"), signed=False, trust=AssignmentTrust(None))
    assert pod.assignment == assignment(NODE, "G0")


def test_the_mps_pipe_directory_is_mounted_read_only() -> None:
    """Issue 37, row 8: a file one tenant wrote there was visible in every other GPU pod."""
    [container] = Allocator(NODE, PATHS).grant([pod_record("p", NODE, assigned=assignment(NODE, "G0"))], 1,
                                                mps_enabled=True).containers
    mounts = {m.container_path: (m.host_path, m.read_only) for m in container.mounts}
    assert mounts[PATHS.mps_pipe_dir] == (PATHS.mps_pipe_dir, True)
