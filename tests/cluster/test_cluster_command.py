"""``fastgshare cluster up | status | down`` as a user runs them: a pod really runs, a second
``up`` is refused, and ``down`` leaves the host as it found it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastgshare_cluster import node
from tests.cluster.controlplane import Binaries

pytestmark = pytest.mark.realnode

FASTGSHARE = str(Path(sys.executable).parent / "fastgshare")
HELLO = """\
apiVersion: v1
kind: Pod
metadata: {name: hello}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: hello
    image: fastgshare/tenant:local
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "echo hello from $(cat /proc/self/cgroup | grep -c kubepods) kubepods cgroups; sleep 600"]
"""


def run(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=300, check=False)
    if check:
        assert result.returncode == 0, f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
    return result


def host_snapshot(state_dir: Path) -> dict[str, object]:
    """What a cluster could leave behind on the host."""
    processes = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (str(state_dir) in cmdline or "containerd-shim" in cmdline or "kubelet" in cmdline):
            processes.add(f"{entry.name} {cmdline.strip()}")
    iptables = ""
    if shutil.which("iptables-save"):
        saved = run("iptables-save", check=False).stdout
        iptables = "\n".join(re.sub(r"\[\d+:\d+\]", "", line) for line in saved.splitlines()
                             if not line.startswith("#"))
    return {
        "processes": processes,
        "mounts": sorted(line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()),
        "links": sorted(line.split(":")[1].strip().split("@")[0]
                        for line in run("ip", "-o", "link").stdout.splitlines()),
        "sysctls": {name: Path("/proc/sys", name.replace(".", "/")).read_text() for name in node.SYSCTLS},
        "paths": {path: os.path.lexists(path) for path in node.HOST_PATHS},
        "cgroups": sorted(directory for top in Path("/sys/fs/cgroup").glob("*/kubepods")
                          for directory, _subdirs, _files in os.walk(top)),
        "top_cgroups": sorted(str(path) for path in Path("/sys/fs/cgroup").glob("*/*") if path.is_dir()),
        "routes": run("ip", "route").stdout,
        "iptables": iptables,
    }


@pytest.fixture
def state_dir(tmp_path: Path, cluster_binaries: Binaries, real_node_turn: None) -> Iterator[Path]:
    directory = tmp_path / "state"
    yield directory
    if (directory / "cluster.json").exists():  # the test failed before its own down
        run(FASTGSHARE, "cluster", "down", "--state-dir", str(directory), check=False)


def test_up_runs_pods_refuses_a_second_up_and_down_leaves_no_residue(state_dir: Path) -> None:
    before = host_snapshot(state_dir)
    started = time.monotonic()
    up = run(FASTGSHARE, "cluster", "up", "--state-dir", str(state_dir))
    up_seconds = time.monotonic() - started
    kubeconfig = state_dir / "kubeconfig"
    assert f"export KUBECONFIG={kubeconfig}" in up.stdout, up.stdout
    # with Debian's nats-server (.ci/run installs it): NATS and a queue worker, down stops them too
    assert re.search(r"asynchronous invocations: POST http://\S+/async-function/<name>; NATS JetStream "
                     r"nats://127\.0\.0\.1:\d+, queue worker http://127\.0\.0\.1:\d+", up.stdout), up.stdout

    second = run(FASTGSHARE, "cluster", "up", "--state-dir", str(state_dir), check=False)
    assert second.returncode == 1
    assert "a cluster is already running" in second.stderr, second.stderr
    assert "fastgshare cluster down" in second.stderr, second.stderr

    status = run(FASTGSHARE, "cluster", "status", "--state-dir", str(state_dir))
    for component in ("etcd", "kube-apiserver", "kube-scheduler", "fastgshare-extender", "fastgshare-controller",
                      "containerd", "kubelet", "node-agent", "nats-server", "fastgshare-queue-worker"):
        assert re.search(rf"{component}\s.*running", status.stdout), status.stdout

    kubectl = [shutil.which("kubectl") or "kubectl", f"--kubeconfig={kubeconfig}"]
    run(*kubectl, "apply", "-f", "-", stdin=HELLO)
    run(*kubectl, "wait", "--for=condition=Ready", "pod/hello", "--timeout=60s")
    logs = run(*kubectl, "logs", "hello").stdout
    assert re.match(r"hello from [1-9][0-9]* kubepods cgroups", logs), logs  # a pod with its QoS cgroups

    started = time.monotonic()
    run(FASTGSHARE, "cluster", "down", "--state-dir", str(state_dir))
    down_seconds = time.monotonic() - started
    assert not state_dir.exists()
    after = host_snapshot(state_dir)
    deadline = time.monotonic() + 10  # an exited process may wait a moment for its reaper
    while after["processes"] and time.monotonic() < deadline:
        time.sleep(0.2)
        after = host_snapshot(state_dir)
    for key, value in before.items():
        assert after[key] == value, f"{key} changed: before {value}, after {after[key]}"
    print(f"up {up_seconds:.1f}s, down {down_seconds:.1f}s")


def test_status_and_down_without_a_cluster_say_so(state_dir: Path) -> None:
    status = run(FASTGSHARE, "cluster", "status", "--state-dir", str(state_dir), check=False)
    assert status.returncode == 1
    assert f"no cluster in {state_dir}" in status.stderr
    assert "fastgshare cluster up" in status.stderr
    down = run(FASTGSHARE, "cluster", "down", "--state-dir", str(state_dir))
    assert f"no cluster in {state_dir}" in down.stdout


def test_three_nodes_with_gpus_per_node_power_off_and_on_and_down_leaves_no_residue(state_dir: Path) -> None:
    before = host_snapshot(state_dir)
    up = run(FASTGSHARE, "cluster", "up", "--nodes", "3", "--gpus", "2x16GiB:80sm", "--gpus", "1x24GiB:84sm",
             "--state-dir", str(state_dir))
    assert "node fastgshare-node-2 with 1 simulated GPU(s) (1x24GiB:84sm)" in up.stdout, up.stdout
    assert "node fastgshare-node-3 with 1 simulated GPU(s) (1x24GiB:84sm)" in up.stdout, up.stdout
    kubectl = [shutil.which("kubectl") or "kubectl", f"--kubeconfig={state_dir / 'kubeconfig'}"]
    capacity = run(*kubectl, "get", "nodes", "-o",
                   "jsonpath={range .items[*]}{.metadata.name}={.status.allocatable.fastgshare\\.caps\\.in\\.tum/vgpu} "
                   "{end}").stdout.split()
    assert sorted(capacity) == ["fastgshare-node-2=16", "fastgshare-node-3=16", "fastgshare-node=32"], capacity

    status = run(FASTGSHARE, "cluster", "status", "--state-dir", str(state_dir)).stdout
    for component in ("containerd", "kubelet", "node-agent", "node-namespaces"):
        assert re.search(rf"{component}@fastgshare-node-3\s.*running", status), status
    refused = run(FASTGSHARE, "cluster", "power-off", "fastgshare-node", "--state-dir", str(state_dir), check=False)
    assert refused.returncode == 1
    assert "only the nodes in namespaces of their own" in refused.stderr, refused.stderr
    run(FASTGSHARE, "cluster", "power-off", "fastgshare-node-3", "--state-dir", str(state_dir))
    status = run(FASTGSHARE, "cluster", "status", "--state-dir", str(state_dir), check=False)
    assert status.returncode == 1
    assert re.search(r"kubelet@fastgshare-node-3\s.*exited", status.stdout), status.stdout
    run(FASTGSHARE, "cluster", "power-on", "fastgshare-node-3", "--state-dir", str(state_dir))
    run(*kubectl, "wait", "--for=condition=Ready", "node/fastgshare-node-3", "--timeout=90s")

    run(FASTGSHARE, "cluster", "down", "--state-dir", str(state_dir))
    after = host_snapshot(state_dir)
    deadline = time.monotonic() + 10
    while after["processes"] and time.monotonic() < deadline:
        time.sleep(0.2)
        after = host_snapshot(state_dir)
    for key, value in before.items():
        assert after[key] == value, f"{key} changed: before {value}, after {after[key]}"


def test_bad_node_counts_and_gpu_lists_are_one_line(state_dir: Path) -> None:
    for args, message in ((["--nodes", "0"], "--nodes must be 1 to 6, got 0"),
                          (["--nodes", "2", "--gpus", "1x8GiB:10sm", "--gpus", "1x8GiB:10sm", "--gpus", "1x8GiB:10sm"],
                           "--gpus given 3 times for 2 node(s)")):
        answer = run(FASTGSHARE, "cluster", "up", *args, "--state-dir", str(state_dir), check=False)
        assert answer.returncode == 2
        assert message in answer.stderr, answer.stderr
        assert len(answer.stderr.strip().splitlines()) == 1, answer.stderr
