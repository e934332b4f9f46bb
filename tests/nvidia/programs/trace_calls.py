"""Which driver entry points a program called through cuda-bindings, and what each answered.

With ``FASTGSHARE_NVIDIA_TRACE=<file>`` set, :func:`install_from_env` replaces every ``cu*``
function of ``cuda.bindings.driver`` with one that counts the CUresult names it returns, and the
counts are written to the file at exit as ``{"cuMemAlloc": {"CUDA_SUCCESS": 10,
"CUDA_ERROR_OUT_OF_MEMORY": 1}, ...}``. numba-cuda looks its driver functions up on that module at
call time, so its calls are traced too. Imported as a sibling module by the scripts next to it.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cuda.bindings import driver

ENV_TRACE = "FASTGSHARE_NVIDIA_TRACE"


def _traced(name: str, function: Callable[..., Any], answers: dict[str, Counter[str]]) -> Callable[..., Any]:
    @functools.wraps(function)
    def traced(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        first = result[0] if isinstance(result, tuple) and result else result
        answers.setdefault(name, Counter())[getattr(first, "name", type(first).__name__)] += 1
        return result

    return traced


def install_from_env() -> None:
    """Trace every driver call of this process into $FASTGSHARE_NVIDIA_TRACE, if it is set."""
    path = os.environ.get(ENV_TRACE)
    if not path:
        return
    answers: dict[str, Counter[str]] = {}
    for name in dir(driver):
        function = getattr(driver, name)
        if name.startswith("cu") and callable(function) and not isinstance(function, type):
            setattr(driver, name, _traced(name, function, answers))
    atexit.register(lambda: Path(path).write_text(json.dumps(answers, sort_keys=True)))
