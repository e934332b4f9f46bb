"""``fastgshare demo``'s checks before it runs anything."""

from __future__ import annotations

from fastgshare_cli.demo import DEFAULT_TENANTS, overcommit_warning, parse_tenant


def test_the_default_tenants_fit_one_gpu() -> None:
    assert overcommit_warning(DEFAULT_TENANTS) is None


def test_tenants_that_over_commit_the_gpu_are_warned_about() -> None:
    """Issue 15, defect 8: the demo ran over-committed tenants without a word."""
    tenants = [parse_tenant("a:0.7:0.8:60"), parse_tenant("b:0.6:0.7:60")]
    assert overcommit_warning(tenants) == (
        "warning: these tenants over-commit the GPU: b (0.6 of the time on 60 percent of the SMs) does not fit "
        "beside a, so the scheduler would not place them together and the arbiter cannot give every tenant "
        "its request")
