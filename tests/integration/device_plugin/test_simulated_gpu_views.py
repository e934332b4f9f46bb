"""Two pods on one simulated GPU, their containers made from what Allocate answered: each sees
the GPU (one state, both tenants counted) and neither sees a file the other wrote (issue 42,
row 8: the GPU's state directory was mounted writable into every GPU pod).

The containers are directories on the host with Allocate's mounts bind-mounted into them as a
container runtime does (in a private mount namespace, ``unshare -m``; skipped where that is not
allowed), the tenants real processes of the simulated driver.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from device_plugin._api import deviceplugin_pb2 as api
from fastgshare import keys
from simgpu.build import TENANT
from simgpu.state import LOCK_FILE, STATE_FILE, read_state
from tests.builders_k8s import assignment, pod_record
from tests.integration.device_plugin.conftest import NODE, RunningAgent

LAUNCHES = 3


def _can_mount() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t", "tmpfs", "none", "/mnt"],
                           capture_output=True, timeout=30, check=False)
    return probe.returncode == 0


def _allocate(agent: RunningAgent, device_id: str) -> api.ContainerAllocateResponse:
    request = api.AllocateRequest(container_requests=[api.ContainerAllocateRequest(devices_ids=[device_id])])
    [container] = agent.stub().Allocate(request, timeout=10).container_responses
    return container


def _make_container(root: Path, mounts: Iterable[api.Mount]) -> list[str]:
    """Shell lines that mount Allocate's answer into ``root`` as runc does: the mount point made
    in the container's own tree (a file for a file), a bind mount, read-only where asked."""
    lines = []
    for mount in mounts:
        source, target = Path(mount.host_path), root / mount.container_path.lstrip("/")
        if not source.exists():
            continue  # the hook and the arbiter's socket: not what this test is about
        make = "touch" if source.is_file() else "mkdir -p"
        lines += [f"mkdir -p {shlex.quote(str(target.parent))}", f"{make} {shlex.quote(str(target))}",
                  f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}"]
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {shlex.quote(str(target))}")
    return lines


def _tenant(root: Path, envs: dict[str, str]) -> str:
    env = {keys.ENV_FAKE_GPU_DIR: str(root / envs[keys.ENV_FAKE_GPU_DIR].lstrip("/")),
           keys.ENV_FAKE_GPU_MEMORY: envs[keys.ENV_FAKE_GPU_MEMORY],
           "LD_LIBRARY_PATH": str(root / keys.CONTAINER_DRIVER_DIR.lstrip("/"))}
    assigned = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    return f"env {assigned} {TENANT} --launches {LAUNCHES} --duration-us 100 >/dev/null"


def test_one_pods_files_are_neither_visible_nor_writable_in_another_pods_container(
        simulated_agent: RunningAgent, short_tmp: Path) -> None:
    if not _can_mount():
        pytest.skip("needs a private mount namespace (unshare -m as root) to mount Allocate's answer")
    gpu = simulated_agent.gpus.devices()[0]
    driver = simulated_agent.paths.simulated_driver
    assert driver is not None
    gpu_dir = Path(driver.gpu_dirs[gpu.uuid])
    answers = {}
    for index, (namespace, name) in enumerate((("team-a", "steady"), ("team-b", "intruder"))):
        simulated_agent.pods.put(pod_record(name, NODE, namespace=namespace,
                                            assigned=assignment(NODE, gpu.uuid, 0, at_ms=index + 1)))
        answers[namespace] = _allocate(simulated_agent, f"{gpu.uuid}::{index}")

    team_a, team_b = short_tmp / "ctr-a", short_tmp / "ctr-b"
    view_a, view_b = (root / keys.CONTAINER_FAKE_GPU_DIR.lstrip("/") for root in (team_a, team_b))
    script = [
        "set -e",
        *_make_container(team_a, answers["team-a"].mounts),
        *_make_container(team_b, answers["team-b"].mounts),
        _tenant(team_a, dict(answers["team-a"].envs)),
        _tenant(team_b, dict(answers["team-b"].envs)),
        # team B writes where its driver keeps the GPU's state, and tries to replace or remove the GPU's files
        f"echo planted > {view_b}/planted",
        f"if rm -f {view_b}/{LOCK_FILE} 2>/dev/null; then echo REMOVED; fi",
        f"if mv {view_b}/planted {view_b}/{STATE_FILE} 2>/dev/null; then echo REPLACED; fi",
        f"ls -A {view_a} | sed 's/^/A: /'",
    ]
    result = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", "\n".join(script)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "REMOVED" not in result.stdout  # the GPU's files stay the GPU's
    assert "REPLACED" not in result.stdout
    seen_by_a = sorted(line[3:] for line in result.stdout.splitlines() if line.startswith("A: "))
    assert seen_by_a == [LOCK_FILE, STATE_FILE]  # team B's file is not in team A's container
    assert sorted(p.name for p in gpu_dir.iterdir()) == [LOCK_FILE, STATE_FILE]  # nor on the GPU's side
    writable = {m.host_path for answer in answers.values() for m in answer.mounts if not m.read_only}
    assert writable == {str(gpu_dir / STATE_FILE), str(gpu_dir / LOCK_FILE)}  # the simulated device, no directory

    # One simulated GPU for both: the host-side reader of its state counts both containers' tenants.
    snapshot = read_state(gpu_dir)
    assert [p.kernels for p in snapshot.procs] == [LAUNCHES, LAUNCHES], json.dumps([str(p) for p in snapshot.procs])
