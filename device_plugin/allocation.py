"""Which pod a kubelet Allocate call is for, and what its containers get.

kubelet's Allocate carries device IDs only, never the pod. The extender writes an assignment
on the pod before binding it and serializes binds per node until the previous pod has been
allocated, so the pod being admitted is the one bound to this node that carries an
assignment and is not marked allocated yet; with several, the oldest assignment first.

Pure: pods arrive as :class:`PodRecord` snapshots from the kube adapter; the answer is plain
data the servicer turns into protobuf.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

import attrs

from fastgshare import keys
from fastgshare.codec import PodAssignment, decode_assignment
from fastgshare.errors import CodecError


@attrs.frozen(kw_only=True)
class PodRecord:
    """The parts of a Pod the node agent looks at."""

    uid: str
    namespace: str
    name: str
    node_name: str
    phase: str
    resource_version: str
    annotations: Mapping[str, str] = attrs.field(factory=dict)
    gpu_containers: tuple[str, ...] = ()  # containers requesting the vgpu resource, in order
    deleting: bool = False
    # The extender's assignment, decoded once when the record is made (None without one, or when
    # it cannot be read: ``assignment_problem`` then says why).
    assignment: PodAssignment | None = attrs.field(init=False, default=None)
    assignment_problem: str | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        text = self.annotations.get(keys.POD_ASSIGNMENT_ANNOTATION)
        if text is None:
            return
        try:
            object.__setattr__(self, "assignment", decode_assignment(text))
        except CodecError as error:
            object.__setattr__(self, "assignment_problem", str(error))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def allocated(self) -> bool:
        return keys.POD_ALLOCATED_ANNOTATION in self.annotations


@attrs.frozen
class Candidate:
    pod: PodRecord
    assignment: PodAssignment


@attrs.frozen
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@attrs.frozen
class ContainerAllocation:
    envs: Mapping[str, str]
    mounts: tuple[Mount, ...]


@attrs.frozen(kw_only=True)
class SimulatedDriver:
    """With simulated GPUs: the simulated driver's libraries on the host, and each GPU's state
    directory and memory size. Containers get them as the NVIDIA container toolkit gives the
    real driver and device."""

    libcuda: str
    libnvidia_ml: str
    gpu_dirs: Mapping[str, str]  # GPU uuid -> host directory of its shared state
    gpu_memory: Mapping[str, int]  # GPU uuid -> bytes


@attrs.frozen(kw_only=True)
class HostPaths:
    """Where the node agent keeps what GPU containers mount."""

    hook_library: str  # the installed, versioned hook file on the host
    run_dir: str  # host directory holding the arbiter socket
    mps_pipe_dir: str
    simulated_driver: SimulatedDriver | None = None


_FINISHED_PHASES = ("Succeeded", "Failed")


def candidates(pods: Iterable[PodRecord], node_name: str) -> tuple[list[Candidate], list[str]]:
    """Pods on ``node_name`` waiting for Allocate, oldest assignment first, and any problems.

    Problems are human-readable lines about pods that look like candidates but carry an
    assignment that cannot be read or names another node.
    """
    found: list[Candidate] = []
    problems: list[str] = []
    for pod in pods:
        if (pod.node_name != node_name or keys.POD_ASSIGNMENT_ANNOTATION not in pod.annotations or pod.allocated
                or pod.deleting or pod.phase in _FINISHED_PHASES):
            continue
        assignment = pod.assignment
        if assignment is None:
            problems.append(f"pod {pod.key}: {pod.assignment_problem}")
            continue
        if assignment.node_name != node_name:
            problems.append(f"pod {pod.key}: assigned to node {assignment.node_name} but bound to {node_name}")
            continue
        found.append(Candidate(pod, assignment))
    found.sort(key=lambda c: (c.assignment.assigned_at_ms, c.pod.namespace, c.pod.name))
    return found, problems


def no_candidate_message(node_name: str, problems: list[str]) -> str:
    """Why Allocate cannot serve a request; kubelet shows it in the pod's events."""
    message = (f"fastgshare: no pod bound to node {node_name} is waiting for a GPU: it needs a "
               f"{keys.POD_ASSIGNMENT_ANNOTATION} annotation from the fastgshare scheduler extender "
               f"(schedulerName: {keys.SCHEDULER_NAME}) and no {keys.POD_ALLOCATED_ANNOTATION} yet")
    if problems:
        message += "; ignored: " + "; ".join(problems)
    return message


