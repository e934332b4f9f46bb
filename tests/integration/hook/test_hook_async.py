"""The hook's token accounting against an asynchronous GPU: launches return once queued, kernels run
after them, and the application may wait for them itself before its next launch.

(test_hook_gating.py's test_used_time_of_each_returned_token_is_reported is the case of a tenant
that waits for every kernel: its kernels outlive their tokens and are charged in full.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.integration.hook.fake_arbiter import FakeArbiter, Script
from tests.integration.hook.tenants import Build, run_tenant

StartArbiter = Callable[[Script], FakeArbiter]
MS = 1_000_000


def test_a_token_is_charged_for_every_kernel_queued_under_it(build: Build, gpu_dir: Path,
                                                             start_arbiter: StartArbiter) -> None:
    """A tenant that never waits fills its stream (room for three) under a 2 ms token: the token is
    settled only once all four 20 ms kernels it let in have run, and charged for them."""
    arbiter = start_arbiter(Script(token_ns=2 * MS))
    result = run_tenant(build, gpu_dir, "--launches", "8", "--duration-us", "20000", "--sync", "end",
                        arbiter=arbiter, env={"FASTGSHARE_FAKE_GPU_QUEUE_DEPTH": "3"})
    assert result.returncode == 0, result.stderr
    used = [r.used_ns or 0 for r in arbiter.token_requests()]
    assert used[0] == 0
    assert used[1] >= 80 * MS, used  # kernels 1-4 ran one after another after the grant


def test_without_sync_at_token_end_a_token_is_charged_to_its_end(build: Build, gpu_dir: Path,
                                                                 start_arbiter: StartArbiter) -> None:
    """FASTGSHARE_SYNC_AT_TOKEN_END=0: each launch returns at once and its 5 ms kernel runs on past
    the 2 ms token. Nothing synchronises, so the token's use is taken to last to its end: not the
    microseconds its launch call took (what the hook charged when it counted the last launch)."""
    arbiter = start_arbiter(Script(token_ns=2 * MS))
    result = run_tenant(build, gpu_dir, "--launches", "4", "--duration-us", "5000", arbiter=arbiter,
                        env={"FASTGSHARE_SYNC_AT_TOKEN_END": "0"})
    assert result.returncode == 0, result.stderr
    used = [r.used_ns or 0 for r in arbiter.token_requests()]
    assert used == [0, 2 * MS, 2 * MS, 2 * MS]


def test_a_tenant_that_never_waits_is_paced_to_its_tokens(build: Build, gpu_dir: Path,
                                                          start_arbiter: StartArbiter) -> None:
    """Without pacing every 2 ms token let in what the stream holds (64 one-millisecond kernels here)
    and its end waited ~64 ms for them. The first token still does; from its sync the hook learns
    what a launch queues, and the later tokens admit about as many launches as they last."""
    arbiter = start_arbiter(Script(token_ns=2 * MS))
    result = run_tenant(build, gpu_dir, "--launches", "400", "--duration-us", "1000", "--sync", "end",
                        arbiter=arbiter, env={"FASTGSHARE_FAKE_GPU_QUEUE_DEPTH": "64"}, timeout_s=60)
    assert result.returncode == 0, result.stderr
    used = [r.used_ns or 0 for r in arbiter.token_requests()]
    assert used[1] >= 60 * MS, used  # the first token: the whole queue
    paced = sorted(used[2:])
    assert len(paced) >= 50, used
    assert paced[len(paced) // 2] < 32 * MS, used  # the median token: a few kernels, not half the queue
