"""The cluster tier's control plane: the same code ``fastgshare cluster`` runs
(:mod:`fastgshare_cluster.controlplane` and :mod:`fastgshare_cluster.processes`), named here for
the tests."""

from fastgshare_cluster.controlplane import (
    BUILD_SCRIPT,
    Binaries,
    ClusterUnavailable,
    ControlPlane,
    find_binaries,
    k8s_cache_dir,
    scheduler_config,
    start_control_plane,
    start_controller_manager,
    start_scheduler,
    write_kubeconfig,
)
from fastgshare_cluster.processes import (
    LOOPBACK,
    ManagedProcess,
    ProcessFailed,
    ProcessSet,
    free_ports,
    http_ok,
    install_emergency_cleanup,
    wait_until,
)

__all__ = [
    "BUILD_SCRIPT", "LOOPBACK", "Binaries", "ClusterUnavailable", "ControlPlane", "ManagedProcess", "ProcessFailed",
    "ProcessSet", "find_binaries", "free_ports", "http_ok", "install_emergency_cleanup", "k8s_cache_dir",
    "scheduler_config", "start_control_plane", "start_controller_manager", "start_scheduler", "wait_until",
    "write_kubeconfig",
]