def container_allocation(candidate: Candidate, paths: HostPaths, mps_enabled: bool) -> ContainerAllocation:
    """The environment and mounts for one container of the candidate pod."""
    assignment = candidate.assignment
    envs = {
        keys.ENV_VISIBLE_DEVICES: assignment.gpu_uuid,
        keys.ENV_LD_PRELOAD: keys.CONTAINER_HOOK_PATH,
        keys.ENV_ARBITER_SOCKET: str(PurePosixPath(keys.CONTAINER_RUN_DIR) / keys.ARBITER_SOCKET_NAME),
        keys.ENV_POD: candidate.pod.key,
        keys.ENV_GPU_UUID: assignment.gpu_uuid,
    }
    mounts = [
        Mount(keys.CONTAINER_HOOK_PATH, paths.hook_library, read_only=True),
        Mount(keys.CONTAINER_RUN_DIR, paths.run_dir, read_only=True),  # tenants connect; they must not unlink or bind
    ]
    if mps_enabled:
        envs[keys.ENV_MPS_THREAD_PERCENTAGE] = str(assignment.share.sm_percent)
        envs[keys.ENV_MPS_PIPE_DIRECTORY] = paths.mps_pipe_dir
        mounts.append(Mount(paths.mps_pipe_dir, paths.mps_pipe_dir, read_only=False))
    driver = paths.simulated_driver
    if driver is not None and assignment.gpu_uuid in driver.gpu_dirs:
        library_dir = PurePosixPath(keys.CONTAINER_DRIVER_DIR)
        mounts += [Mount(str(library_dir / keys.CUDA_DRIVER_LIBRARY), driver.libcuda, read_only=True),
                   Mount(str(library_dir / keys.NVML_LIBRARY), driver.libnvidia_ml, read_only=True),
                   Mount(keys.CONTAINER_FAKE_GPU_DIR, driver.gpu_dirs[assignment.gpu_uuid], read_only=False)]
        envs[keys.ENV_FAKE_GPU_DIR] = keys.CONTAINER_FAKE_GPU_DIR
        envs[keys.ENV_FAKE_GPU_MEMORY] = str(driver.gpu_memory[assignment.gpu_uuid])
    return ContainerAllocation(envs, tuple(mounts))


def preferred_slots(available: Iterable[str], must_include: Iterable[str], size: int,
                    gpu_uuid: str | None) -> list[str]:
    """Slot IDs to suggest: the ones required, then slots of ``gpu_uuid``, then any others."""
    chosen = list(dict.fromkeys(must_include))
    rest = [slot for slot in available if slot not in chosen]
    if gpu_uuid is not None:
        prefix = f"{gpu_uuid}{keys.SLOT_ID_SEPARATOR}"
        rest.sort(key=lambda slot: not slot.startswith(prefix))
    return (chosen + rest)[:max(size, len(chosen))]


class NoPendingPod(Exception):
    """No pod is waiting for this Allocate; the message says why."""


@attrs.frozen
class Grant:
    """What one Allocate call gives: the pod, one allocation per container, and whether the
    pod is now fully allocated (every GPU container served) and should be marked so."""

    candidate: Candidate
    containers: tuple[ContainerAllocation, ...]
    pod_complete: bool


class Allocator:
    """Turns Allocate calls into grants, remembering pods served but not yet seen as marked.

    kubelet calls Allocate once per GPU container; a pod with two GPU containers is served by
    two calls, and stays first in line until both are done. Pods this agent completed are
    skipped even while the cache still shows them unmarked.
    """

    def __init__(self, node_name: str, paths: HostPaths) -> None:
        self.node_name = node_name
        self.paths = paths
        self._in_progress: dict[str, int] = {}  # pod uid -> GPU containers served so far
        self._completed: set[str] = set()

    def peek(self, pods: Iterable[PodRecord]) -> Candidate:
        """The pod the next Allocate is for, without serving it."""
        pods = list(pods)
        known = {pod.uid for pod in pods}
        self._completed &= known  # forget pods that are gone
        self._in_progress = {uid: n for uid, n in self._in_progress.items() if uid in known}
        found, problems = candidates((p for p in pods if p.uid not in self._completed), self.node_name)
        if not found:
            raise NoPendingPod(no_candidate_message(self.node_name, problems))
        in_progress = [c for c in found if c.pod.uid in self._in_progress]
        return (in_progress or found)[0]

    def grant(self, pods: Iterable[PodRecord], containers: int, mps_enabled: bool) -> Grant:
        """Serve ``containers`` containers of the next pod."""
        candidate = self.peek(pods)
        uid = candidate.pod.uid
        served = self._in_progress.get(uid, 0) + containers
        needed = max(len(candidate.pod.gpu_containers), 1)
        complete = served >= needed
        if complete:
            self._in_progress.pop(uid, None)
            self._completed.add(uid)
        else:
            self._in_progress[uid] = served
        allocation = container_allocation(candidate, self.paths, mps_enabled)
        return Grant(candidate, (allocation,) * containers, complete)
