"""Which pod a kubelet Allocate call is for, and what its containers get.

kubelet's Allocate carries device IDs only, never the pod. The extender writes an assignment
on the pod before binding it and serializes binds per node until the previous pod has been
allocated, so the pod being admitted is one of the pods bound to this node that carry an
assignment and hold no vGPU yet. Which pods already hold one is kubelet's own record (its
PodResources API, passed in as ``held``); without it, the ``allocated`` annotation and what this
agent served since it started.

Exact, never a guess: a pod kubelet has half-served (one of two GPU containers) is the one; else,
if every waiting pod would get the same (GPU, SM percentage, mounts), the answer is right whichever
pod kubelet is admitting, and the agent learns afterwards from kubelet which one it was; else, if
this agent's watch saw every waiting pod arrive on the node since kubelet last started, kubelet
admits them in that order (its watch and ours follow the same etcd revisions, and it admits one
pod at a time), so the first to arrive is the one; else the agent cannot know and refuses with a
reason, which kubelet shows on the pod. The tenant's share never depends on this: the arbiter
finds a process's pod by its cgroup.

Pure but for one step: pods arrive as :class:`NodePod` snapshots from the kube adapter; the
answer is plain data the servicer turns into protobuf. With simulated GPUs, a grant first makes
sure the GPU's two state files exist (:func:`device_plugin.hook_install.ensure_simulated_gpu_files`).

What a GPU container may write that other pods see: nothing but a simulated GPU's state and lock
files, which every process of that GPU maps as it would the device. They are mounted one by one
at the container path the driver opens; the directory around them is the container's own, so no
pod can create, replace or remove a file another pod sees (issue 42, row 8). The mounts name no
pod, so pods waiting for one GPU still get the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath

import attrs

from device_plugin.hook_install import SIMULATED_GPU_FILES, SimulatedGpuFilesError, ensure_simulated_gpu_files
from fastgshare import keys
from fastgshare.assignment_signature import AssignmentTrust, beyond_own_share
from fastgshare.codec import PodAssignment, decode_assignment
from fastgshare.errors import CodecError, InvalidShareSpec
from fastgshare.share import parse_share


@attrs.frozen(kw_only=True)
class NodePod:
    """A pod as the node agent sees it: the parts it looks at, with the assignment it trusts
    (the extender has its own view of a pod, :class:`scheduler_extender.records.PodRecord`)."""

    uid: str
    namespace: str
    name: str
    node_name: str
    phase: str
    resource_version: str
    annotations: Mapping[str, str] = attrs.field(factory=dict)
    gpu_containers: tuple[str, ...] = ()  # containers requesting the vgpu resource, in order
    deleting: bool = False
    # The controller that owns the pod ("FaSTPod/web"), which makes a new one if it is deleted;
    # None for a pod nobody replaces.
    controller: str | None = None
    # When this agent's watch saw the pod bound to its node, as a running count (None: it was
    # already bound when the agent listed, so the order is not known). kubelet admits pods in the
    # order its own watch sees them bound, which is the same order (both follow etcd's revisions).
    bound_seq: int | None = None
    # The extender's assignment as the agent trusts it, vetted once when the record is made
    # (:func:`vetted`): None without one, or when it cannot be read, is not signed by the extender
    # for this pod and node, or gives more than the pod's own share annotations; then
    # ``assignment_problem`` says why.
    assignment: PodAssignment | None = None
    assignment_problem: str | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def allocated(self) -> bool:
        return keys.POD_ALLOCATED_ANNOTATION in self.annotations


def vetted(record: NodePod, trust: AssignmentTrust) -> NodePod:
    """``record`` with its assignment if the agent may serve it: readable, signed by the extender
    for this pod's uid and the node it is on, and giving no more than the pod's own share
    annotations ask for (so the hook's memory limit is never above the pod's ``gpu_mem``)."""
    text = record.annotations.get(keys.POD_ASSIGNMENT_ANNOTATION)
    if text is None:
        return attrs.evolve(record, assignment=None, assignment_problem=None)
    try:
        assignment = decode_assignment(text)
        own = parse_share(record.annotations)
    except CodecError as error:
        return attrs.evolve(record, assignment=None, assignment_problem=str(error))
    except InvalidShareSpec as error:
        return attrs.evolve(record, assignment=None, assignment_problem=f"its share annotations are invalid: {error}")
    problem = (trust.problem(record.annotations.get(keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION), pod_uid=record.uid,
                             node_name=record.node_name, assignment=assignment)
               or beyond_own_share(assignment.share, own))
    if problem is not None:
        return attrs.evolve(record, assignment=None, assignment_problem=f"assignment refused: {problem}")
    return attrs.evolve(record, assignment=assignment, assignment_problem=None)


@attrs.frozen
class Candidate:
    pod: NodePod
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
    gpu_dirs: Mapping[str, str]  # GPU uuid -> host directory of its state files (never mounted itself)
    gpu_memory: Mapping[str, int]  # GPU uuid -> bytes


@attrs.frozen(kw_only=True)
class HostPaths:
    """Where the node agent keeps what GPU containers mount."""

    hook_library: str  # the installed, versioned hook file on the host
    run_dir: str  # host directory holding the arbiter socket
    mps_pipe_dir: str
    simulated_driver: SimulatedDriver | None = None


_FINISHED_PHASES = ("Succeeded", "Failed")


def candidates(pods: Iterable[NodePod], node_name: str,
               held: Mapping[str, int] | None = None) -> tuple[list[Candidate], list[str]]:
    """Pods on ``node_name`` waiting for Allocate, oldest assignment first, and any problems.

    ``held``: kubelet's record, pod key -> how many of its containers hold our devices; a pod
    is waiting while that is fewer than its GPU containers. Without it (None), a pod marked
    allocated is not waiting. Only pods whose containers request the vGPU resource are
    candidates: annotations cannot make a pod one (issue 42, row 4). Problems are human-readable
    lines about pods that look like candidates but carry an assignment the agent does not serve
    (unreadable, not the extender's, beyond the pod's own share, or for another node).
    """
    found: list[Candidate] = []
    problems: list[str] = []
    for pod in pods:
        if (pod.node_name != node_name or keys.POD_ASSIGNMENT_ANNOTATION not in pod.annotations
                or not pod.gpu_containers or pod.deleting or pod.phase in _FINISHED_PHASES):
            continue
        if pod.allocated if held is None else held.get(pod.key, 0) >= _gpu_containers(pod):
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


def _gpu_containers(pod: NodePod) -> int:
    return max(len(pod.gpu_containers), 1)


def no_candidate_message(node_name: str, problems: list[str]) -> str:
    """Why Allocate cannot serve a request; kubelet shows it in the pod's events."""
    message = (f"fastgshare: no pod bound to node {node_name} is waiting for a GPU: it needs a "
               f"{keys.POD_ASSIGNMENT_ANNOTATION} annotation from the fastgshare scheduler extender "
               f"(schedulerName: {keys.SCHEDULER_NAME}) and no {keys.POD_ALLOCATED_ANNOTATION} yet")
    if problems:
        message += "; ignored: " + "; ".join(problems)
    return message


