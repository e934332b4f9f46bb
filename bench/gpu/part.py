"""What a part of the GPU day gets (:class:`PartContext`), how it reports as it goes
(:class:`Progress`), and how it ends other than with numbers (:class:`NeedsGpu`, :class:`Skipped`).

A part runs in its own process (``run.py --part NAME``) so that a hang can be killed; the context
travels as a JSON file, the result comes back as the last line of the part's stdout, and what the
part recorded in its progress file comes back even when it was killed.

Statuses: ``ok`` (it measured), ``needs a GPU`` (the dry run: what needs NVIDIA's CUDA runtime
cannot run on the simulated GPU; the part ran the checks a CPU can run), ``skipped: <reason>``,
``failed: <reason>``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs

OK = "ok"
NEEDS_GPU = "needs a GPU"
JsonDict = dict[str, Any]


class NeedsGpu(Exception):  # an outcome, not an error
    """The part needs the CUDA runtime (a real GPU); ``checks`` are what it checked instead."""

    def __init__(self, why: str, checks: JsonDict) -> None:
        super().__init__(why)
        self.checks = checks


class Skipped(Exception):  # an outcome, not an error
    """The part does not apply here; the message says why, ``data`` what it found."""

    def __init__(self, why: str, data: JsonDict | None = None) -> None:
        super().__init__(why)
        self.data = data or {}


class PartFailed(Exception):
    """The part could not measure; the message is the reason (one line)."""


@attrs.frozen(kw_only=True)
class Build:
    """What the setup part built (paths as strings; None where it could not be built)."""

    hook: str | None = None
    tenant: str | None = None  # bench/gpu/tenant.c
    ctxmem: str | None = None  # bench/gpu/ctxmem.c
    ptx: str | None = None  # bench/gpu/kernels.cu, nvcc -ptx
    simgpu_tenant: str | None = None  # the simulated GPU's own tenant (the dry run's fallback)
    problems: dict[str, str] = attrs.field(factory=dict)  # what could not be built, and why

    def need(self, *names: str) -> None:
        """Raise :class:`PartFailed` naming the first of ``names`` that setup could not build."""
        for name in names:
            if getattr(self, name) is None:
                raise PartFailed(f"setup did not build {name}: {self.problems.get(name, 'setup did not run')}")


@attrs.frozen(kw_only=True)
class PartContext:
    """Everything a part needs, as one JSON file."""

    repo: Path
    workdir: Path  # short (unix socket paths), removed by run.py at the end
    dry_run: bool
    seconds: float  # per measured run
    python: str  # the interpreter with torch (the one run.py runs under)
    build: Build = attrs.field(factory=Build)
    mps_dir: Path | None = None  # part e: where the MPS daemon's pipe and log go (run.py stops it)

    def to_json(self) -> JsonDict:
        return {"repo": str(self.repo), "workdir": str(self.workdir), "dry_run": self.dry_run,
                "seconds": self.seconds, "python": self.python, "build": attrs.asdict(self.build),
                "mps_dir": str(self.mps_dir) if self.mps_dir else None}

    @classmethod
    def from_json(cls, data: JsonDict) -> PartContext:
        return cls(repo=Path(data["repo"]), workdir=Path(data["workdir"]), dry_run=bool(data["dry_run"]),
                   seconds=float(data["seconds"]), python=str(data["python"]), build=Build(**data["build"]),
                   mps_dir=Path(data["mps_dir"]) if data.get("mps_dir") else None)

    def scratch(self, name: str) -> Path:
        """A fresh directory under the workdir for one measurement."""
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path


@attrs.define
class Progress:
    """What a part has measured so far, rewritten to a file after every step (so a part killed at
    its timeout still reports what it finished)."""

    path: Path | None
    data: JsonDict = attrs.field(factory=dict)

    def put(self, key: str, value: object) -> None:
        self.data[key] = value
        if self.path is None:
            return
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(self.data))
        os.replace(partial, self.path)

    @staticmethod
    def read(path: Path) -> JsonDict:
        try:
            data: JsonDict = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return data


def one_line(text: str, limit: int = 400) -> str:
    """``text`` as one line for a status: a compiler's or make's error lines when it has any, else
    its last lines, joined by " / " and cut to ``limit`` characters."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() and not line.lower().startswith("make")]
    chosen = errors[:3] if errors else lines[-3:]
    joined = " / ".join(chosen)
    return joined if len(joined) <= limit else joined[: limit - 1] + "…"


def last_json_line(text: str) -> JsonDict | None:
    """The last line of ``text`` that is a JSON object (programs print their result last)."""
    for raw in reversed(text.strip().splitlines()):
        line = raw.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None
