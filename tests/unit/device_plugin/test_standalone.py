"""The standalone arbiter's pure parts: the usage file's totals, which outlive the usage meter
forgetting a pod, and its format; reloading the shares file on SIGHUP (taken through the server's
``refresh_shares``, or refused with the old shares kept)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from device_plugin.arbiter.shares import StaticShares
from device_plugin.arbiter.standalone import PodTotals, SharesReloader, UsageTotals, load_shares, usage_document
from fastgshare.usage import PodUsage

GPU = "GPU-sim-0"


def usage(pod: str, used_s: float, tokens: int, waited_s: float = 0.0, throttled_s: float = 0.0) -> PodUsage:
    return PodUsage(pod=pod, gpu=GPU, share=0.0, used_seconds_total=used_s, throttled_seconds_total=throttled_s,
                    wait_bucket_counts=(), wait_sum_seconds=waited_s, wait_count=tokens)


def known(*pods: str) -> Any:
    return lambda pod: pod in pods


def test_the_totals_follow_the_meter_while_it_holds_the_pod() -> None:
    totals = UsageTotals()
    totals.update([usage("run/1", 0.5, 10, 1.0, 0.8)], known("run/1"))
    totals.update([usage("run/1", 1.5, 30, 2.0, 1.6)], known("run/1"))
    assert totals.totals() == {(GPU, "run/1"): PodTotals(1.5, 30, 2.0, 1.6)}


def test_a_pod_the_meter_forgot_and_started_over_keeps_what_it_had() -> None:
    totals = UsageTotals()
    totals.update([usage("run/1", 2.0, 40, 3.0, 2.5)], known("run/1"))
    totals.update([], known("run/1"))  # idle for the meter's window: forgotten
    assert totals.totals() == {(GPU, "run/1"): PodTotals(2.0, 40, 3.0, 2.5)}
    totals.update([usage("run/1", 5.0, 50, 4.0, 3.0)], known("run/1"))  # back, counted from zero (more already)
    totals.update([usage("run/1", 6.0, 60, 4.0, 3.0)], known("run/1"))
    assert totals.totals() == {(GPU, "run/1"): PodTotals(8.0, 100, 7.0, 5.5)}


def test_a_counter_that_went_down_between_two_readings_is_a_new_start() -> None:
    totals = UsageTotals()
    totals.update([usage("run/1", 2.0, 40)], known("run/1"))
    totals.update([usage("run/1", 0.5, 41)], known("run/1"))  # forgotten and back between two readings
    assert totals.totals() == {(GPU, "run/1"): PodTotals(2.5, 81)}


def test_a_pod_gone_from_the_meter_and_the_shares_is_dropped() -> None:
    totals = UsageTotals()
    totals.update([usage("run/1", 1.0, 1), usage("run/2", 1.0, 1)], known("run/1", "run/2"))
    totals.update([usage("run/2", 1.0, 1)], known("run/1"))  # run/2 left the shares but the meter holds its use
    totals.update([], known("run/1"))
    assert list(totals.totals()) == [(GPU, "run/1")]


def test_the_usage_document() -> None:
    document = usage_document({(GPU, "run/1"): PodTotals(1.2345678, 7, 0.5, 0.25)}, sequence=3, pid=42)
    assert document == {"sequence": 3, "pid": 42, "pods": [
        {"pod": "run/1", "gpu": GPU, "usedSeconds": 1.234568, "tokens": 7, "waitedSeconds": 0.5,
         "throttledSeconds": 0.25}]}
    assert json.loads(json.dumps(document)) == document


class FakeServer:
    def __init__(self) -> None:
        self.refreshed = 0

    def refresh_shares(self) -> None:
        self.refreshed += 1


def shares_file(path: Path, pods: dict[str, str], *, mps: bool = True) -> Path:
    path.write_text(json.dumps({"gpus": [{"uuid": GPU, "mps": mps}],
                                "pods": [{"pod": pod, "gpu": GPU, "annotations": {
                                    "fastgshare/gpu_quota_request": limit, "fastgshare/gpu_quota_limit": limit,
                                    "fastgshare/gpu_mem": "1Gi"}}
                                         for pod, limit in pods.items()]}))
    return path


def reloader(tmp_path: Path) -> tuple[SharesReloader, StaticShares, FakeServer, Path]:
    path = shares_file(tmp_path / "shares.json", {"run/1": "0.3"})
    gpus, pods = load_shares(path)
    book, server = StaticShares(pods), FakeServer()
    return SharesReloader(path, gpus, book, server), book, server, path  # type: ignore[arg-type]


def test_sighup_serves_the_file_as_it_is_now_through_refresh_shares(tmp_path: Path) -> None:
    reload, book, server, path = reloader(tmp_path)
    shares_file(path, {"run/1": "0.4", "run/2": "0.5"})
    assert reload.reload()
    share_1, share_2 = book.by_pod("run/1"), book.by_pod("run/2")
    assert share_1 is not None
    assert share_2 is not None
    assert (share_1.time.limit_permille, share_2.time.limit_permille, server.refreshed) == (400, 500, 1)
    shares_file(path, {"run/2": "0.5"})
    assert reload.reload()
    assert (book.by_pod("run/1"), server.refreshed) == (None, 2)


@pytest.mark.parametrize(("content", "says"), [
    ("{not json", "still serving the shares read before"),
    (json.dumps({"gpus": [{"uuid": GPU}], "pods": [{"pod": "run/1", "gpu": GPU, "annotations": {
        "fastgshare/gpu_quota_limit": "1.5"}}]}), "pod run/1"),
    (json.dumps({"gpus": [{"uuid": GPU, "mps": False}], "pods": []}), "fixed when the arbiter starts"),
])
def test_a_file_that_cannot_be_served_is_logged_and_the_old_shares_stay(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str, says: str) -> None:
    reload, book, server, path = reloader(tmp_path)
    path.write_text(content)
    with caplog.at_level(logging.ERROR, logger="device_plugin.arbiter"):
        assert not reload.reload()
    assert says in caplog.text
    share = book.by_pod("run/1")
    assert share is not None
    assert share.time.limit_permille == 300
    assert server.refreshed == 0
