"""``fastgshare profile show`` (the table, the JSON, one clear line for a bad file) and the flags of
``fastgshare profile run`` that stop it before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastgshare_cli.main import main
from fastgshare_cli.profile_command import HttpTarget, ProfileRunError

REPO = Path(__file__).resolve().parents[3]
PROFILE = REPO / "examples" / "profile-resnet50.json"


def test_show_prints_one_row_per_point_with_kept_or_dominated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "show", str(PROFILE)]) == 0
    out = capsys.readouterr().out
    document = json.loads(PROFILE.read_text())
    assert "resnet50: p95 <= 69 ms on V100-16GB" in out
    for column in ("quota", "SM %", "maxRps", "sloRps", "p50 ms", "p95 ms", "p99 ms", "pruning"):
        assert column in out
    rows = [line for line in out.splitlines() if line.startswith("│ q")]
    assert len(rows) == len(document["points"])
    assert all(("kept" in row) != ("dominated" in row) for row in rows)


def test_show_as_json_has_the_rows_and_the_dominance(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "show", str(PROFILE), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["function"] == "resnet50"
    assert result["slo"] == {"percentile": 95, "latencyMs": 69}
    points = result["points"]
    assert len(points) == len(json.loads(PROFILE.read_text())["points"])
    assert set(points[0]) >= {"config", "quotaRequest", "smPartition", "memoryBytes", "maxRps", "sloRps", "p50Ms",
                              "p95Ms", "p99Ms", "dominated"}
    assert any(not p["dominated"] for p in points)


def test_a_dominated_point_is_marked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    point = {"quotaRequest": 0.5, "quotaLimit": 0.5, "smPartition": 50, "memoryBytes": 1 << 30, "maxRps": 40}
    worse = {**point, "smPartition": 100, "maxRps": 30}
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"version": 1, "function": "f", "points": [point, worse]}))
    assert main(["profile", "show", str(path), "-o", "json"]) == 0
    assert [p["dominated"] for p in json.loads(capsys.readouterr().out)["points"]] == [False, True]


@pytest.mark.parametrize(("document", "message"), [
    ('{"version": 2, "function": "f", "points": []}', "profile.version: 2 is not understood; allowed: 1"),
    ('{"version": 1, "function": "f", "points": [{"quotaRequest": 0.5, "smPartition": 50, "memoryBytes": 1, '
     '"maxRps": "fast"}]}', "profile.points[0].maxRps: must be a number, got 'fast'"),
    ('{"version": 1, "function": "f", "points": [{"quotaRequest": 1.5, "smPartition": 50, "memoryBytes": 1, '
     '"maxRps": 1}]}', "need 0 < quotaRequest <= quotaLimit <= 1"),
    ("[1, 2", "profile"),
])
def test_a_bad_file_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], document: str,
                                      message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(document)
    assert main(["profile", "show", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert message in captured.err
    assert captured.err.startswith(f"fastgshare profile show: {path}: ")


def test_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "show", str(tmp_path / "none.json")]) == 2
    assert "cannot be read" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--grid-quota", "0.5,x"], "--grid-quota: 'x' is not a number"),
    (["--grid-quota", "1.5"], "--grid-quota: 1.5 is not a fraction in (0, 1]"),
    (["--grid-sm", "0"], "--grid-sm: 0 is not a percent in 1..100"),
    (["--grid-sm", "50,50"], "repeats a value"),
    (["--memory", "lots"], "--memory: 'lots' is not a byte count"),
    (["--gpu-ms", "0"], "--gpu-ms: 0.0 is not allowed; allowed: ms in (0, 60000]"),
    (["--step-factor", "1"], "--step-factor: 1.0 is not allowed"),
    (["--slo-ms", "-1"], "--slo-ms: -1.0 is not allowed"),
    (["--url", "http://h:1/f"], "--url loads one running function: give one --grid-quota and one --grid-sm"),
    (["--url", "https://h/f", "--grid-quota", "0.5", "--grid-sm", "100"], "plain HTTP"),
])
def test_run_rejects_bad_flags_before_starting_anything(capsys: pytest.CaptureFixture[str], args: list[str],
                                                        message: str) -> None:
    assert main(["profile", "run", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message in err


def test_the_url_target() -> None:
    target = HttpTarget.from_url("http://10.0.0.1:8080/function/fake-fn?x=1")
    assert (target.host, target.port, target.path) == ("10.0.0.1", 8080, "/function/fake-fn?x=1")
    assert target.request_bytes().startswith(b"POST /function/fake-fn?x=1 HTTP/1.1\r\nHost: 10.0.0.1:8080\r\n")
    assert b"Connection: close\r\n" in target.request_bytes()
    assert HttpTarget.from_url("http://gw/").port == 80
    with pytest.raises(ProfileRunError, match="bad port"):
        HttpTarget.from_url("http://gw:99999/")