def container_allocation(candidate: Candidate, paths: HostPaths, mps_enabled: bool, *,
                         name_the_pod: bool = True) -> ContainerAllocation:
    """The environment and mounts for one container of the candidate pod; ``name_the_pod``
    False leaves out the pod's name (when the agent cannot be sure which pod it serves)."""
    assignment = candidate.assignment
    envs = {
        keys.ENV_VISIBLE_DEVICES: assignment.gpu_uuid,
        keys.ENV_LD_PRELOAD: keys.CONTAINER_HOOK_PATH,
        keys.ENV_ARBITER_SOCKET: str(PurePosixPath(keys.CONTAINER_RUN_DIR) / keys.ARBITER_SOCKET_NAME),
        keys.ENV_GPU_UUID: assignment.gpu_uuid,
        # The model store's socket (device_plugin.models.access), in the run directory mounted below.
        keys.ENV_MODEL_SOCKET: str(PurePosixPath(keys.CONTAINER_RUN_DIR) / keys.MODEL_SOCKET_NAME),
    }
    if name_the_pod:
        envs[keys.ENV_POD] = candidate.pod.key
    mounts = [
        Mount(keys.CONTAINER_HOOK_PATH, paths.hook_library, read_only=True),
        Mount(keys.CONTAINER_RUN_DIR, paths.run_dir, read_only=True),  # tenants connect; they must not unlink or bind
    ]
    if mps_enabled:
        envs[keys.ENV_MPS_THREAD_PERCENTAGE] = str(assignment.share.sm_percent)
        envs[keys.ENV_MPS_PIPE_DIRECTORY] = paths.mps_pipe_dir
        # Read-only: a tenant must not plant files other pods' MPS clients read (issue 37, row 8).
        # Clients connect to the daemon's sockets and pipes, which a read-only mount allows; the
        # GPU day confirms no client needs to create files there (docs/node-agent.md).
        mounts.append(Mount(paths.mps_pipe_dir, paths.mps_pipe_dir, read_only=True))
    driver = paths.simulated_driver
    if driver is not None and assignment.gpu_uuid in driver.gpu_dirs:
        library_dir = PurePosixPath(keys.CONTAINER_DRIVER_DIR)
        mounts += [Mount(str(library_dir / keys.CUDA_DRIVER_LIBRARY), driver.libcuda, read_only=True),
                   Mount(str(library_dir / keys.NVML_LIBRARY), driver.libnvidia_ml, read_only=True)]
        # The GPU's state and lock files only, writable (the driver maps them), each on its own: the
        # directory they sit in inside the container is the container's, not shared with any pod.
        gpu_dir, view = PurePosixPath(driver.gpu_dirs[assignment.gpu_uuid]), PurePosixPath(keys.CONTAINER_FAKE_GPU_DIR)
        mounts += [Mount(str(view / name), str(gpu_dir / name), read_only=False) for name in SIMULATED_GPU_FILES]
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


