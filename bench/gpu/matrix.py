"""The memory coverage matrix against the machine's own driver and NVML: every allocation path x
every way of reaching the driver (``python -m tests.integration.hook.memory_matrix --real --json``,
which first runs each cell without the hook so a path the driver lacks shows ``n/a``).

In the dry run the same matrix on the simulated GPU is the CI test
``tests/integration/hook/test_memory_matrix.py``; here only the command's imports and arguments
are checked (``--help``), and the part is skipped.
"""

from __future__ import annotations

import json
import subprocess

from bench.gpu.part import OK, JsonDict, PartContext, PartFailed, Progress, Skipped
from bench.gpu.target import python_path, scrubbed_environment

MODULE = "tests.integration.hook.memory_matrix"
TIMEOUT_S = 240


def matrix(ctx: PartContext, progress: Progress) -> JsonDict:
    env = {**scrubbed_environment(), "PYTHONPATH": python_path(ctx.repo)}
    if ctx.dry_run:
        done = subprocess.run([ctx.python, "-m", MODULE, "--help"], capture_output=True, text=True, cwd=ctx.repo,
                              env=env, timeout=120, check=False)
        if done.returncode != 0:
            raise PartFailed(f"python -m {MODULE} --help: exit {done.returncode}: {done.stderr.strip()[-600:]}")
        raise Skipped(f"the simulated GPU's matrix is tests/integration/hook/test_memory_matrix.py "
                      f"(python -m {MODULE} --help checked)")
    ctx.build.need("hook")
    try:
        done = subprocess.run([ctx.python, "-m", MODULE, "--real", "--json"], capture_output=True, text=True,
                              cwd=ctx.repo, env=env, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise PartFailed(f"the matrix did not finish within {TIMEOUT_S} s") from None
    try:
        found = json.loads(done.stdout)
    except ValueError:
        raise PartFailed(f"exit {done.returncode}: {done.stderr.strip()[-600:]}") from None
    table = found.get("table", [])
    return {"status": OK, "exit": done.returncode, "summary": table[-1] if table else None, **found}

