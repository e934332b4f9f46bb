"""The arbiter's HELLO from a process whose cgroup file is a recorded real one: the pod UID it names
must also be a pod on this node with an assignment (the agent's pod cache), or HELLO is refused.

The connecting process is this test; its ``/proc/<pid>/cgroup`` is a file in a temporary ``proc``
folder, read by the real :func:`pod_uid_of_pid` and parsed by the real parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from device_plugin.arbiter import server as server_module
from device_plugin.arbiter.client import ArbiterError, HookClient
from device_plugin.arbiter.identity import pod_uid_of_pid
from device_plugin.arbiter.server import ArbiterServer, GpuSettings
from device_plugin.arbiter.shares import PodShare, StaticShares
from fastgshare.arbitration import TimeShare

GPU = "GPU-sim-0"
MS = 1_000_000
ON_NODE = "55c6c714-b240-4dec-9a45-57b61696ab6e"
ELSEWHERE = "0125ec2f-b64a-4868-8f5b-94b56cbab864"  # a well-formed UID the node's pod cache does not hold

# systemd driver on cgroup v2 with containerd (recorded: netdata/netdata#4868), and the same pod as an
# agent in its own cgroup namespace sees it (one "/.." per level up, the kernel's cgroup_path_ns).
V2_SYSTEMD = ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
              "cri-containerd-2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6c4eb501ca132ac36.scope\n")
V2_NAMESPACED = ("0::/../../../kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
                 "cri-containerd-2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6c4eb501ca132ac36.scope\n")
V1_CGROUPFS = ("12:memory:/kubepods/besteffort/pod{dashed}/2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6\n"
               "1:name=systemd:/kubepods/besteffort/pod{dashed}/2032491dcae31e6746f47daa0ac74564f2843a1bd847c5e6\n"
               "0::/\n")


class NodePods(StaticShares):
    """Shares by pod key, and the node's pods by UID (what the agent's pod cache answers)."""

    def __init__(self, shares: dict[str, PodShare], uids: dict[str, str]) -> None:
        super().__init__(shares)
        self._uids = uids

    def pod_of_uid(self, uid: str) -> str | None:
        return self._uids.get(uid)


@pytest.fixture
def proc(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A ``proc`` folder the arbiter reads this process's cgroup file from."""
    with tempfile.TemporaryDirectory(prefix="fgs-proc-") as directory:
        root = Path(directory)
        (root / str(os.getpid())).mkdir()
        monkeypatch.setattr(server_module, "pod_uid_of_pid", lambda pid: pod_uid_of_pid(pid, proc=root))
        yield root


@pytest.fixture
def arbiter() -> Iterator[Path]:
    """An arbiter (not trusting HELLO's pod name) on a real socket; yields the socket's path."""
    book = NodePods({"ns/a": PodShare(GPU, TimeShare(300, 500, 100), 2**30)}, {ON_NODE: "ns/a"})
    with tempfile.TemporaryDirectory(prefix="fgs-arb-") as directory:
        server = ArbiterServer(Path(directory) / "arbiter.sock", {GPU: GpuSettings(mps_enabled=True)}, book,
                               trusted_env=False, window_ns=100 * MS, min_token_ns=2 * MS)
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(server.start())
            started.set()
            loop.run_forever()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            assert started.wait(10)
            yield server.socket_path
        finally:
            if started.is_set():
                asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)


def write_cgroup(proc: Path, text: str) -> None:
    (proc / str(os.getpid()) / "cgroup").write_text(text)


@pytest.mark.parametrize("line", [V2_SYSTEMD, V2_NAMESPACED], ids=["v2-systemd", "v2-systemd-namespaced"])
def test_a_pod_of_this_node_is_served_its_share(proc: Path, arbiter: Path, line: str) -> None:
    write_cgroup(proc, line.format(uid=ON_NODE.replace("-", "_")))
    with contextlib.closing(HookClient(arbiter)) as client:
        assert client.hello("ns/whatever-it-claims").request_permille == 300


def test_a_pod_of_this_node_on_cgroupfs_v1_is_served_its_share(proc: Path, arbiter: Path) -> None:
    write_cgroup(proc, V1_CGROUPFS.format(dashed=ON_NODE))
    with contextlib.closing(HookClient(arbiter)) as client:
        assert client.hello("").request_permille == 300


def test_a_uid_that_is_no_pod_of_this_node_is_refused(proc: Path, arbiter: Path) -> None:
    write_cgroup(proc, V2_SYSTEMD.format(uid=ELSEWHERE.replace("-", "_")))
    with contextlib.closing(HookClient(arbiter)) as client, \
            pytest.raises(ArbiterError, match=r"pid \d+ belongs to no pod with a fastgshare assignment on this node"):
        client.hello("ns/a")  # naming the pod that is here does not help


def test_a_look_alike_of_a_pod_of_this_node_is_refused(proc: Path, arbiter: Path) -> None:
    # The pod's own slice name, made at the root of the hierarchy: not kubelet's, so no pod at all.
    write_cgroup(proc, f"0::/kubepods-burstable-pod{ON_NODE.replace('-', '_')}.slice/x.scope\n")
    with contextlib.closing(HookClient(arbiter)) as client, \
            pytest.raises(ArbiterError, match=r"pid \d+ belongs to no pod with a fastgshare assignment on this node"):
        client.hello("ns/a")
