"""``fastgshare check`` validates whole manifests, as issue 15 (defect 6) asks.

It used to accept a FaSTPod with no ``spec`` and a Deployment whose share nothing would read,
report the typo ``gpu_quota_requests`` only as a missing key, refuse directories, call the
repo's own workload list "unreadable", and had no ``-o json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastgshare_cli.main import main

REPO = Path(__file__).resolve().parents[3]
SHARE = """
    fastgshare/gpu_quota_request: "0.4"
    fastgshare/gpu_quota_limit: "0.8"
    fastgshare/gpu_sm_partition: "50"
    fastgshare/gpu_mem: "1Gi"
"""
FASTPOD = """apiVersion: fastgshare.caps.in.tum/v1
kind: FaSTPod
metadata:
  name: resnet
  annotations:""" + SHARE + """spec:
  replicas: 2
  podSpec:
    containers: [{name: c, image: i}]
"""
DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations:""" + SHARE.replace("\n    ", "\n        ") + """    spec:
      containers: [{name: c, image: i}]
"""


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "240")


def check(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str], *options: str) -> tuple[int, str, str]:
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    code = main(["check", *options, str(path)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_valid_fastpod_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = check(tmp_path, FASTPOD, capsys)
    assert (code, err) == (0, "")
    assert "FaSTPod/resnet" in out


def test_a_fastpod_without_spec_is_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check(tmp_path, FASTPOD[:FASTPOD.index("spec:")], capsys)
    assert code == 1
    assert "FaSTPod/resnet" in err
    assert "spec: is required; allowed: a mapping with podSpec (a PodSpec with at least one container)" in err


def test_a_deployment_whose_share_nothing_reads_is_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check(tmp_path, DEPLOYMENT, capsys)
    assert code == 1
    assert ("spec.template.spec.containers: no container has a limit of fastgshare.caps.in.tum/vgpu, so the "
            "share is ignored; allowed: resources.limits {fastgshare.caps.in.tum/vgpu: 1} on the GPU container") in err
    assert ("spec.template.spec.schedulerName: not set (the default scheduler ignores the share); "
            "allowed: fastgshare-scheduler") in err


def test_a_deployment_wired_to_fastgshare_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wired = DEPLOYMENT.replace("containers: [{name: c, image: i}]",
                               "schedulerName: fastgshare-scheduler\n      containers: [{name: c, image: i, "
                               "resources: {limits: {fastgshare.caps.in.tum/vgpu: 1}}}]")
    code, _, err = check(tmp_path, wired, capsys)
    assert (code, err) == (0, "")


def test_an_unknown_fastgshare_key_suggests_the_nearest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check(tmp_path, FASTPOD.replace("gpu_quota_request:", "gpu_quota_requests:"), capsys)
    assert code == 1
    assert ("fastgshare/gpu_quota_requests: unknown annotation; did you mean fastgshare/gpu_quota_request?"
            in err)


def test_the_schema_of_the_whole_manifest_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = check(tmp_path, FASTPOD.replace("podSpec:\n", "podSpec:\n    metadata: {labels: {a: b}}\n"),
                         capsys)
    assert code == 1
    assert "spec.podSpec: Additional properties are not allowed ('metadata' was unexpected)" in err
    pod = ("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
           "spec: {hostIPC: 'yes', containers: [{name: c, image: i}]}\n")
    code, _, err = check(tmp_path, pod, capsys)
    assert code == 1
    assert "Pod/p:\n  - spec.hostIPC: 'yes' is not of type 'boolean', 'null'" in err


def test_directories_are_searched_for_manifests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "nested").mkdir()
    (tmp_path / "a.yaml").write_text(FASTPOD)
    (tmp_path / "nested" / "b.yml").write_text(FASTPOD.replace("resnet", "bert"))
    (tmp_path / "notes.txt").write_text("not a manifest")
    assert main(["check", "-o", "json", str(tmp_path)]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert [(item["file"], item["object"]) for item in checked] == [
        (str(tmp_path / "a.yaml"), "FaSTPod/resnet"), (str(tmp_path / "nested" / "b.yml"), "FaSTPod/bert")]


def test_an_empty_directory_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(tmp_path)]) == 1
    assert f"{tmp_path}: no .yaml, .yml or .json files in this directory" in capsys.readouterr().err


def test_the_repos_workload_list_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "-o", "json", str(REPO / "examples" / "paper-workload.yaml")]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert [(item["object"], item["replicas"], item["result"]) for item in checked] == [
        ("workload/resnet", 4, "ok"), ("workload/rnnt", 2, "ok"), ("workload/bert", 2, "ok")]


def test_the_repos_own_manifests_all_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(REPO / "examples"), str(REPO / "deploy" / "examples")]) == 0, capsys.readouterr().err


def test_a_function_profile_is_checked_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = json.loads((REPO / "examples" / "profile-resnet50.json").read_text())
    assert main(["check", "-o", "json", str(REPO / "examples" / "profile-resnet50.json")]) == 0
    (found,) = json.loads(capsys.readouterr().out)
    assert (found["object"], found["result"]) == ("Profile/resnet50", "ok")
    profile["points"][1]["smPartition"] = 0
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(profile))
    assert main(["check", str(broken)]) == 1
    assert "smPartition must be 1..100, got 0" in capsys.readouterr().err


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = check(tmp_path, FASTPOD + "---\n" + FASTPOD.replace('"0.4"', '"-0.1"').replace("resnet", "neg"),
                         capsys, "-o", "json")
    assert code == 1
    ok, bad = json.loads(out)
    assert ok == {"file": str(tmp_path / "manifest.yaml"), "object": "FaSTPod/resnet", "replicas": 2,
                  "result": "ok", "share": {"request": "0.4", "limit": "0.8", "smPercent": 50,
                                            "memoryBytes": 2**30},
                  "problems": [], "note": "", "notices": []}
    assert bad["result"] == "invalid"
    assert bad["share"] is None
    assert bad["problems"] == ['fastgshare/gpu_quota_request: "-0.1" is negative; allowed: a decimal fraction of '
                               'GPU time, 0 <= request <= 1 (e.g. "0.4")']
