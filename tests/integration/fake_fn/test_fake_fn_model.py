"""fake-fn's weights (FAKE_FN_MODEL, FAKE_FN_MODEL_FILE) under the hook on the simulated GPU.

FAKE_FN_MODEL maps a model through the hook's ``fastgshare_model_open`` from a test-only model store
(``model_store.py``: an exporter process holding a file's bytes, a server answering the pod ->
agent protocol); FAKE_FN_MODEL_FILE loads a copy of its own. Each answer's window of the weights
must hash like the file's; the simulated GPU's own accounting must count shared weights once.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from simgpu.state import read_state
from tests.integration.fake_fn.model_store import Exporter, ModelServer, expected_model
from tests.integration.fake_fn.server import FAKE_FN, FakeFn, fake_fn_env, start_fake_fn
from tests.integration.hook.fake_arbiter import FakeArbiter
from tests.integration.hook.tenants import Build

OWN = 1 << 20  # each fake-fn's own memory (FAKE_FN_MEMORY)
SIZE = 2_227_715  # past the simulated GPU's 2 MiB span; not a multiple of 4096: seq 2, 4, 6, 8 read the short tail
KEY = "default/fn/weights"


@pytest.fixture
def weights(short_tmp: Path) -> tuple[Path, bytes]:
    data = random.Random(40).randbytes(SIZE)
    path = short_tmp / "weights.bin"
    path.write_bytes(data)
    return path, data


@pytest.fixture
def store(build: Build, gpu_dir: Path, short_tmp: Path) -> Iterator[Callable[..., ModelServer]]:
    """Starts model servers (with an exporter of ``weights`` unless told not to); stops them after."""
    servers: list[ModelServer] = []
    exporters: list[Exporter] = []

    def start(weights_path: Path | None = None, answer: dict[str, Any] | str | None = None) -> ModelServer:
        exporter = None
        if weights_path is not None:
            exporter = Exporter(build.fake_dir / "libcuda.so.1", gpu_dir, weights_path)
            exporters.append(exporter)
        server = ModelServer(short_tmp / f"model-{len(servers)}.sock", exporter, KEY, answer)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()
    for exporter in exporters:
        exporter.stop()


@pytest.fixture
def fake_fns() -> Iterator[list[FakeFn]]:
    started: list[FakeFn] = []
    yield started
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.communicate()


def model_env(build: Build, gpu_dir: Path, arbiter: FakeArbiter, socket_path: Path, **settings: str) -> dict[str, str]:
    env = fake_fn_env(build, gpu_dir, arbiter=arbiter, settings={"FAKE_FN_GPU_MS": "0", **settings})
    env["FASTGSHARE_MODEL_SOCKET"] = str(socket_path)
    return env


def check_answers(server: FakeFn, data: bytes, name: str, count: int) -> None:
    for _ in range(count):
        answer = server.request(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.status == 200, answer.body
        body = answer.json()
        assert body["model"] == expected_model(data, name, body["seq"])


def test_shared_weights_match_the_file_and_are_counted_once(build: Build, gpu_dir: Path, arbiter: FakeArbiter,
                                                            store: Callable[..., ModelServer],
                                                            weights: tuple[Path, bytes],
                                                            fake_fns: list[FakeFn]) -> None:
    path, data = weights
    server = store(path)
    assert server.exporter is not None
    for _ in range(2):
        fake_fns.append(start_fake_fn(model_env(build, gpu_dir, arbiter, server.path, FAKE_FN_MODEL="weights",
                                                FAKE_FN_MEMORY=str(OWN))))
    assert server.requests == [{"op": "open", "model": "weights"}] * 2
    for fn in fake_fns:
        assert fn.ready["model"] == {"name": "weights", "bytes": SIZE, "shared": True}
        check_answers(fn, data, "weights", 12)

    state = read_state(gpu_dir)
    assert state.mem_used == SIZE + 2 * OWN, "the weights once, plus each fake-fn's own memory"
    assert state.by_pid(server.exporter.pid).mem_used == SIZE
    assert [state.by_pid(fn.pid).mem_used for fn in fake_fns] == [OWN, OWN]
    assert arbiter.memory_used == 2 * OWN, "the pods are charged their own memory, not the weights"
    for fn in fake_fns:
        assert fn.stop()[0] == 0


def test_a_copy_of_its_own_from_the_file(build: Build, gpu_dir: Path, arbiter: FakeArbiter, short_tmp: Path,
                                         weights: tuple[Path, bytes], fake_fns: list[FakeFn]) -> None:
    path, data = weights
    env = model_env(build, gpu_dir, arbiter, short_tmp / "none.sock", FAKE_FN_MODEL_FILE=str(path),
                    FAKE_FN_MEMORY=str(OWN))
    fake_fns.append(fn := start_fake_fn(env))
    assert fn.ready["model"] == {"name": "weights.bin", "bytes": SIZE, "shared": False}
    check_answers(fn, data, "weights.bin", 12)
    state = read_state(gpu_dir)
    assert state.by_pid(fn.pid).mem_used == SIZE + OWN
    assert state.mem_used == SIZE + OWN
    assert arbiter.memory_used == SIZE + OWN, "its own copy is charged to the pod"

    # FAKE_FN_MODEL names it; the file still wins over the store
    env["FAKE_FN_MODEL"] = "weights"
    fake_fns.append(named := start_fake_fn(env))
    assert named.ready["model"] == {"name": "weights", "bytes": SIZE, "shared": False}
    check_answers(named, data, "weights", 3)
    assert read_state(gpu_dir).mem_used == 2 * (SIZE + OWN)


def run_to_exit(env: dict[str, str]) -> tuple[int, list[str]]:
    """Runs fake-fn expecting it to fail before it is ready: its exit status and stderr lines."""
    result = subprocess.run([str(FAKE_FN)], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert result.stdout == "", "not ready, never listening"
    return result.returncode, result.stderr.splitlines()


@pytest.mark.parametrize(("answer", "expected"), [
    ({"ok": False, "error": "pod default/fn-1 declares no model (spec.model of its FaSTFunc)"},
     "fastgshare_model_open failed (4): node agent: pod default/fn-1 declares no model (spec.model of its FaSTFunc)"),
    ("not json\n", "fastgshare_model_open failed (3): model socket {socket}: malformed answer (not a JSON object)"),
    ({"ok": True, "handle": "ab" * 64, "bytes": 4096, "model": KEY},
     "fastgshare_model_open failed (5): model default/fn/weights: cuIpcOpenMemHandle_v2 failed: "
     "CUDA_ERROR_INVALID_VALUE (1): the handle is not valid here"),
])
def test_a_failed_open_is_one_line_and_exit_1(build: Build, gpu_dir: Path, arbiter: FakeArbiter,
                                              store: Callable[..., ModelServer], answer: dict[str, Any] | str,
                                              expected: str) -> None:
    server = store(None, answer)
    code, lines = run_to_exit(model_env(build, gpu_dir, arbiter, server.path, FAKE_FN_MODEL="weights"))
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith("fake-fn: FAKE_FN_MODEL=weights: " + expected.format(socket=server.path)), lines[0]
    assert server.requests == [{"op": "open", "model": "weights"}]


def test_no_model_socket_is_one_line_and_exit_1(build: Build, gpu_dir: Path, arbiter: FakeArbiter,
                                                short_tmp: Path) -> None:
    missing = short_tmp / "model.sock"
    code, lines = run_to_exit(model_env(build, gpu_dir, arbiter, missing, FAKE_FN_MODEL="weights"))
    assert code == 1
    assert lines == [f"fake-fn: FAKE_FN_MODEL=weights: fastgshare_model_open failed (2): model socket {missing}: "
                     "No such file or directory (no such socket: is the node agent running with the model store? "
                     "FASTGSHARE_MODEL_SOCKET names it)"]


def test_without_the_hook_the_missing_function_is_named(build: Build, gpu_dir: Path, short_tmp: Path) -> None:
    env = fake_fn_env(build, gpu_dir, hook=False, settings={"FAKE_FN_MODEL": "weights"})
    code, lines = run_to_exit(env)
    assert code == 1
    assert len(lines) == 1, lines
    assert "no fastgshare_model_open in this process" in lines[0], lines


@pytest.mark.parametrize(("content", "why"), [(None, "No such file or directory"), (b"", "the file is empty"),
                                              ("dir", "not a regular file")])
def test_a_model_file_it_cannot_load_is_one_line_and_exit_1(build: Build, gpu_dir: Path, arbiter: FakeArbiter,
                                                            short_tmp: Path, content: bytes | str | None,
                                                            why: str) -> None:
    path = short_tmp / "weights.bin"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    env = model_env(build, gpu_dir, arbiter, short_tmp / "none.sock", FAKE_FN_MODEL_FILE=str(path))
    assert run_to_exit(env) == (1, [f"fake-fn: FAKE_FN_MODEL_FILE={path}: {why}"])
