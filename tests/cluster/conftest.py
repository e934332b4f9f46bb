"""Fixtures of the cluster tier: a real etcd + kube-apiserver (+ controller-manager, scheduler),
and the real-node tier: a whole one-machine cluster whose kubelet runs real pods.

The control plane starts once per test session, on the first test that needs it. Each test
gets its own namespace and deletes the nodes it creates, so tests do not see each other's
objects. Every test in this directory is marked ``cluster``; the tests that need a real node
(``fastgshare cluster``: containerd, kubelet, our components, simulated GPUs) are marked
``realnode`` and run wherever they can (Linux, root).

Environment:

- ``FASTGSHARE_K8S_CACHE``: where build-control-plane.sh put the binaries.
- ``FASTGSHARE_REQUIRE_CLUSTER=1``: a tier that cannot run fails instead of being skipped (CI).
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fastgshare import keys
from fastgshare.inventory import GpuDevice
from fastgshare_cluster import cluster as local_cluster
from fastgshare_cluster.cluster import Cluster, ClusterError, Options
from fastgshare_cluster.processes import free_ports
from tests.cluster import controlplane
from tests.cluster.controlplane import Binaries, ClusterUnavailable, ControlPlane, ProcessSet
from tests.cluster.gpu_nodes import create_gpu_node

HERE = Path(__file__).parent


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") == "1"


def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject.toml; repeated so this directory works on its own.
    config.addinivalue_line("markers", "cluster: needs the real control plane built by "
                            f"{controlplane.BUILD_SCRIPT}")
    config.addinivalue_line("markers", "realnode: needs a real node (fastgshare cluster: Linux, root)")


_UNAVAILABLE = pytest.StashKey[str]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this directory's tests ``cluster``; skip them all if the binaries are missing, and the
    ``realnode`` ones where no real node can run (unless ``FASTGSHARE_REQUIRE_CLUSTER=1``)."""
    ours = [item for item in items if item.path.is_relative_to(HERE)]  # the hook sees every item
    if not ours:
        return
    try:
        controlplane.find_binaries()
    except ClusterUnavailable as error:
        if not _env_flag("FASTGSHARE_REQUIRE_CLUSTER"):
            config.stash[_UNAVAILABLE] = f"cluster tier skipped: {error}"
    for item in ours:
        item.add_marker(pytest.mark.cluster)
        if _UNAVAILABLE in config.stash:
            item.add_marker(pytest.mark.skip(reason=config.stash[_UNAVAILABLE]))
        elif ("realnode" in item.keywords and (reason := _real_node_unavailable())
              and not _env_flag("FASTGSHARE_REQUIRE_CLUSTER")):  # required: its fixture fails saying why
            item.add_marker(pytest.mark.skip(reason=f"real-node tier skipped: {reason}"))


def _real_node_unavailable() -> str | None:
    if sys.platform != "linux":
        return "it needs Linux"
    if os.geteuid() != 0:
        return "it needs root (the kubelet mounts volumes and creates cgroups)"
    return None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Say once, at the end, why the whole tier was skipped."""
    if _UNAVAILABLE in config.stash:
        terminalreporter.write_line(config.stash[_UNAVAILABLE], yellow=True, bold=True)


@pytest.fixture(scope="session")
def cluster_binaries() -> Binaries:
    """The tier's executables; fails, never skips: a missing tier was skipped at collection."""
    try:
        return controlplane.find_binaries()
    except ClusterUnavailable as error:
        pytest.fail(f"cluster tier required (FASTGSHARE_REQUIRE_CLUSTER=1) but unavailable: {error}",
                    pytrace=False)


