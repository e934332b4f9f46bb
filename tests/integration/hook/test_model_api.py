"""The hook's model API (vgpu_hook/include/fastgshare_model.h) called from Python with ctypes.CDLL(None).

A probe process (``model_probe.py``) runs under the hook on the simulated GPU; a test-only model
store (``tests/integration/fake_fn/model_store.py``) exports a file's bytes and answers the pod ->
agent protocol. Checked: the request, the mapped bytes, the return codes and one-line messages of
each failure, that they are per thread, and the limits on the answer (length, time).
"""

from __future__ import annotations

import random
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from simgpu.state import read_state
from tests.integration.fake_fn.model_store import Exporter, ModelServer
from tests.integration.hook.tenants import Build, tenant_env
from tests.probe_process import ProbeProcess

PROBE = Path(__file__).resolve().parent / "model_probe.py"
SIZE = (2 << 20) + 12345
OK, EINVAL, EAGENT, EPROTO, EREFUSED, EDRIVER = 0, 1, 2, 3, 4, 5


class Probe(ProbeProcess):
    def __init__(self, build: Build, gpu_dir: Path, socket_path: Path, **env: str) -> None:
        extra = {"FASTGSHARE_MODEL_SOCKET": str(socket_path), **env}
        super().__init__([sys.executable, str(PROBE)], tenant_env(build, gpu_dir, hook=True, extra=extra),
                         "model_probe")


@pytest.fixture
def probes(build: Build, gpu_dir: Path) -> Iterator[Callable[..., Probe]]:
    started: list[Probe] = []

    def start(socket_path: Path, **env: str) -> Probe:
        started.append(Probe(build, gpu_dir, socket_path, **env))
        return started[-1]

    yield start
    for probe in started:
        if probe.process.poll() is None:
            probe.process.kill()
        probe.process.communicate()


@pytest.fixture
def servers() -> Iterator[list[ModelServer]]:
    started: list[ModelServer] = []
    yield started
    for server in started:
        server.close()
        if server.exporter is not None:
            server.exporter.stop()


def test_open_maps_the_stores_bytes_and_close_unmaps(build: Build, gpu_dir: Path, short_tmp: Path,
                                                     probes: Callable[..., Probe],
                                                     servers: list[ModelServer]) -> None:
    data = random.Random(41).randbytes(SIZE)
    (short_tmp / "w.bin").write_bytes(data)
    exporter = Exporter(build.fake_dir / "libcuda.so.1", gpu_dir, short_tmp / "w.bin")
    servers.append(server := ModelServer(short_tmp / "model.sock", exporter, "ns/fn/w"))
    probe = probes(server.path)
    assert probe("error") == {"error": ""}, "no failure yet"

    no_driver = probe("open")
    assert no_driver["code"] == EDRIVER
    assert no_driver["error"] == ("model ns/fn/w: cuIpcOpenMemHandle_v2 failed: CUDA_ERROR_NOT_INITIALIZED (3): the "
                                  "CUDA driver is not initialised in this process (call cuInit and make a context "
                                  "current first)")
    assert probe("init") == {"result": 0}
    no_context = probe("open")
    assert no_context["code"] == EDRIVER
    assert no_context["error"].startswith("model ns/fn/w: cuIpcOpenMemHandle_v2 failed: "
                                          "CUDA_ERROR_INVALID_CONTEXT (201): no current context on this thread")
    assert probe("context") == {"result": 0}
    opened = probe("open")  # NULL: the pod's model
    assert opened["code"] == OK, opened
    assert opened["bytes"] == SIZE
    assert opened["error"] == ""
    assert server.requests == [{"op": "open", "model": ""}] * 3
    for offset in (0, (2 << 20) - 100, SIZE - 4096):
        read = probe("read", ptr=opened["ptr"], offset=offset, size=4096)
        assert read == {"result": 0, "data": data[offset:offset + 4096].hex()}
    again = probe("open", name="w")
    assert again["code"] == OK
    assert again["ptr"] == opened["ptr"], "opened again: the same mapping"
    assert server.requests[-1] == {"op": "open", "model": "w"}

    state = read_state(gpu_dir)
    assert state.by_pid(probe.pid).mem_used == 0, "the importer holds none of the weights"
    assert state.mem_used == SIZE

    assert probe("close", ptr=opened["ptr"]) == {"code": OK, "error": ""}
    assert probe("close", ptr=opened["ptr"]) == {"code": OK, "error": ""}
    closed = probe("close", ptr=opened["ptr"])
    assert closed["code"] == EDRIVER
    assert closed["error"].startswith(f"fastgshare_model_close(0x{opened['ptr']:x}): cuIpcCloseMemHandle failed: "
                                      "CUDA_ERROR_INVALID_VALUE (1) (not a mapping of fastgshare_model_open")