Answer = tuple[tuple[tuple[str, str], ...], tuple[Mount, ...]]


def _comparable(allocation: ContainerAllocation) -> Answer:
    return tuple(sorted(allocation.envs.items())), allocation.mounts


def answer_for(pod: NodePod, paths: HostPaths, mps_enabled: bool) -> Answer | None:
    """What any container of ``pod`` must be given, its name left out (None: no readable assignment)."""
    if pod.assignment is None:
        return None
    return _comparable(container_allocation(Candidate(pod, pod.assignment), paths, mps_enabled, name_the_pod=False))


def given_answer(allocation: ContainerAllocation) -> Answer:
    """What a container was given, its pod's name left out, comparable with :func:`answer_for`."""
    return _comparable(attrs.evolve(allocation, envs={k: v for k, v in allocation.envs.items() if k != keys.ENV_POD}))


class NoPendingPod(Exception):
    """No pod is waiting for this Allocate; the message says why."""


class AmbiguousAllocate(NoPendingPod):
    """Several pods wait, and they would get different GPUs or SM percentages: the agent cannot
    tell which one kubelet is admitting. The message names them."""


def ambiguity_message(node_name: str, waiting: Iterable[Candidate]) -> str:
    listed = ", ".join(f"{c.pod.key} (GPU {c.assignment.gpu_uuid}, SM {c.assignment.share.sm_percent}%)"
                       for c in waiting)
    return (f"fastgshare: refused rather than guess: kubelet is admitting one of several pods bound to node "
            f"{node_name} that would get different GPUs or SM percentages, and neither Allocate nor the order "
            f"they arrived in says which (they were bound before the node agent or kubelet last started): "
            f"{listed}. A FaSTPod replaces this pod by itself, a bare pod must be created again")


@attrs.frozen
class Choice:
    """Whom an Allocate serves: ``waiting`` are the pods it could be for, all getting the same;
    ``certain`` when there is only one. ``presumed`` is the one to name when not certain."""

    waiting: tuple[Candidate, ...]

    @property
    def certain(self) -> bool:
        return len(self.waiting) == 1

    @property
    def presumed(self) -> Candidate:
        return self.waiting[0]


@attrs.frozen
class Grant:
    """What one Allocate call gives: the pods it may be for, one allocation per container, and
    whether the pod is now fully allocated (every GPU container served) and should be marked so."""

    choice: Choice
    containers: tuple[ContainerAllocation, ...]
    pod_complete: bool

    @property
    def candidate(self) -> Candidate:
        return self.choice.presumed


