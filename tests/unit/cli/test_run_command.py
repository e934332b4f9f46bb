"""``fastgshare run``'s pure parts: its flags (one line and exit 2 for a bad one), finding CMD (127,
126), the exit status, CMD's environment, the GPU choice, the summary, which processes are a run's,
and the run's pod in the arbiter's usage file."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path
from types import SimpleNamespace

import attrs
import pytest

from fastgshare import keys
from fastgshare.share import ShareSpec
from fastgshare_cli.main import build_parser, main
from fastgshare_cli.run_command import (
    EXIT_CANNOT_RUN,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    FlagError,
    RunOptions,
    RunPlaces,
    child_environment,
    exit_status,
    parse_options,
    resolve_command,
    run_summary,
    status_line,
    summary_line,
)
from fastgshare_cli.run_gpu import GpuChoice, GpuChoiceError, choose_gpu, simulated_gpu
from fastgshare_cli.run_meter import (
    ArbiterTotals,
    ArbiterUsageMeter,
    RunProcesses,
    RunTotals,
    UsageAccount,
    pod_usage,
    with_arbiter_time,
)
from fastgshare_cli.run_session import STATE_DIR_ENV, RunSession, SessionError, default_state_dir

GIB = 1 << 30
SIMULATED = simulated_gpu("1x16GiB:80sm")
REAL_GPU = GpuChoice(spec="real", simulated=False, uuid="GPU-1234", memory_bytes=80 * GIB, sm_count=132, mps=False)
SUMMARY_KEYS = {"achievedShare", "peakMemoryBytes", "kernels", "exitCode", "throttledSeconds", "request", "limit",
                "sm", "memoryLimitBytes", "gpu", "wallSeconds", "arbiterShare", "waitedSeconds", "tokens"}


def options(*argv: str) -> RunOptions:
    return parse_options(build_parser().parse_args(["run", *argv]))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    status = main(["run", *argv])
    return status, capsys.readouterr().err.splitlines()


# --- flags -------------------------------------------------------------------------------
def test_defaults_are_the_whole_gpu_request_equal_to_limit() -> None:
    share = options("--", "true").share(SIMULATED)
    assert share == ShareSpec(request_permille=1000, limit_permille=1000, sm_percent=100, memory_bytes=16 * GIB)


def test_the_request_follows_the_limit_unless_given() -> None:
    assert options("--limit", "0.3", "--", "true").share(SIMULATED).request_permille == 300
    share = options("--request", "0.1", "--sm", "50", "--memory", "1Gi", "--", "true").share(SIMULATED)
    assert (share.request_permille, share.limit_permille, share.sm_percent, share.memory_bytes) == (100, 1000, 50, GIB)


def test_the_command_after_the_double_dash_keeps_its_own_flags() -> None:
    parsed = options("--limit", "0.5", "--", "tenant", "--limit", "9", "-o", "x")
    assert parsed.command == ("tenant", "--limit", "9", "-o", "x")
    assert options("tenant", "--seconds", "3").command == ("tenant", "--seconds", "3")


@pytest.mark.parametrize(("argv", "line"), [
    (["--limit", "1.5"], 'fastgshare run: --limit: "1.5" is out of range; allowed: a decimal fraction of GPU time, '
                         'request <= limit <= 1 (0 with request 0 parks the pod; e.g. "0.8")'),
    (["--limit", "0"], 'fastgshare run: --limit: "0" gives the command no GPU time; allowed: a decimal fraction of '
                       'GPU time, 0 < limit <= 1 (e.g. "0.8")'),
    (["--request", "0.5", "--limit", "0"], 'fastgshare run: --request: request "0.5" is greater than --limit "0"; '
                                           'allowed: request <= limit (a limit of 0 parks the pod: request 0 too)'),
    (["--request", "0.5", "--limit", "0.3"], 'fastgshare run: --request: request "0.5" is greater than --limit '
                                             '"0.3"; allowed: request <= limit'),
    (["--request", "-1"], 'fastgshare run: --request: "-1" is negative; allowed: a decimal fraction of GPU time, '
                          '0 <= request <= 1 (e.g. "0.4")'),
    (["--sm", "0"], 'fastgshare run: --sm: "0" is out of range; allowed: an integer percent of the SMs, 1..100 '
                    '(e.g. "50")'),
    (["--sm", "half"], 'fastgshare run: --sm: "half" is not an integer; allowed: an integer percent of the SMs, '
                       '1..100 (e.g. "50")'),
    (["--memory", "lots"], 'fastgshare run: --memory: "lots" is not a byte count; allowed: a positive whole number '
                           'of bytes, e.g. "2700000000", "1536Mi" or "1.5Gi"'),
    (["-o", "yaml"], 'fastgshare run: -o "yaml" is not an output format; allowed: text, json'),
    (["--gpu", "2x16GiB:80sm"], 'fastgshare run: --gpu: GPU spec "2x16GiB:80sm" has 2 GPUs; a run uses one; '
                                'allowed: "real"'),
    (["--gpu", "16GiB"], 'fastgshare run: --gpu: GPU spec "16GiB" is malformed; allowed: [MODEL=]COUNTxMEMORY'),
])
def test_a_bad_flag_is_one_line_naming_it_and_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                     line: str) -> None:
    status, lines = run(capsys, *argv, "--", "true")
    assert status == EXIT_USAGE
    assert len(lines) == 1
    assert lines[0].startswith(line)


def test_a_bad_limit_alone_does_not_blame_the_request_that_follows_it() -> None:
    with pytest.raises(FlagError) as error:
        options("--limit", "2", "--", "true")
    assert "--request" not in str(error.value)


def test_no_command_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = run(capsys, "--limit", "0.5")
    assert status == EXIT_USAGE
    assert lines == ["fastgshare run: no command to run; usage: fastgshare run [FLAGS] -- CMD [ARGS...]"]


# --- the command -------------------------------------------------------------------------
def test_a_missing_command_is_127_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = run(capsys, "--", "no-such-command-fastgshare")
    assert status == EXIT_NOT_FOUND
    assert lines == ["fastgshare run: no-such-command-fastgshare: command not found"]


def test_a_file_that_cannot_be_run_is_126(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    if os.access(script, os.X_OK):
        pytest.skip("this user may execute any file (root)")
    status, lines = run(capsys, "--", str(script))
    assert (status, lines) == (EXIT_CANNOT_RUN, [f"fastgshare run: {script}: Permission denied"])


def test_commands_are_found_as_a_shell_finds_them(tmp_path: Path) -> None:
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    (tmp_path / "tool").chmod(0o755)
    assert resolve_command("tool", f"/nonexistent:{tmp_path}") == str(tmp_path / "tool")
    assert resolve_command(str(tmp_path), "").status == EXIT_CANNOT_RUN  # type: ignore[union-attr]
    assert resolve_command(str(tmp_path / "none"), "").status == EXIT_NOT_FOUND  # type: ignore[union-attr]


def test_the_exit_status_is_the_commands_and_128_plus_n_for_a_signal() -> None:
    assert exit_status(0) == 0
    assert exit_status(7) == 7
    assert exit_status(-signal.SIGKILL) == 137
    assert exit_status(-signal.SIGTERM) == 143


# --- CMD's environment -------------------------------------------------------------------
PLACES = RunPlaces(hook=Path("/repo/hook.so"), driver_dir=Path("/repo/simgpu/build"), socket=Path("/s/arbiter.sock"),
                   gpu_dir=Path("/s/gpu"))


def test_on_the_simulated_gpu_cmd_gets_the_hook_the_driver_and_the_gpu() -> None:
    share = ShareSpec(request_permille=200, limit_permille=500, sm_percent=40, memory_bytes=GIB)
    base = {"PATH": "/bin", "LD_PRELOAD": "/other.so", "LD_LIBRARY_PATH": "/lib", keys.ENV_POD: "stale/pod"}
    env = child_environment(base, PLACES, SIMULATED, "run/42", share)
    assert env["PATH"] == "/bin"
    assert env[keys.ENV_LD_PRELOAD] == "/repo/hook.so:/other.so"
    assert env["LD_LIBRARY_PATH"] == "/repo/simgpu/build:/lib"
    assert env[keys.ENV_ARBITER_SOCKET] == "/s/arbiter.sock"
    assert env[keys.ENV_POD] == "run/42"
    assert env[keys.ENV_GPU_UUID] == SIMULATED.uuid
    assert env[keys.ENV_FAKE_GPU_DIR] == "/s/gpu"
    assert env[keys.ENV_FAKE_GPU_MEMORY] == str(16 * GIB)
    assert env["FASTGSHARE_FAKE_GPU_SMS"] == "80"
    assert env[keys.ENV_MPS_THREAD_PERCENTAGE] == "40"


def test_on_a_real_gpu_cmd_keeps_the_real_driver_and_gets_no_partition_without_mps() -> None:
    share = ShareSpec(request_permille=200, limit_permille=500, sm_percent=40, memory_bytes=GIB)
    base = {keys.ENV_FAKE_GPU_DIR: "/old", keys.ENV_MPS_THREAD_PERCENTAGE: "10", "LD_LIBRARY_PATH": "/lib"}
    env = child_environment(base, PLACES, REAL_GPU, "run/42", share)
    assert env["LD_LIBRARY_PATH"] == "/lib"
    assert keys.ENV_FAKE_GPU_DIR not in env
    assert keys.ENV_MPS_THREAD_PERCENTAGE not in env
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1234"
    assert env[keys.ENV_GPU_UUID] == "GPU-1234"
    with_mps = child_environment(base, PLACES, attrs.evolve(REAL_GPU, mps=True), "run/42", share)
    assert with_mps[keys.ENV_MPS_THREAD_PERCENTAGE] == "40"


# --- the GPU -----------------------------------------------------------------------------
class _NvmlError(Exception):
    pass


def fake_nvml(*, devices: int = 1) -> SimpleNamespace:
    def handle(index: int) -> int:
        if index >= devices:
            raise _NvmlError("invalid argument")
        return index

    return SimpleNamespace(
        NVMLError=_NvmlError, nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetHandleByUUID=lambda uuid: 0, nvmlDeviceGetUUID=lambda h: b"GPU-abc",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * GIB),
        nvmlDeviceGetAttributes_v2=lambda h: SimpleNamespace(multiprocessorCount=132))


def test_without_gpu_the_real_gpu_is_chosen_where_nvml_finds_one() -> None:
    gpu = choose_gpu(None, {}, fake_nvml())  # type: ignore[arg-type]
    assert (gpu.spec, gpu.simulated, gpu.uuid, gpu.memory_bytes, gpu.sm_count) == ("real", False, "GPU-abc", 80 * GIB,
                                                                                   132)


def test_without_an_nvidia_gpu_the_default_is_the_simulated_one() -> None:
    gpu = choose_gpu(None, {}, fake_nvml(devices=0))  # type: ignore[arg-type]
    assert gpu == simulated_gpu("1x16GiB:80sm")
    assert (gpu.memory_bytes, gpu.sm_count, gpu.mps) == (16 * GIB, 80, True)
    assert not simulated_gpu("1x8Gi:40sm:nomps").mps


def test_gpu_real_without_an_nvidia_gpu_says_why() -> None:
    with pytest.raises(GpuChoiceError, match="no NVIDIA GPU through NVML"):
        choose_gpu("real", {}, fake_nvml(devices=0))  # type: ignore[arg-type]


def test_the_real_gpu_is_the_first_cuda_visible_device() -> None:
    gpu = choose_gpu("real", {"CUDA_VISIBLE_DEVICES": "1,0"}, fake_nvml(devices=2))  # type: ignore[arg-type]
    assert gpu.uuid == "GPU-abc"
    with pytest.raises(GpuChoiceError, match="CUDA_VISIBLE_DEVICES"):
        choose_gpu("real", {"CUDA_VISIBLE_DEVICES": "MIG-1/2/3"}, fake_nvml())  # type: ignore[arg-type]


# --- what it got -------------------------------------------------------------------------
SHARE = ShareSpec(request_permille=300, limit_permille=300, sm_percent=100, memory_bytes=GIB)


def test_the_json_summary_has_every_field_and_the_share_is_gpu_time_over_wall_time() -> None:
    totals = RunTotals(busy_ns=900_000_000, kernels=900, memory_bytes=0, peak_memory_bytes=64 << 20)
    arbiter = ArbiterTotals(used_s=0.93, tokens=300, waited_s=2.0, throttled_s=1.5)
    summary = run_summary(share=SHARE, gpu=SIMULATED, totals=totals, arbiter=arbiter, wall_s=3.0, exit_code=0,
                          pod="run/1")
    assert set(summary) >= SUMMARY_KEYS
    assert summary["achievedShare"] == pytest.approx(0.3)  # the simulated GPU's own measure
    assert summary["arbiterShare"] == pytest.approx(0.31)  # what the hook reported
    assert (summary["throttledSeconds"], summary["waitedSeconds"], summary["tokens"]) == (1.5, 2.0, 300)
    assert (summary["kernels"], summary["peakMemoryBytes"], summary["exitCode"]) == (900, 64 << 20, 0)
    assert (summary["request"], summary["limit"], summary["sm"], summary["memoryLimitBytes"]) == (0.3, 0.3, 100, GIB)
    assert (summary["gpu"], summary["wallSeconds"]) == ("1x16GiB:80sm", 3.0)
    line = summary_line(summary)
    assert line == ("fastgshare run: exit 0 after 3.00 s; achieved share 0.300 of the GPU (request 0.3, limit 0.3, "
                    "100 % SM); the arbiter counted 0.310; 900 kernels; throttled 1.50 s; peak memory 64 MiB of 1 GiB; "
                    "simulated GPU 1x16GiB:80sm")


def test_on_a_real_gpu_the_share_is_what_the_hooks_reported_and_kernels_are_not_counted() -> None:
    ledger = RunTotals(busy_ns=None, kernels=None, memory_bytes=0, peak_memory_bytes=GIB)
    arbiter = ArbiterTotals(used_s=0.6, tokens=40, waited_s=1.0, throttled_s=0.75)
    totals = with_arbiter_time(ledger, arbiter)
    summary = run_summary(share=SHARE, gpu=REAL_GPU, totals=totals, arbiter=arbiter, wall_s=2.0, exit_code=137,
                          pod="run/1")
    assert (summary["achievedShare"], summary["arbiterShare"], summary["gpuSeconds"]) == (0.3, 0.3, 0.6)
    assert (summary["kernels"], summary["throttledSeconds"], summary["gpu"]) == (None, 0.75, "real")
    line = summary_line(summary)
    assert "achieved share 0.300 of the GPU, as its hooks reported it (request 0.3" in line
    assert "kernels not counted; throttled 0.75 s" in line
    assert "the arbiter counted" not in line  # it is the achieved share


def test_without_the_arbiters_usage_file_what_is_not_measured_is_null_not_invented() -> None:
    totals = with_arbiter_time(RunTotals(busy_ns=None, kernels=None, memory_bytes=0, peak_memory_bytes=GIB), None)
    summary = run_summary(share=SHARE, gpu=REAL_GPU, totals=totals, arbiter=None, wall_s=2.0, exit_code=0, pod="run/1")
    assert [summary[key] for key in ("achievedShare", "gpuSeconds", "arbiterShare", "kernels", "throttledSeconds",
                                     "waitedSeconds", "tokens")] == [None] * 7
    line = summary_line(summary)
    assert "achieved share not measured" in line
    assert "throttled" not in line


def test_the_status_line_shows_the_share_so_far() -> None:
    totals = RunTotals(busy_ns=600_000_000, kernels=12, memory_bytes=GIB, peak_memory_bytes=GIB)
    assert status_line(2.0, totals, SHARE) == ("fastgshare run 0:02 | share 0.30 (limit 0.3) | 12 kernels | "
                                               "memory 1 GiB (peak 1 GiB) of 1 GiB")


def test_a_runs_processes_are_cmd_its_descendants_and_those_carrying_its_pod(tmp_path: Path) -> None:
    def process(pid: int, ppid: int, env: dict[str, str]) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (a (weird) name) S {ppid} 1 1 0")
        (tmp_path / str(pid) / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))

    process(10, 1, {})
    process(11, 10, {})  # CMD's child
    process(12, 11, {})  # its grandchild
    process(20, 1, {keys.ENV_POD: "run/5"})  # a daemon that left the tree
    process(30, 1, {keys.ENV_POD: "run/6"})  # another run's
    ours = RunProcesses(10, "run/5", proc=tmp_path)
    assert [pid for pid in (10, 11, 12, 20, 30, 99) if ours(pid)] == [10, 11, 12, 20]
    assert ours.tree() == {10, 11, 12}


# --- the shared state directory ------------------------------------------------------------
def test_the_state_directory_is_the_users_own(tmp_path: Path) -> None:
    assert default_state_dir({STATE_DIR_ENV: "/x/y"}) == Path("/x/y")
    assert default_state_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "fastgshare-run"
    assert default_state_dir({"XDG_RUNTIME_DIR": str(tmp_path / "none")}) == Path(f"/tmp/fastgshare-run-{os.getuid()}")
    assert default_state_dir({}) == Path(f"/tmp/fastgshare-run-{os.getuid()}")


def test_a_state_directory_others_may_enter_is_made_private(tmp_path: Path) -> None:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o755)
    RunSession(directory, lambda sock, shares, usage: [])._prepare()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


def test_a_state_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(SessionError, match="not a directory"):
        RunSession(tmp_path / "link", lambda sock, shares, usage: [])._prepare()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_a_state_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    os.chown(directory, 12345, 12345)
    with pytest.raises(SessionError, match="belongs to user id 12345"):
        RunSession(directory, lambda sock, shares, usage: [])._prepare()


# --- the arbiter's usage file -------------------------------------------------------------
def usage_document(sequence: int, *pods: tuple[str, float, int, float, float]) -> dict[str, object]:
    return {"sequence": sequence, "pid": 1, "pods": [
        {"pod": pod, "gpu": "GPU-x", "usedSeconds": used, "tokens": tokens, "waitedSeconds": waited,
         "throttledSeconds": throttled} for pod, used, tokens, waited, throttled in pods]}


def test_a_pods_counters_in_the_usage_file() -> None:
    document = usage_document(4, ("run/1", 1.0, 10, 2.0, 1.5), ("run/2", 9.0, 90, 0, 0), ("run/1", 0.5, 5, 0, 0))
    assert pod_usage(document, "run/1") == (4, ArbiterTotals(1.5, 15, 2.0, 1.5))  # on two GPUs: summed
    assert pod_usage(document, "run/3") == (4, ArbiterTotals())  # not connected yet
    assert pod_usage({"sequence": 1, "pods": [{"pod": "run/1", "usedSeconds": "x"}]}, "run/1") is None
    assert pod_usage({"pods": []}, "run/1") is None
    assert pod_usage([], "run/1") is None


def test_the_account_counts_from_the_first_reading_and_each_new_arbiter_from_zero(tmp_path: Path) -> None:
    account = UsageAccount()
    assert account.total() is None
    first, second = tmp_path / "usage-1.json", tmp_path / "usage-2.json"
    account.feed(first, ArbiterTotals(5.0, 50, 1.0, 1.0), first_reading=True)  # a pod of this name before the run
    account.feed(first, ArbiterTotals(6.0, 60, 1.5, 1.25), first_reading=False)
    account.feed(second, ArbiterTotals(0.5, 5, 0.25, 0.0), first_reading=False)  # the arbiter was started again
    assert account.total() == ArbiterTotals(1.5, 15, 0.75, 0.25)


def test_the_meter_reads_the_run_and_asks_for_a_fresh_file_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "usage-1.json"
    path.write_text(json.dumps(usage_document(1, ("run/1", 0.25, 1, 0, 0))))
    asked: list[bool] = []

    def ask() -> bool:  # the arbiter writes its file on SIGUSR1
        asked.append(True)
        path.write_text(json.dumps(usage_document(3, ("run/1", 1.25, 9, 0.5, 0.25))))
        return True

    meter = ArbiterUsageMeter("run/1", lambda: path, ask)
    assert meter.sample() == ArbiterTotals()  # the baseline
    path.write_text(json.dumps(usage_document(2, ("run/1", 0.75, 5, 0, 0))))
    assert meter.sample() == ArbiterTotals(0.5, 4)
    assert meter.final(timeout_s=5) == ArbiterTotals(1.0, 8, 0.5, 0.25)
    assert asked == [True]


def test_without_a_usage_file_the_meter_knows_nothing(tmp_path: Path) -> None:
    meter = ArbiterUsageMeter("run/1", lambda: tmp_path / "usage-1.json", lambda: False)
    assert meter.sample() is None
    assert meter.final(timeout_s=5) is None
    assert ArbiterUsageMeter("run/1", lambda: None, lambda: False).final() is None