def test_failures_are_one_line_each_and_per_thread(short_tmp: Path, probes: Callable[..., Probe]) -> None:
    missing = short_tmp / "none.sock"
    probe = probes(missing)
    failed = probe("open", name="w")
    expected = (f"model socket {missing}: No such file or directory (no such socket: is the node agent running "
                "with the model store? FASTGSHARE_MODEL_SOCKET names it)")
    assert failed == {"code": EAGENT, "ptr": 0, "bytes": 0, "error": expected}
    threaded = probe("open_on_a_thread", null_ptr=True)
    assert threaded["thread"]["code"] == EINVAL
    assert threaded["thread"]["error"] == "fastgshare_model_open: ptr and bytes must not be NULL"
    assert threaded["error_here"] == expected, "another thread's failure is not this thread's"

    refused_at = short_tmp / "refused.sock"
    with socket.socket(socket.AF_UNIX) as closed:
        closed.bind(str(refused_at))  # bound, never listening: connection refused
        assert probes(refused_at)("open")["error"] == (
            f"model socket {refused_at}: Connection refused (is the node agent running with the model store?)")


@pytest.mark.parametrize(("answer", "code", "message"), [
    ({"ok": False, "error": "model \"x\" is not this pod's (its FaSTFunc declares \"w\")\nsecond line"}, EREFUSED,
     'node agent: model "x" is not this pod\'s (its FaSTFunc declares "w") second line'),
    ({"ok": False}, EREFUSED, "node agent: refused the model without a reason"),
    ("x" * 5000 + "\n", EPROTO, "model socket {path}: the answer is longer than 4096 bytes"),
    ({"ok": True, "bytes": 1}, EPROTO,
     'model socket {path}: malformed answer ("ok": true without "handle" and "bytes"): {{"ok": true, "bytes": 1}}'),
    ({"ok": True, "handle": "AB" * 64, "bytes": 1}, EPROTO,
     'model socket {path}: malformed answer ("handle" is not 128 lowercase hex digits)'),
    ({"ok": True, "handle": "ab" * 64, "bytes": -1}, EPROTO,
     'model socket {path}: malformed answer ("bytes" is not a whole number)'),
    ('{"ok": true} trailing\n', EPROTO, 'model socket {path}: malformed answer (text after the object)'),
    ("", EAGENT, "model socket {path}: the node agent closed the connection without an answer"),
])
def test_bad_and_refusing_answers(short_tmp: Path, probes: Callable[..., Probe], servers: list[ModelServer],
                                  answer: dict[str, Any] | str, code: int, message: str) -> None:
    servers.append(server := ModelServer(short_tmp / "model.sock", None, answer=answer))
    failed = probe_open(probes(server.path))
    assert failed["code"] == code
    assert failed["error"].startswith(message.format(path=server.path)), failed["error"]


def probe_open(probe: Probe) -> dict[str, Any]:
    probe("context")
    return probe("open", name="x")


def test_no_answer_in_time_and_a_bad_timeout_setting(short_tmp: Path, probes: Callable[..., Probe]) -> None:
    path = short_tmp / "silent.sock"
    with socket.socket(socket.AF_UNIX) as silent:
        silent.bind(str(path))
        silent.listen(4)  # connections complete in the backlog; nobody ever answers
        failed = probes(path, FASTGSHARE_MODEL_TIMEOUT_MS="200")("open")
        assert failed["code"] == EAGENT
        assert failed["error"].startswith(f"model socket {path}: no answer within 200 ms (FASTGSHARE_MODEL_TIMEOUT_MS")
        bad = probes(path, FASTGSHARE_MODEL_TIMEOUT_MS="soon")("open")
        assert bad["code"] == EINVAL
        assert bad["error"] == "FASTGSHARE_MODEL_TIMEOUT_MS=soon: expected milliseconds, 1..600000"
