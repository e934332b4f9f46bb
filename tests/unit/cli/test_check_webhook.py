"""Issue 36 item 6: ``fastgshare check`` says what the admission webhook will do with a vGPU pod's
scheduler instead of calling the pod invalid, and calls it invalid with ``--no-webhook``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from fastgshare_cli.check import INVALID, OK, check_file, run_check
from fastgshare_cli.main import main

SHARE = """
    fastgshare/gpu_quota_request: "0.4"
    fastgshare/gpu_quota_limit: "0.8"
    fastgshare/gpu_sm_partition: "50"
    fastgshare/gpu_mem: "1Gi"
"""
POD = """apiVersion: v1
kind: Pod
metadata:
  name: p
  annotations:""" + SHARE + """spec:
  SCHEDULER
  containers: [{name: c, image: i, resources: {limits: {fastgshare.caps.in.tum/vgpu: 1}}}]
"""
DEPLOYMENT = """apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations:""" + SHARE.replace("\n    ", "\n        ") + """    spec:
      containers: [{name: c, image: i, resources: {requests: {fastgshare.caps.in.tum/vgpu: 1},
                                                   limits: {fastgshare.caps.in.tum/vgpu: 1}}}]
"""
NOT_SET = "schedulerName is not set: the admission webhook sets it to fastgshare-scheduler"


def manifest(tmp_path: Path, text: str) -> str:
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    return str(path)


def pod(scheduler: str | None) -> str:
    return POD.replace("SCHEDULER", "" if scheduler is None else f"schedulerName: {scheduler}")


def run(path: str, *, webhook: bool) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_check([path], "table", Console(file=out, width=240), Console(file=err, width=240), webhook=webhook)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("scheduler", [None, "default-scheduler"])
def test_a_vgpu_pod_with_the_default_scheduler_is_ok_with_a_note_and_invalid_without_the_webhook(
        tmp_path: Path, scheduler: str | None) -> None:
    path = manifest(tmp_path, pod(scheduler))
    (with_webhook,) = check_file(path)
    assert with_webhook.result == OK
    assert with_webhook.problems == ()
    (notice,) = with_webhook.notices
    expected = NOT_SET if scheduler is None else NOT_SET.replace("not set", "'default-scheduler'")
    assert notice == f"note: spec.{expected} when the pod is created"
    code, out, err = run(path, webhook=True)
    assert code == 0
    assert "ok (see notes)" in out
    assert f"Pod/p:\n  - {notice}" in err

    (without,) = check_file(path, webhook=False)
    assert without.result == INVALID
    assert without.notices == ()
    assert any(problem.startswith("spec.schedulerName: ") and "allowed: fastgshare-scheduler" in problem
               for problem in without.problems)
    assert run(path, webhook=False)[0] == 1


def test_a_deployment_template_is_judged_as_its_pods_will_be(tmp_path: Path) -> None:
    path = manifest(tmp_path, DEPLOYMENT)
    (found,) = check_file(path)
    assert (found.result, found.notices) == (OK, (f"note: spec.template.spec.{NOT_SET} when the pod is created",))
    (without,) = check_file(path, webhook=False)
    assert [problem for problem in without.problems if "schedulerName" in problem] == [
        "spec.template.spec.schedulerName: not set (the default scheduler ignores the share); "
        "allowed: fastgshare-scheduler"]


def test_another_scheduler_is_a_warning_with_the_webhook_and_a_problem_without(tmp_path: Path) -> None:
    path = manifest(tmp_path, pod("volcano"))
    (found,) = check_file(path)
    assert found.result == OK
    (warning,) = found.notices
    assert warning.startswith("warning: fastgshare: the pod asks for fastgshare.caps.in.tum/vgpu but "
                              "schedulerName is 'volcano'")
    (without,) = check_file(path, webhook=False)
    assert without.result == INVALID
    assert any("'volcano'" in problem for problem in without.problems)


def test_the_webhook_excuses_only_the_scheduler(tmp_path: Path) -> None:
    """The share's own problems stay problems; a pod with a share but no vGPU request is not routed."""
    (bad_share,) = check_file(manifest(tmp_path, pod(None).replace('"50"', '"0"')))
    assert bad_share.result == INVALID
    assert bad_share.notices
    assert not any("schedulerName" in problem for problem in bad_share.problems)
    unrouted = pod(None).replace("resources: {limits: {fastgshare.caps.in.tum/vgpu: 1}}", "resources: {}")
    (found,) = check_file(manifest(tmp_path, unrouted))
    assert found.notices == ()
    assert any(problem.startswith("spec.schedulerName: not set") for problem in found.problems)


def test_ours_already_has_nothing_to_say_and_json_carries_the_notices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (found,) = check_file(manifest(tmp_path, pod("fastgshare-scheduler")))
    assert (found.result, found.notices, found.problems) == (OK, (), ())
    assert main(["check", "-o", "json", manifest(tmp_path, pod(None))]) == 0
    (item,) = json.loads(capsys.readouterr().out)
    assert item["result"] == OK
    assert item["notices"] == [f"note: spec.{NOT_SET} when the pod is created"]


def test_the_no_webhook_flag_reaches_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = manifest(tmp_path, pod(None))
    assert main(["check", path]) == 0
    assert main(["check", "--no-webhook", path]) == 1
    assert "spec.schedulerName: not set (the default scheduler ignores the share)" in capsys.readouterr().err