class Allocator:
    """Turns Allocate calls into grants, remembering pods served but not yet seen as marked.

    kubelet calls Allocate once per GPU container; a pod with two GPU containers is served by
    two calls, and stays first in line until both are done. Pods this agent certainly completed
    are skipped even while the cache still shows them unmarked.
    """

    def __init__(self, node_name: str, paths: HostPaths) -> None:
        self.node_name = node_name
        self.paths = paths
        self._in_progress: dict[str, int] = {}  # pod uid -> GPU containers served so far
        self._completed: set[str] = set()
        self._refused: set[str] = set()  # pods refused by name: kubelet is failing them

    def refuse(self, candidate: Candidate) -> None:
        """The agent refused this pod's Allocate: it waits no longer, even while the cache lags."""
        self._refused.add(candidate.pod.uid)

    def peek(self, pods: Iterable[NodePod], held: Mapping[str, int] | None = None,
             mps_enabled: bool = True, order_from: int | None = None) -> Choice:
        """Whom the next Allocate is for, without serving it; ``held`` as in :func:`candidates`;
        pods whose ``bound_seq`` is at least ``order_from`` arrived in a known order (None: no
        order is known).

        Raises :class:`NoPendingPod` when nobody waits and :class:`AmbiguousAllocate` when the
        waiting pods would get different answers and their order is not known.
        """
        pods = list(pods)
        known = {pod.uid for pod in pods}
        self._completed &= known  # forget pods that are gone
        self._refused &= known
        self._in_progress = {uid: n for uid, n in self._in_progress.items() if uid in known}
        served = self._completed | self._refused
        found, problems = candidates((p for p in pods if p.uid not in served), self.node_name, held)
        if not found:
            raise NoPendingPod(no_candidate_message(self.node_name, problems))
        started = [c for c in found if c.pod.uid in self._in_progress or (held or {}).get(c.pod.key, 0) > 0]
        if started:  # kubelet finishes one pod's containers before it admits the next
            return Choice((started[0],))
        answers = {_comparable(container_allocation(c, self.paths, mps_enabled, name_the_pod=False)) for c in found}
        if len(answers) == 1:
            return Choice(tuple(found))
        arrivals = [c.pod.bound_seq for c in found]
        if order_from is not None and all(seq is not None and seq >= order_from for seq in arrivals):
            return Choice((min(found, key=lambda c: c.pod.bound_seq or 0),))  # kubelet admits in arrival order
        raise AmbiguousAllocate(ambiguity_message(self.node_name, found))

    def grant(self, pods: Iterable[NodePod], containers: int, mps_enabled: bool,
              held: Mapping[str, int] | None = None, order_from: int | None = None) -> Grant:
        """Serve ``containers`` containers of the next pod."""
        choice = self.peek(pods, held, mps_enabled, order_from)
        candidate = choice.presumed
        self._prepare_simulated_gpu(candidate.assignment.gpu_uuid)
        uid = candidate.pod.uid
        served = max(self._in_progress.get(uid, 0), (held or {}).get(candidate.pod.key, 0)) + containers
        complete = served >= _gpu_containers(candidate.pod)
        if choice.certain or held is None:  # without kubelet's record, the oldest is the best there is
            if complete:
                self._in_progress.pop(uid, None)
                self._completed.add(uid)
            else:
                self._in_progress[uid] = served
        allocation = container_allocation(candidate, self.paths, mps_enabled, name_the_pod=choice.certain)
        return Grant(choice, (allocation,) * containers, complete)

    def _prepare_simulated_gpu(self, gpu_uuid: str) -> None:
        """With a simulated GPU, its state files exist before the answer names them."""
        driver = self.paths.simulated_driver
        if driver is None or gpu_uuid not in driver.gpu_dirs:
            return
        try:
            ensure_simulated_gpu_files(Path(driver.gpu_dirs[gpu_uuid]))
        except SimulatedGpuFilesError as error:
            raise NoPendingPod(f"fastgshare: cannot give simulated GPU {gpu_uuid}: {error}") from None
