"""The call-count comparison itself: a program whose every call goes through the hook shows equal
counts, and one that calls the driver's own cuMemAlloc_v2 around the hook shows the difference.
Needs no NVIDIA package (programs/bypass.py uses ctypes only)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fastgshare_cli.sandbox import HookBuild, TenantSpec
from tests.nvidia.counts import counted_entry_points, read_counts
from tests.nvidia.harness import tier

SPEC = TenantSpec(name="bypass", request=0.5, limit=1.0, memory="64Mi")


def test_calls_through_the_hook_count_the_same_on_both_sides(hook_build: HookBuild) -> None:
    with tier(hook_build, [SPEC]) as gpu:
        outcome = gpu.run(SPEC, "bypass.py")
        assert outcome.exit_code == 0, (outcome.result, outcome.stderr)
        [counts] = gpu.counts(outcome)
        assert counts.hook == {"cuMemAlloc_v2": 1, "cuMemFree_v2": 1}


def test_a_call_around_the_hook_shows_as_a_difference(hook_build: HookBuild) -> None:
    with tier(hook_build, [SPEC]) as gpu:
        outcome = gpu.run(SPEC, "bypass.py", "--bypass")
        assert outcome.exit_code == 0, (outcome.result, outcome.stderr)
        counts = read_counts(gpu.hook_counts, gpu.served, outcome.pid)
        assert counts.mismatches() == {"cuMemAlloc_v2": (1, 2)}  # the driver served one the hook never saw
        with pytest.raises(AssertionError, match="cuMemAlloc_v2 forwarded by the hook 1, served by the driver 2"):
            gpu.counts(outcome)


def test_every_forward_of_a_counted_entry_point_is_counted() -> None:
    """The hook's sources call the driver's allocation, free and launch functions only through
    FGS_FORWARD (vgpu_hook/src/counts.h), so none reaches the driver uncounted."""
    sources = Path(__file__).parents[2] / "vgpu_hook" / "src"
    names = "|".join(sorted(counted_entry_points()))
    uncounted = [f"{path.name}: {match[0]}" for path in sorted(sources.glob("*.c"))
                 for match in re.finditer(rf"fgs_real\.({names})\s*\(", path.read_text())]
    assert not uncounted, f"driver calls not through FGS_FORWARD: {uncounted}"
