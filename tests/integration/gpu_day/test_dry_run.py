"""The GPU day's script, ``bench/gpu/run.py``, run as ``--dry-run`` on the simulated GPU: the day
cannot fail for a reason a CPU could show.

It runs once (a module fixture, under a subprocess timeout) with only the Python packages the lent
GPU machine has (:mod:`tests.integration.gpu_day.gpu_machine`), and the tests read its report: one
JSON object on stdout, every part present with a status of ``ok``, ``needs a GPU`` or ``skipped:
<reason>``, none failed, and the parts that run on a CPU report numbers. No speed or share is
asserted: they belong to the benchmark, not to a test; memory on the simulated GPU is exact, so
model sharing's bytes are.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.gpu_day.gpu_machine import guard_environment

REPO = Path(__file__).resolve().parents[3]
RUN = REPO / "bench" / "gpu" / "run.py"
PARTS = ("setup", "c_context_memory", "d_hook_overhead", "a_isolation", "e_mps", "f_model_sharing", "c_memory_limit",
         "b_torch_serving", "memory_matrix")
TIMEOUT_S = 600  # the first build of the hook and the simulated GPU included; the run itself takes ~40 s
RUN_KEYS = ("achievedShare", "peakMemoryBytes", "kernels", "exitCode")


def nvcc_available() -> bool:
    return bool(os.environ.get("NVCC") or shutil.which("nvcc") or Path("/usr/local/cuda/bin/nvcc").is_file())


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    """The dry run's report, its stdout, and the --json file it wrote."""
    directory = tmp_path_factory.mktemp("gpu-day")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTGSHARE_") and k != "LD_PRELOAD"}
    env.update(guard_environment(directory, REPO))
    json_file = directory / "day.json"
    process = subprocess.Popen([sys.executable, str(RUN), "--dry-run", "--seconds", "0.5", "--deadline-s", "400",
                                "--json", str(json_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=REPO)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:  # run.py times its parts out itself; this is the last resort
        process.send_signal(signal.SIGTERM)  # run.py stops the part running (its own process group) and reports
        stdout, stderr = process.communicate(timeout=60)
        pytest.fail(f"run.py --dry-run did not finish within {TIMEOUT_S} s:\n{stderr[-3000:]}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert stdout.count("\n") == 1, f"stdout is not one line:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    return json.loads(stdout), stderr, json_file


def test_prints_one_json_object_and_writes_it(day: tuple[dict[str, Any], str, Path]) -> None:
    report, stderr, json_file = day
    assert report["benchmark"] == "gpu-day"
    assert report["mode"] == "dry-run (simulated GPU)"
    assert report["complete"] is True
    assert json.loads(json_file.read_text()) == report
    assert "| part | status | seconds |" in stderr  # the markdown table


def test_every_part_has_a_status_and_none_failed(day: tuple[dict[str, Any], str, Path]) -> None:
    report, _, _ = day
    statuses = {name: part["status"] for name, part in report["parts"].items()}
    assert tuple(statuses) == PARTS
    bad = {name: status for name, status in statuses.items()
           if status not in ("ok", "needs a GPU") and not status.startswith("skipped: ")}
    assert not bad, json.dumps({name: report["parts"][name] for name in bad}, indent=1)[-6000:]


def test_the_parts_that_run_on_a_cpu_report_numbers(day: tuple[dict[str, Any], str, Path]) -> None:
    parts = day[0]["parts"]
    assert parts["setup"]["status"] == "ok"
    assert {"hook", "tenant", "ctxmem"} <= {key for key, value in parts["setup"]["build"].items() if value}
    context = parts["c_context_memory"]
    assert context["status"] == "ok"
    assert isinstance(context["per_process_bytes_median"], int)  # 0: the simulated GPU models no context memory
    overhead = parts["d_hook_overhead"]
    assert overhead["status"] == "ok"
    for way in ("no_hook", "hook", "hook_no_sync_at_token_end"):
        assert overhead[way]["launch_sync"]["ns_per_launch"] > 0
    isolation = parts["a_isolation"]
    assert isolation["status"] == "ok"
    assert [row["scenario"] for row in isolation["scenarios"]] == [
        "a-alone-limit-0.3", "b-three-saturating", "c-bursty-beside-saturating"]
    for row in isolation["scenarios"]:
        for way in ("enforced", "enforced_no_sync_at_token_end", "uncontrolled"):
            for tenant in row["tenants"]:
                outcome = row[way][tenant]
                assert outcome["first_error"] in ("CUDA_SUCCESS", ""), outcome
                assert outcome["kernels"] > 0, outcome  # how much each got is the benchmark's, not a test's
                assert outcome["achieved"] > 0, outcome
                assert outcome["simgpu_share"] > 0, outcome


@pytest.mark.skipif(not nvcc_available(), reason="no nvcc here: the dry run uses the simulated GPU's own tenant")
def test_with_nvcc_the_days_own_tenant_runs_on_the_simulated_gpu(day: tuple[dict[str, Any], str, Path]) -> None:
    parts = day[0]["parts"]
    assert parts["setup"]["build"]["ptx"]
    for name in ("a_isolation", "d_hook_overhead"):
        assert parts[name]["tenant"]["program"] == "bench/gpu/tenant.c + kernels.cu (PTX)", parts[name]["tenant"]
    assert parts["a_isolation"]["kernel"]["iters"] > 0
    assert parts["d_hook_overhead"]["no_hook"]["launch"]["ns_per_launch"] > 0  # launches back to back, too


def test_model_sharing_runs_on_the_simulated_gpu(day: tuple[dict[str, Any], str, Path]) -> None:
    """The real model-store worker, the hook's fastgshare_model_open in 4 pods, and 4 copies."""
    part = day[0]["parts"]["f_model_sharing"]
    assert part["status"] == "ok", part
    assert part["worker"]["holds"] == [{"key": "gpu/fn/weights", "bytes": part["weights_bytes"]}]
    assert len(part["importers"]) == len(part["copies"]) == part["pods"] == 4
    assert all(part["verdicts"].values()), part["verdicts"]  # the right bytes; an import charges the pod nothing
    assert part["importers_released"] == part["copies_released"] == [{"released": 0}] * 4
    assert part["stale_handle"]["outcome"] == "refused", part["stale_handle"]  # the simulated GPU refuses it
    assert part["pod_socket"] == {"requests": 5, "refusals": []}
    # The simulated GPU models no context memory: the GPU holds the weights once, against a copy per pod.
    used = part["gpu_used_bytes"]
    assert used["worker_alone"] - used["baseline"] == part["weights_bytes"]
    assert used["worker_and_4_importers"] == used["worker_alone"]
    assert used["4_own_copies"] - used["after_worker_stopped"] == 4 * part["weights_bytes"]
    assert "## f. Model sharing" in day[1]


def test_the_runtime_parts_check_what_a_cpu_can(day: tuple[dict[str, Any], str, Path]) -> None:
    parts = day[0]["parts"]
    serving, limit = parts["b_torch_serving"], parts["c_memory_limit"]
    assert serving["status"] == limit["status"] == "needs a GPU"
    check = serving["checks"]["torch_serve.py --check"]
    assert check["check"] == "ok"
    assert check["params"] == 25_557_032  # ResNet-50's parameter count
    for part in (serving, limit):
        run = part["checks"]["fastgshare run"]  # the command the day runs, on the simulated GPU
        assert set(RUN_KEYS) <= set(run), run
        assert run["exitCode"] == 0, run
        assert run["program"]["check"] == "ok", run
    assert limit["checks"]["torch_memory.py --check"]["check"] == "ok"


def test_mps_and_the_matrix_say_why_they_are_skipped(day: tuple[dict[str, Any], str, Path]) -> None:
    parts = day[0]["parts"]
    assert parts["e_mps"]["status"].startswith("skipped: ")
    assert parts["e_mps"]["mps"] is False
    assert parts["e_mps"]["reason"]
    assert parts["memory_matrix"]["status"].startswith("skipped: ")


def test_the_guard_refuses_what_the_gpu_machine_lacks(tmp_path: Path) -> None:
    """The dry run's guard is in force: a package the GPU machine lacks does not import."""
    env = {**os.environ, **guard_environment(tmp_path, REPO)}
    done = subprocess.run([sys.executable, "-c", "import kubernetes"], capture_output=True, text=True, env=env,
                          timeout=60, check=False)
    assert done.returncode != 0
    assert "on the GPU machine" in done.stderr
    done = subprocess.run([sys.executable, "-c", "import attrs, json, bench.gpu.part"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
