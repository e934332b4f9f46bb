"""Fixtures of the cluster tier: a real etcd + kube-apiserver (+ controller-manager, scheduler).

The control plane starts once per test session, on the first test that needs it. Each test
gets its own namespace and deletes the nodes it creates, so tests do not see each other's
objects. Every test in this directory is marked ``cluster``.

Environment:

- ``FASTGSHARE_K8S_CACHE``: where build-control-plane.sh put the binaries.
- ``FASTGSHARE_REQUIRE_CLUSTER=1``: missing binaries fail the tier instead of skipping it (CI).
- ``FASTGSHARE_KUBELET_TIER=1``: also run the tests marked ``kubelet`` (root, containerd).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fastgshare.inventory import GpuDevice
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
    config.addinivalue_line("markers", "kubelet: needs the opt-in kubelet tier (FASTGSHARE_KUBELET_TIER=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this directory's tests ``cluster``; skip them, with the reason, if the tier cannot run."""
    ours = [item for item in items if item.path.is_relative_to(HERE)]
    if not ours:
        return
    unavailable: str | None = None
    try:
        controlplane.find_binaries()
    except ClusterUnavailable as error:
        unavailable = str(error)
    for item in ours:
        item.add_marker(pytest.mark.cluster)
        if unavailable and not _env_flag("FASTGSHARE_REQUIRE_CLUSTER"):
            item.add_marker(pytest.mark.skip(reason=f"cluster tier skipped: {unavailable}"))
        elif "kubelet" in item.keywords and not _env_flag("FASTGSHARE_KUBELET_TIER"):
            item.add_marker(pytest.mark.skip(
                reason="kubelet tier skipped: opt-in, set FASTGSHARE_KUBELET_TIER=1 (needs root and containerd)"))


@pytest.fixture(scope="session")
def cluster_binaries() -> Binaries:
    """The tier's executables; fails (never skips) here, since skipping happened at collection."""
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
    kubeconfig and leader election off filled in.
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
    core.delete_namespace(name)


MakeGpuNode = Callable[..., kubernetes.client.V1Node]


@pytest.fixture
def make_gpu_node(api_client: kubernetes.client.ApiClient) -> Iterator[MakeGpuNode]:
    """Factory: ``make_gpu_node(gpus, slots_per_gpu=16, **kwargs)`` creates a fake GPU node
    (see :func:`gpu_nodes.create_gpu_node`) with a unique name; deleted after the test."""
    created: list[str] = []

    def make(gpus: int | Sequence[GpuDevice], slots_per_gpu: int = 16, **kwargs: Any) -> kubernetes.client.V1Node:
        name = unique_name("gpu-node")
        created.append(name)  # before creating: a half-made node is deleted too
        return create_gpu_node(api_client, name, gpus, slots_per_gpu, **kwargs)

    yield make
    core = kubernetes.client.CoreV1Api(api_client)
    for name in created:
        try:
            core.delete_node(name)
        except ApiException as error:
            if error.status != 404:
                raise
