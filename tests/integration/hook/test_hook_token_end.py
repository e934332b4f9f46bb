"""A token's end waits for the launches other threads let in under it (gate.c, ``settle_locked``).

A launch that passed the gate belongs to the token it passed under, even while its driver call
has not returned (the stream is full: the call blocks until there is room). The token's end must
wait for such a launch, then synchronise, before the token goes back to the arbiter. Otherwise the
kernel is queued only after the sync, and it runs when the process holds no token, in the time the
arbiter has given another tenant.

The simulated GPU measures it, not the hook. The fake arbiter holds every TOKEN reply for
``GAP_S`` (another tenant's turn). It reads the GPU's state file when the request arrives and again
just before it answers. No kernel of the tenant may run in between.

Measured on the 2-core dev machine: with the wait, every token's last kernel ended 0.3 to 0.7 ms
before its return arrived, and no gap saw a kernel. With the call to ``wait_in_flight_locked``
removed, the first token's return arrived while its second kernel ran; two 100 ms kernels ended in
the gap, the last 200 ms after the return (the gap is 400 ms). A launch counted in flight only after
the validity check is a race of nanoseconds, which this test cannot pin.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import attrs

from simgpu.state import sample_state
from tests.integration.hook.fake_arbiter import FakeArbiter, Request, Script
from tests.integration.hook.tenants import Build, run_tenant

StartArbiter = Callable[[Script], FakeArbiter]
MS = 1_000_000
KERNEL_US = 100_000  # every kernel runs 100 ms
TOKEN_NS = 20 * MS  # a token ends while its first kernel runs, the later launches blocked behind it
GAP_S = 0.4  # longer than the two kernels that run in it when the token's end does not wait


@attrs.frozen
class GpuView:
    """The tenant as the simulated GPU counts it (the only process on this GPU)."""

    kernels: int
    running: int
    last_end_ns: int


def _view(gpu_dir: Path) -> GpuView:
    snapshot = sample_state(gpu_dir)
    if snapshot is None or not snapshot.procs:
        return GpuView(0, 0, 0)
    (proc,) = snapshot.procs
    return GpuView(proc.kernels, proc.running, proc.last_end_ns)


def test_no_kernel_runs_while_the_process_waits_for_its_next_token(build: Build, gpu_dir: Path,
                                                                    start_arbiter: StartArbiter) -> None:
    """Two threads launch 100 ms kernels on one stream that holds one. Under each 20 ms token the
    first kernel runs and the next launches wait inside the driver for room. At the token's end the
    hook waits for those launches and synchronises (their kernels run, charged to the token). Only
    then does it ask for the next token: while the arbiter holds its reply, the GPU sees no kernel
    of the tenant running or ending."""
    gaps: list[tuple[GpuView, GpuView]] = []

    def other_tenants_turn(request: Request) -> None:
        del request
        before = _view(gpu_dir)
        time.sleep(GAP_S)
        gaps.append((before, _view(gpu_dir)))

    arbiter = start_arbiter(Script(token_ns=TOKEN_NS, before_token_reply=other_tenants_turn))
    result = run_tenant(build, gpu_dir, "--threads", "2", "--launches", "8", "--duration-us", str(KERNEL_US),
                        "--sync", "end", arbiter=arbiter, env={"FASTGSHARE_FAKE_GPU_QUEUE_DEPTH": "1"},
                        timeout_s=30)
    assert result.returncode == 0, result.stderr
    assert result.summary["launches"] == 8, result.summary
    ran_without_token = [(number, before, after) for number, (before, after) in enumerate(gaps, 1)
                         if before.running or after != before]
    assert not ran_without_token, f"the tenant's kernels ran while it waited for token(s) {ran_without_token}"
    # The case arose: a token was charged for more than its first kernel, so a launch of it was
    # still blocked in the driver at its end (two kernels take at least twice KERNEL_US).
    used = [r.used_ns or 0 for r in arbiter.token_requests()]
    assert max(used) >= 2 * KERNEL_US * 1000, used
