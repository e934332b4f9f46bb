"""The extender latency benchmark in miniature: every kind of figure, over the real HTTP server."""

from __future__ import annotations

import json

import pytest

from bench import extender_latency
from fastgshare import keys
from fastgshare.codec import decode_assignment


def test_a_small_run_reports_every_kind_and_counts_its_requests(capsys: pytest.CaptureFixture[str]) -> None:
    extender_latency.main(["--sizes", "3", "--requests", "12"])
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert (result["nodes"], result["gpus"]) == (3, 3 * extender_latency.GPUS_PER_NODE)
    for kind, count in (("warm", 12), ("steady", 12), ("cold", len(extender_latency.ASKED))):
        for verb in ("filter", "prioritize"):
            figures = result[kind][verb]
            assert figures["n"] == count
            assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    assert set(result["after_rebuild"]) == {"seen", "new"}


def test_a_request_count_below_one_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        extender_latency.main(["--requests", "0"])
    assert "--requests must be at least 1, got 0" in capsys.readouterr().err


def test_the_steady_phase_adds_pods_to_every_gpu_in_turn_so_none_overflows() -> None:
    nodes = 3
    gpus = nodes * extender_latency.GPUS_PER_NODE
    placed = [decode_assignment(extender_latency.extra_pod(nodes, serial).annotations[keys.POD_ASSIGNMENT_ANNOTATION])
              for serial in range(2 * gpus)]
    assert len({pod.gpu_uuid for pod in placed[:gpus]}) == gpus  # every GPU once before any twice
    assert [pod.gpu_uuid for pod in placed[gpus:]] == [pod.gpu_uuid for pod in placed[:gpus]]
