"""A test's probe process: a child that takes one JSON request a line on stdin and answers one JSON line
on stdout, its first line giving its ``pid`` (the IPC and model probes of the simulated-GPU, hook and
node-agent tests)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any


class ProbeProcess:
    """``argv`` started with ``env``; ``probe(op, **args)`` sends ``{"op": op, ...}`` and returns the answer."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], name: str) -> None:
        self.name = name
        self.process = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=dict(env))
        self.pid: int = self.answer()["pid"]

    def answer(self) -> dict[str, Any]:
        """The next answer line; an AssertionError with the exit status and stderr if the probe exited."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            assert self.process.stderr is not None
            raise AssertionError(f"{self.name} exited ({self.process.wait(timeout=30)}): {self.process.stderr.read()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def __call__(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()
        return self.answer()
