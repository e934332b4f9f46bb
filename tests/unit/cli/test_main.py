"""The ``fastgshare`` command: check and pack, their output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastgshare_cli.main import main

REPO = Path(__file__).resolve().parents[3]
PAPER = REPO / "examples" / "paper-workload.yaml"

FASTPOD_OK = """
apiVersion: fastgshare.caps.in.tum/v1
kind: FaSTPod
metadata:
  name: resnet
  annotations:
    fastgshare/gpu_quota_request: "0.7"
    fastgshare/gpu_quota_limit: "0.8"
    fastgshare/gpu_sm_partition: "50"
    fastgshare/gpu_mem: "2700000000"
spec:
  replicas: 2
  podSpec:
    containers: [{name: c, image: i}]
"""

FASTPOD_BAD = """
apiVersion: fastgshare.caps.in.tum/v1
kind: FaSTPod
metadata:
  name: broken
  annotations:
    fastgshare/gpu_quota_request: "0.9"
    fastgshare/gpu_quota_limit: "0.5"
    fastgshare/gpu_sm_partition: "0"
spec:
  replicas: 1
"""


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_check_prints_the_parsed_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", _write(tmp_path, "ok.yaml", FASTPOD_OK)]) == 0
    out = capsys.readouterr().out
    assert "FaSTPod/resnet" in out
    assert "0.7" in out
    assert "2.515 GiB" in out
    assert "ok" in out


def test_check_reports_every_problem_and_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = _write(tmp_path, "ok.yaml", FASTPOD_OK), _write(tmp_path, "bad.yaml", FASTPOD_BAD)
    assert main(["check", good, bad]) == 1
    captured = capsys.readouterr()
    assert "invalid (4 problems)" in captured.out
    assert f"{bad}: FaSTPod/broken:\n" in captured.err
    assert "spec.podSpec: is required" in captured.err
    assert ('fastgshare/gpu_quota_request: request "0.9" is greater than fastgshare/gpu_quota_limit "0.5"'
            in captured.err)
    assert 'fastgshare/gpu_sm_partition: "0" is out of range' in captured.err
    assert "fastgshare/gpu_mem: is required" in captured.err


def test_check_multi_document_files_and_skips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = FASTPOD_OK + "---\napiVersion: v1\nkind: Service\nmetadata: {name: svc}\n---\n"
    assert main(["check", _write(tmp_path, "multi.yaml", text)]) == 0
    out = capsys.readouterr().out
    assert "Service/svc" in out
    assert "skipped: Service objects carry no GPU share" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param("kind: [unclosed", "line 1, column 16: not valid YAML", id="bad-yaml"),
        pytest.param("- just\n- a list\n", "workload/entry 0:\n  - must be a mapping with name, count and annotations",
                     id="not-object"),
    ],
)
def test_check_unreadable_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
                                message: str) -> None:
    path = _write(tmp_path, "x.yaml", content)
    assert main(["check", path]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert path in err


def test_check_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "/nonexistent/f.yaml"]) == 1
    assert "/nonexistent/f.yaml: cannot read: No such file or directory" in capsys.readouterr().err


def test_pack_paper_workload_on_one_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", "--gpu", "V100-16GB", str(PAPER)]) == 0
    out = capsys.readouterr().out
    assert "8 pods on 1 x V100-16GB (one pod per GPU would need 8)" in out
    assert "bert-0" in out
    assert "98.4% of time x SM" in out


def test_pack_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", "--gpu", "V100-16GB", "-o", "json", str(PAPER)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["gpuCount"], result["podCount"], result["unplaced"]) == (1, 8, [])
    pods = {p["name"]: p for p in result["gpus"][0]["pods"]}
    assert pods["bert-0"]["time"] == [0, 600]


def test_pack_reads_fastpod_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", "--gpu", "A100-40GB", _write(tmp_path, "f.yaml", FASTPOD_OK)]) == 0
    # Two pods of 0.7 time x 50 % SM run side by side on the two halves of the SMs.
    assert "2 pods on 1 x A100-40GB" in capsys.readouterr().out


def test_pack_refuses_invalid_shares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", "--gpu", "T4", _write(tmp_path, "bad.yaml", FASTPOD_BAD)]) == 1
    assert "FaSTPod/broken: invalid GPU share" in capsys.readouterr().err


def test_pack_reports_pods_that_fit_no_gpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = ('[{name: big, annotations: {fastgshare/gpu_quota_request: "0.1", '
                'fastgshare/gpu_quota_limit: "0.2", fastgshare/gpu_mem: "20Gi"}}]')
    assert main(["pack", "--gpu", "T4", _write(tmp_path, "w.yaml", workload)]) == 1
    assert "not placed big-0: does not fit an empty GPU: needs 20 GiB" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--gpu", "K80"], 'GPU model "K80" is unknown', id="unknown-gpu"),
        pytest.param(["--gpu", "T4", "--slots-per-gpu", "0"], "--slots-per-gpu must be >= 1", id="zero-slots"),
    ],
)
def test_pack_bad_options(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", *args, str(PAPER)]) == 1
    assert message in capsys.readouterr().err


def test_pack_file_without_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "svc.yaml", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n")
    assert main(["pack", "--gpu", "T4", path]) == 1
    assert "no workload found" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["pack", str(PAPER)])
    assert caught.value.code == 2
    assert "--gpu" in capsys.readouterr().err


def test_pack_says_plainly_when_nothing_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 15, defect 8: it said '2 pods on 0 x T4'."""
    workload = ('[{name: big, count: 2, annotations: {fastgshare/gpu_quota_request: "0.1", '
                'fastgshare/gpu_quota_limit: "0.2", fastgshare/gpu_mem: "20Gi"}}]')
    assert main(["pack", "--gpu", "T4", _write(tmp_path, "w.yaml", workload)]) == 1
    out = capsys.readouterr().out
    assert "on 0 x" not in out
    assert "none of the 2 pods fits an empty T4" in out


def test_pack_counts_the_pods_it_placed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = ('[{name: big, annotations: {fastgshare/gpu_quota_request: "0.1", '
                'fastgshare/gpu_quota_limit: "0.2", fastgshare/gpu_mem: "20Gi"}}, '
                '{name: small, count: 2, annotations: {fastgshare/gpu_quota_request: "0.1", '
                'fastgshare/gpu_quota_limit: "0.2", fastgshare/gpu_mem: "1Gi"}}]')
    assert main(["pack", "--gpu", "T4", _write(tmp_path, "w.yaml", workload)]) == 1
    assert "2 of 3 pods on 1 x T4 (one pod per GPU would need 2); 1 fits no GPU" in capsys.readouterr().out
