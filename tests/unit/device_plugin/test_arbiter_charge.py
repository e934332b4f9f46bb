"""What the arbiter charges a returned token (issue 37 item 7, issue 42 item 4): at least the time
it was held, the client's report only above that and never more than the time since the grant;
and the engine's C stays free of undefined behaviour on any report (built with UBSan)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from device_plugin.arbiter.native import token_charge

MS = 1_000_000
INT64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("granted", "token", "now", "reported", "charged"), [
    (0, 20 * MS, 20 * MS, 0, 20 * MS),             # held to its end, reports nothing: the token
    (0, 20 * MS, 5 * MS, 0, 5 * MS),               # returned early: the time held
    (0, 20 * MS, 5 * MS, 3 * MS, 5 * MS),          # a report under the time held counts for nothing
    (0, 20 * MS, 900 * MS, 0, 20 * MS),            # returned long after it expired: held until it expired
    (0, 20 * MS, 900 * MS, 25 * MS, 25 * MS),      # an overrun: the report, above the token
    (0, 20 * MS, 24 * MS, 30 * MS, 24 * MS),       # ... never more than the time since the grant
    (0, 20 * MS, 24 * MS, U64_MAX, 24 * MS),       # whatever the report
    (10 * MS, 20 * MS, 5 * MS, 0, 0),              # a clock that went back
    (-INT64_MAX, 20 * MS, INT64_MAX, U64_MAX, 0),  # times no clock gives: no overflow
    (0, -5, 10 * MS, 0, 0),                         # a negative token
])
def test_the_charge(granted: int, token: int, now: int, reported: int, charged: int) -> None:
    assert token_charge(granted, token, now, reported) == charged


UBSAN_PROGRAM = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
i64, u64, p = ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p
lib.fgs_meter_new.restype = p
lib.fgs_meter_new.argtypes = [i64, ctypes.POINTER(i64), ctypes.c_int, ctypes.c_int]
lib.fgs_meter_join.restype = p
lib.fgs_meter_join.argtypes = [p, ctypes.c_int, ctypes.c_char_p]
lib.fgs_meter_used.argtypes = [p, p, i64, i64]
lib.fgs_meter_snapshot.argtypes = [p, i64, ctypes.POINTER(p), ctypes.POINTER(i64)]
lib.fgs_token_charge.restype = i64
lib.fgs_token_charge.argtypes = [i64, i64, i64, u64]
bounds = (i64 * 1)(1000)
meter = lib.fgs_meter_new(10**10, bounds, 1, 1)
pod = lib.fgs_meter_join(meter, 0, b"ns/a")
for start in (0, 10**9, 2**62, 2**63 - 10):
    for used in (1, 2**61, 2**62, 2**63 - 1):
        lib.fgs_meter_used(meter, pod, start, used)
pods, busy = p(), (i64 * 1)()
lib.fgs_meter_snapshot(meter, 2**62, ctypes.byref(pods), busy)
for args in ((0, 2**63 - 1, 2**63 - 1, 2**64 - 1), (-(2**63), 1, 2**63 - 1, 2**64 - 1), (2**63 - 1, 1, 0, 0)):
    lib.fgs_token_charge(*args)
print("clean")
"""


def test_huge_reports_are_free_of_undefined_behaviour_under_ubsan(tmp_path: Path) -> None:
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("no gcc to build the engine with UBSan")
    library = tmp_path / "engine-ubsan.so"
    sources = [str(ROOT / "arbiter_engine" / name) for name in ("engine.c", "policy.c", "meter.c")]
    subprocess.run([compiler, "-std=gnu11", "-O1", "-g", "-shared", "-fPIC", "-fsanitize=undefined",
                    "-fno-sanitize-recover=all", f"-I{ROOT / 'arbiter_engine'}", f"-I{ROOT / 'vgpu_hook' / 'include'}",
                    *sources, "-o", str(library), "-lpthread"], check=True, timeout=120)
    run = subprocess.run([sys.executable, "-c", UBSAN_PROGRAM, str(library)], check=False, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "clean"
