"""The hook's one symbol list, ``vgpu_hook/src/hooked_symbols.def``, parsed for the tests."""

from __future__ import annotations

import re

import attrs

from tests.integration.hook.tenants import HOOK_DIR

DEF_FILE = HOOK_DIR / "src" / "hooked_symbols.def"


@attrs.frozen
class HookedSymbol:
    symbol: str  # the exported wrapper's name
    base: str | None  # the cuGetProcAddress name; None for NVML rows
    since: int = 0  # the CUDA version of this ABI
    per_thread: int = 0


def hooked_symbols() -> list[HookedSymbol]:
    """The FGS_WRAP and FGS_NVML rows, in file order (FGS_REAL rows are called, not exported)."""
    text = re.sub(r"/\*.*?\*/", "", DEF_FILE.read_text(), flags=re.DOTALL)
    rows = [HookedSymbol(m[1], m[2], int(m[3]), int(m[4]))
            for m in re.finditer(r"FGS_WRAP\(\s*(\w+),\s*(\w+),\s*(\d+),\s*([01]),\s*\w+\s*\)", text)]
    rows += [HookedSymbol(m[1], None) for m in re.finditer(r"FGS_NVML\(\s*(\w+),\s*\w+\s*\)", text)]
    unparsed = len(re.findall(r"^\s*FGS_(?:WRAP|NVML)\(", text, flags=re.MULTILINE)) - len(rows)
    assert unparsed == 0, f"{unparsed} rows of {DEF_FILE} do not parse"
    return rows


def exported_names() -> set[str]:
    """What the hook library must export: every wrapper, the dlsym and dlvsym overrides, and the model
    API a function calls to map its model's weights (vgpu_hook/include/fastgshare_model.h)."""
    return {row.symbol for row in hooked_symbols()} | {"dlsym", "dlvsym", "fastgshare_model_open",
                                                       "fastgshare_model_close", "fastgshare_model_error"}