@pytest.fixture(scope="session")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Data, certificates and logs of this session's processes (pytest keeps the last few runs)."""
    controlplane.install_emergency_cleanup()
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="session")
def control_plane(cluster_binaries: Binaries, cluster_dir: Path) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on loopback; ``.kubeconfig``, ``.host``, ``.token``, ``.api_client()``."""
    processes = ProcessSet()
    try:
        yield controlplane.start_control_plane(cluster_binaries, cluster_dir, processes)
    finally:
        processes.stop_all()
        shutil.rmtree(cluster_dir / "etcd", ignore_errors=True)  # 60+ MB of preallocated WAL


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> Iterator[kubernetes.client.ApiClient]:
    with control_plane.api_client() as client:
        yield client


@pytest.fixture
def core(api_client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def controller_manager(cluster_binaries: Binaries, control_plane: ControlPlane, cluster_dir: Path) -> Iterator[None]:
    """kube-controller-manager running the garbage collector and the namespace controller."""
    processes = ProcessSet()
    try:
        controlplane.start_controller_manager(cluster_binaries, control_plane,
                                              cluster_dir / "controller-manager", processes)
        yield
    finally:
        processes.stop_all()


StartScheduler = Callable[[str | Mapping[str, Any]], controlplane.ManagedProcess]


@pytest.fixture
def start_scheduler(cluster_binaries: Binaries, control_plane: ControlPlane,
                    tmp_path: Path) -> Iterator[StartScheduler]:
    """Factory: start kube-scheduler with a ``KubeSchedulerConfiguration``; stopped after the test.

    The configuration (YAML text or dict, ``kubescheduler.config.k8s.io/v1beta1``) gets our
    kubeconfig, leader election off and a loopback health port filled in; see
    :func:`controlplane.scheduler_config`.
    """
    processes = ProcessSet()
    started = 0

    def start(config: str | Mapping[str, Any]) -> controlplane.ManagedProcess:
        nonlocal started
        started += 1
        return controlplane.start_scheduler(cluster_binaries, control_plane, config,
                                            tmp_path / f"scheduler-{started}", processes)

    try:
        yield start
    finally:
        processes.stop_all()


def unique_name(prefix: str) -> str:
    """A DNS-1123 label: ``prefix`` (sanitised, shortened) plus a random suffix."""
    stem = re.sub(r"[^a-z0-9-]+", "-", prefix.lower()).strip("-")[:40].rstrip("-")
    return f"{stem or 't'}-{secrets.token_hex(3)}"


@pytest.fixture
def namespace(api_client: kubernetes.client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, deleted afterwards."""
    core = kubernetes.client.CoreV1Api(api_client)
    name = unique_name(request.node.name.removeprefix("test_"))
    core.create_namespace(kubernetes.client.V1Namespace(metadata=kubernetes.client.V1ObjectMeta(name=name)))
    yield name
    # No kubelet finishes a pod's termination here: delete them at once, so that no pod of this
    # test stays behind (Pending, or bound to a deleted node) for a later test's scheduler to see.
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core.delete_namespace(name)


MakeGpuNode = Callable[..., kubernetes.client.V1Node]


@pytest.fixture
def make_gpu_node(api_client: kubernetes.client.ApiClient) -> Iterator[MakeGpuNode]:
    """Factory: ``make_gpu_node(gpus, slots_per_gpu=16, **kwargs)`` creates a fake GPU node
    (see :func:`gpu_nodes.create_gpu_node`) with a unique name; deleted after the test."""
    created: list[str] = []

    def make(gpus: int | Sequence[GpuDevice], slots_per_gpu: int = keys.DEFAULT_SLOTS_PER_GPU,
             **kwargs: Any) -> kubernetes.client.V1Node:
        name = unique_name("gpu-node")
        created.append(name)  # before creating: a half-made node is deleted too
        return create_gpu_node(api_client, name, gpus, slots_per_gpu, **kwargs)

    yield make
    for name in created:
        _delete_node(api_client, name)


def _delete_node(api_client: kubernetes.client.ApiClient, name: str) -> None:
    try:
        kubernetes.client.CoreV1Api(api_client).delete_node(name)
    except ApiException as error:
        if error.status != 404:
            raise


REAL_NODE_LOCK = Path("/tmp/fastgshare-real-node.lock")


@pytest.fixture(scope="module")
def real_node_turn() -> Iterator[None]:
    """The machine's one kubelet for this test module: waits while another test run holds it.

    kubelet v1.20 hard-codes ``/var/lib/kubelet/device-plugins``, so one machine runs one real
    node at a time; test runs in parallel (two checkouts, two engineers) take turns."""
    with REAL_NODE_LOCK.open("a") as lock:
        deadline = time.monotonic() + 1800
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test run held {REAL_NODE_LOCK} for 30 minutes", pytrace=False)
                time.sleep(1)
        yield


@contextmanager
def local_cluster_for_tests(tmp_path_factory: pytest.TempPathFactory, nodes: int = 1,
                            from_manifests: bool = False) -> Iterator[Cluster]:
    """A whole cluster on this machine, started by the code ``fastgshare cluster up`` runs; its
    components die with the test process. Stopped (``down``) afterwards, which must leave
    nothing behind."""
    controlplane.install_emergency_cleanup()
    state_dir = tmp_path_factory.mktemp("real-cluster")
    lines: list[str] = []
    options = Options(state_dir=state_dir, die_with_parent=True, say=lines.append, nodes=nodes,
                      from_manifests=from_manifests, gateway_listen=f"127.0.0.1:{free_ports(1)[0]}")
    try:
        running = local_cluster.up(options)
    except ClusterError as error:
        pytest.fail(f"fastgshare cluster up failed:\n{error}\n" + "\n".join(lines), pytrace=False)
    try:
        yield running
    finally:
        problems = local_cluster.down(state_dir, say=lines.append)
        assert not problems, f"cluster down left: {problems}"


@pytest.fixture(scope="module")
def real_cluster(cluster_binaries: Binaries, real_node_turn: None,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A one-node cluster on this machine for one test module (:func:`local_cluster_for_tests`)."""
    with local_cluster_for_tests(tmp_path_factory) as running:
        yield running
