"""Function profiles: the document round-trips, a bad field is named, the SLO capacity follows the
load steps, and the two public formats import (tested on small files written in those formats)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastgshare.profile import (
    LoadStep,
    Profile,
    ProfileError,
    ProfilePoint,
    Slo,
    decode_profile,
    encode_profile,
    import_fast_profiler_csv,
    import_has_gpu_json,
    slo_capacity,
)

GiB = 2**30
SLO = Slo(percentile=95, latency_ms=69)


def step(rps: float, p95: float, *, achieved: float | None = None, errors: float = 0.0) -> LoadStep:
    return LoadStep(offered_rps=rps, achieved_rps=rps if achieved is None else achieved, p50_ms=p95 / 2, p95_ms=p95,
                    p99_ms=p95 * 1.2, error_rate=errors)


def measured(*steps: LoadStep) -> ProfilePoint:
    return ProfilePoint(quota_request=0.4, quota_limit=0.4, sm_partition=12, memory_bytes=2 * GiB,
                        max_rps=max(s.achieved_rps for s in steps), steps=steps)


points = st.builds(
    lambda q, sm, mem, rps, p95, steps: ProfilePoint(
        quota_request=q / 20, quota_limit=q / 20, sm_partition=sm, memory_bytes=mem, max_rps=rps, p95_ms=p95,
        steps=tuple(step(10 * (n + 1), p) for n, p in enumerate(steps))),
    st.integers(1, 20), st.integers(1, 100), st.integers(1, 2**40), st.floats(0, 1e4), st.one_of(
        st.none(), st.floats(0.1, 1e4)), st.lists(st.floats(0.1, 1e4), max_size=4))


@given(st.lists(points, max_size=5))
def test_the_document_round_trips(generated: list[ProfilePoint]) -> None:
    profile = Profile(function="resnet50", points=tuple(generated), slo=SLO, gpu_model="Tesla V100", source="fake-gpu",
                      measured_at="2026-12-01T10:00:00Z")
    assert decode_profile(encode_profile(profile)) == profile


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(version=2), "profile.version: 2 is not understood; allowed: 1"),
    (lambda d: d.pop("function"), "profile.function: must be a non-empty string, got None"),
    (lambda d: d["points"][0].update(smPartition=120), "profile.points[0]: point (quota 0.4, SM 120): smPartition "
                                                       "must be 1..100, got 120"),
    (lambda d: d["points"][0].update(maxRps="fast"), "profile.points[0].maxRps: must be a number, got 'fast'"),
    (lambda d: d["points"][0]["steps"][0].update(p95Ms=None), "profile.points[0].steps[0].p95Ms: is missing"),
    (lambda d: d.update(slo={"percentile": 90, "latencyMs": 69}), "slo.percentile: must be one of (50, 95, 99)"),
])
def test_a_bad_field_is_named(change: object, message: str) -> None:
    document = json.loads(encode_profile(Profile(function="resnet50", points=(measured(step(10, 30)),))))
    change(document)  # type: ignore[operator]
    with pytest.raises(ProfileError) as error:
        decode_profile(json.dumps(document))
    assert message in str(error.value)


def test_the_slo_capacity_is_interpolated_where_the_percentile_crosses_the_bound() -> None:
    # bound: (1 - 0.1) x 69 = 62.1 ms
    point = measured(step(10, 30), step(20, 50), step(30, 80), step(40, 200))
    assert slo_capacity(point, SLO) == pytest.approx(20 + (62.1 - 50) / (80 - 50) * 10)


def test_errors_or_a_slow_first_step_end_the_capacity() -> None:
    assert slo_capacity(measured(step(10, 30), step(20, 40, errors=0.01)), SLO) == 10
    assert slo_capacity(measured(step(10, 70), step(20, 80)), SLO) == 0
    assert slo_capacity(measured(step(10, 30), step(20, 40)), SLO) == 20  # never crossed: the last step


def test_a_point_without_steps_counts_its_saturation_figures() -> None:
    fast = ProfilePoint(quota_request=0.4, quota_limit=0.4, sm_partition=12, memory_bytes=GiB, max_rps=35.1,
                        p95_ms=41)
    slow = ProfilePoint(quota_request=0.2, quota_limit=0.2, sm_partition=6, memory_bytes=GiB, max_rps=13.5,
                        p95_ms=8300)
    unknown = ProfilePoint(quota_request=0.2, quota_limit=0.2, sm_partition=6, memory_bytes=GiB, max_rps=13.5)
    assert [slo_capacity(p, SLO) for p in (fast, slow, unknown)] == [35.1, 0, 0]


FAST_PROFILER_CSV = """namespace,trial_name,key,value,limitations,other_metrics
fast-gshare,resnet-1,qps,74.9,"{'GPU_QUOTA': '1.0', 'GPU_SM': '100', 'GPU_MEMORY': '2Gi', 'replicas': '1'}","{'p95': 21.0, 'error_rate': 0}"
fast-gshare,resnet-2,qps,35.1,"{""GPU_QUOTA"": ""0.4"", ""GPU_SM"": ""12"", ""GPU_MEMORY"": ""2147483648""}","{""p95"": 160}"
"""  # noqa: E501


def test_the_fast_gshare_profilers_trials_import() -> None:
    profile = import_fast_profiler_csv(FAST_PROFILER_CSV, function="resnet")
    assert [(p.key, p.max_rps, p.p95_ms, p.memory_bytes) for p in profile.points] == [
        ("q100-s100", 74.9, 21.0, 2 * GiB), ("q40-s12", 35.1, 160.0, 2 * GiB)]
    assert [slo_capacity(p, Slo(percentile=95, latency_ms=100)) for p in profile.points] == [74.9, 0]


def test_a_bad_trial_row_names_its_line() -> None:
    bad = FAST_PROFILER_CSV.replace("'GPU_MEMORY': '2Gi'", "'GPU_MEMORY': 'lots'")
    with pytest.raises(ProfileError, match=r"line 2: limitations\.GPU_MEMORY 'lots' is not a byte count"):
        import_fast_profiler_csv(bad, function="resnet")


def test_documents_too_long_or_too_deep_are_refused_in_one_line() -> None:
    with pytest.raises(ProfileError, match="profile: a text of 1048577 characters exceeds the limit of 1048576"):
        decode_profile(" " * (1024 * 1024 + 1))
    with pytest.raises(ProfileError, match="HAS-GPU profile: not valid JSON"):
        import_has_gpu_json("[" * 100_000 + "]" * 100_000, memory_bytes=GiB)


def test_a_has_gpu_latency_table_imports_with_derived_throughput() -> None:
    text = json.dumps({"model_name": "resnet50", "profiling_result": [
        {"batch": 1, "sm": 30, "quota": 40, "latency": 36.0}, {"batch": 4, "sm": 30, "quota": 100, "latency": 50.0}]})
    profile = import_has_gpu_json(text, memory_bytes=GiB)
    assert profile.function == "resnet50"
    assert [(p.key, p.batch, round(p.max_rps, 2), p.derived) for p in profile.points] == [
        ("q40-s30", 1, 27.78, True), ("q100-s30", 4, 80.0, True)]
    with pytest.raises(ProfileError, match=r"profiling_result\[0\].latency: must be > 0 ms"):
        import_has_gpu_json(text.replace("36.0", "0"), memory_bytes=GiB)
