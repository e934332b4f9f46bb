"""``fastgshare profile run`` end to end on the simulated GPU: for each point the fake function runs
under the real hook with a standalone arbiter holding the point's share, and open-loop load finds
its saturation. Every point of a 2 x 2 grid must serve within ±10 % of what its quota and the fake
function's GPU time imply (quota x 1000 / gpu_ms: the arbiter grants the pod that fraction of GPU
time, each request needs gpu_ms of it). The grid's wall time is printed, not asserted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastgshare.profile import decode_profile
from fastgshare_cli.sandbox import build_hook

REPO = Path(__file__).resolve().parents[3]
GPU_MS = 10
QUOTAS = (0.25, 0.5)
SMS = (50, 100)


@pytest.fixture(scope="module")
def built() -> None:
    build_hook(sys.executable)


def test_a_two_by_two_grid_gives_max_rps_within_ten_percent_of_the_quota(built: None, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTGSHARE_") and k != "LD_PRELOAD"}
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "fastgshare_cli.main", "profile", "run", "--grid-quota", ",".join(map(str, QUOTAS)),
         "--grid-sm", ",".join(map(str, SMS)), "--gpu-ms", str(GPU_MS), "--seconds-per-step", "2", "--slo-ms", "500",
         "--keep-dominated", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    wall_s = time.monotonic() - began
    assert result.returncode == 0, result.stderr
    profile = decode_profile(out.read_text())
    ratios = {p.key: round(p.max_rps / (p.quota_limit * 1000 / GPU_MS), 3) for p in profile.points}
    print(f"2 x 2 grid in {wall_s:.1f} s; maxRps / (quota x 1000 / gpu_ms): {ratios}")
    assert profile.function == "fake-fn"
    assert profile.slo is not None
    assert profile.slo.latency_ms == 500
    assert [(p.quota_request, p.quota_limit, p.sm_partition) for p in profile.points] == [
        (q, q, s) for q in QUOTAS for s in SMS]
    for point in profile.points:
        expected = point.quota_limit * 1000 / GPU_MS
        assert point.max_rps == pytest.approx(expected, rel=0.1), (point.key, ratios, result.stderr)
        assert point.memory_bytes == 1 << 30
        assert len(point.steps) >= 2
        assert 0 < point.slo_rps <= point.max_rps
        assert point.p50_ms is not None
        assert point.p50_ms >= GPU_MS
    assert "q25-s100 step 1:" in result.stderr
    assert "4 point(s) in" in result.stderr

    shown = subprocess.run([sys.executable, "-m", "fastgshare_cli.main", "profile", "show", str(out), "-o", "json"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert shown.returncode == 0, shown.stderr
    assert [p["config"] for p in json.loads(shown.stdout)["points"]] == ["q25-s50", "q25-s100", "q50-s50", "q50-s100"]


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_ctrl_c_stops_fake_fn_and_the_arbiter(built: None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTGSHARE_") and k != "LD_PRELOAD"}
    process = subprocess.Popen(
        [sys.executable, "-m", "fastgshare_cli.main", "profile", "run", "--grid-quota", "0.5", "--grid-sm", "100",
         "--seconds-per-step", "1"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        assert " step 1:" in line, line
        children = _children(process.pid)
        assert len(children) >= 2  # the arbiter and fake-fn
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr
    assert not [pid for pid in children if _alive(pid)]
