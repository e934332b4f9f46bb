"""The model-sharing benchmark's pure parts: its flags, the answer windows it checks, the printed
object. The bench itself runs processes and is not run here."""

from __future__ import annotations

import pytest

from bench import model_sharing
from bench.model_sharing import CaseResult, Settings, expected_model, parse_args, result
from simgpu.fake_fn import fnv1a64, window

MiB = 1 << 20


def test_defaults_and_flags() -> None:
    assert parse_args([]) == Settings(pods=4, weights_bytes=256 * MiB, own_bytes=64 * MiB)
    assert parse_args(["--pods", "2", "--weights-mib", "8", "--own-mib", "0"]) == Settings(2, 8 * MiB, 0)


@pytest.mark.parametrize(("argv", "line"), [
    (["--pods", "0"], "--pods: '0'; allowed: an integer 1..64"),
    (["--pods", "x"], "--pods: 'x'; allowed: an integer 1..64"),
    (["--weights-mib", "-1"], "--weights-mib: '-1'; allowed: an integer 1..8192"),
    (["--own-mib", "9000"], "--own-mib: '9000'; allowed: an integer 0..8192"),
    (["--pods", "64", "--weights-mib", "256"], "--pods × (--weights-mib + --own-mib): 20480 MiB without sharing; "
                                               "allowed: at most the simulated GPU's 16384 MiB"),
])
def test_a_bad_flag_is_one_line_naming_it(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(line)


def test_fnv1a64_known_values() -> None:
    assert fnv1a64(b"") == "cbf29ce484222325"
    assert fnv1a64(b"a") == "af63dc4c8601ec8c"


@pytest.mark.parametrize(("size", "seq", "expected"), [
    (1 << 20, 0, (0, 4096)),
    (1 << 20, 1, (65537 * 4096 % (1 << 20), 4096)),
    (10_000, 2, (8192, 1808)),  # the short tail
    (100, 5, (0, 100)),  # smaller than a window
])
def test_window(size: int, seq: int, expected: tuple[int, int]) -> None:
    assert window(size, seq) == expected


def test_expected_model_hashes_the_window_it_reads() -> None:
    data = bytes(range(256)) * 40
    model = expected_model(lambda offset, length: data[offset:offset + length], len(data), 2)
    assert model == {"name": "weights", "bytes": 10_240, "offset": 4096, "length": 4096,  # 2 × 65537 × 4096 % 10240
                     "fnv1a64": fnv1a64(data[4096:8192])}


def case(pool: int, correct: bool = True) -> CaseResult:
    return CaseResult(pool_used_bytes=pool, pods_own_bytes=pool, store_bytes=0, gpu_mem_per_pod_bytes=MiB,
                      ready_s=0.123, answers_checked=32, answers_correct=correct)


def test_result_carries_both_cases_and_the_saving() -> None:
    settings = Settings(pods=4, weights_bytes=256 * MiB, own_bytes=64 * MiB)
    printed = result(settings, case(512 * MiB), case(1280 * MiB))
    assert printed["saving_bytes"] == 768 * MiB
    assert printed["saving_percent"] == 60.0
    assert printed["answers_correct"] is True
    assert (printed["pods"], printed["weights_bytes"], printed["own_bytes_per_pod"]) == (4, 256 * MiB, 64 * MiB)
    assert printed["shared"]["pool_used_bytes"] == 512 * MiB
    assert printed["copies"]["ready_s"] == 0.12
    assert printed["requests_per_pod"] == model_sharing.REQUESTS_PER_POD


def test_one_wrong_answer_makes_the_run_incorrect() -> None:
    settings = Settings(pods=1, weights_bytes=MiB, own_bytes=0)
    assert result(settings, case(MiB), case(MiB, correct=False))["answers_correct"] is False
    assert result(settings, case(0), case(0))["saving_percent"] == 0.0
