"""The share parser: every rule, every message, and all problems reported together."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastgshare import keys
from fastgshare.errors import FieldProblem, InvalidShareSpec
from fastgshare.share import ShareSpec, format_fraction, parse_share, share_annotations, unknown_annotations
from tests.builders import make_share
from tests.builders import share_annotations as annotations

VALID = [
    pytest.param(annotations(), (400, 800, 50, 2**30), id="typical"),
    pytest.param(annotations(request="0", limit="1"), (0, 1000, 50, 2**30), id="best-effort"),
    pytest.param(annotations(request="1", limit="1.0"), (1000, 1000, 50, 2**30), id="whole-gpu"),
    pytest.param(annotations(request=".25", limit=".5"), (250, 500, 50, 2**30), id="leading-dot"),
    pytest.param(annotations(request="0.4", limit="0.4"), (400, 400, 50, 2**30), id="request-equals-limit"),
    pytest.param(annotations(request="0", limit="0"), (0, 0, 50, 2**30), id="parked"),
    pytest.param(annotations(request="0.0", limit="0.000"), (0, 0, 50, 2**30), id="parked-spelled-long"),
    pytest.param(annotations(request="0.0004", limit="0.0005"), (1, 1, 50, 2**30), id="rounds-up-to-permille"),
    pytest.param(annotations(request="0.1234", limit="0.1235"), (124, 124, 50, 2**30), id="rounds-up-not-down"),
    pytest.param(annotations(sm=None), (400, 800, 100, 2**30), id="sm-defaults-to-100"),
    pytest.param(annotations(sm="1"), (400, 800, 1, 2**30), id="sm-min"),
    pytest.param(annotations(sm="100"), (400, 800, 100, 2**30), id="sm-max"),
    pytest.param(annotations(sm=" 30 "), (400, 800, 30, 2**30), id="surrounding-space"),
    pytest.param(annotations(mem="2700000000"), (400, 800, 50, 2_700_000_000), id="plain-bytes"),
    pytest.param(annotations(mem="1.5Gi"), (400, 800, 50, 3 * 2**29), id="binary-quantity"),
    pytest.param(annotations(mem="512Mi"), (400, 800, 50, 512 * 2**20), id="mebibytes"),
    pytest.param(annotations(mem="2G"), (400, 800, 50, 2 * 10**9), id="decimal-quantity"),
]


@pytest.mark.parametrize(("given_annotations", "expected"), VALID)
def test_valid_share_parses_to_integer_units(given_annotations: dict[str, str],
                                              expected: tuple[int, int, int, int]) -> None:
    share = parse_share(given_annotations)
    assert (share.request_permille, share.limit_permille, share.sm_percent, share.memory_bytes) == expected


INVALID = [
    pytest.param(annotations(request=None), keys.GPU_QUOTA_REQUEST,
                 "is required; allowed: a decimal fraction of GPU time, 0 <= request <= 1", id="request-missing"),
    pytest.param(annotations(limit=None), keys.GPU_QUOTA_LIMIT,
                 "is required; allowed: a decimal fraction of GPU time, request <= limit <= 1 (0 with request 0 parks "
                 "the pod", id="limit-missing"),
    pytest.param(annotations(mem=None), keys.GPU_MEM, "is required; allowed: a positive whole number of bytes",
                 id="memory-missing"),
    pytest.param(annotations(request="1.5", limit="1"), keys.GPU_QUOTA_REQUEST,
                 '"1.5" is out of range; allowed: a decimal fraction of GPU time, 0 <= request <= 1',
                 id="request-above-one"),
    pytest.param(annotations(request="-0.1"), keys.GPU_QUOTA_REQUEST,
                 '"-0.1" is negative; allowed: a decimal fraction', id="request-negative"),
    pytest.param(annotations(limit="-1"), keys.GPU_QUOTA_LIMIT, '"-1" is negative; allowed: a decimal fraction',
                 id="limit-negative"),
    pytest.param(annotations(sm="-5"), keys.GPU_SM_PARTITION, '"-5" is negative; allowed: an integer percent',
                 id="sm-negative"),
    pytest.param(annotations(request="40%"), keys.GPU_QUOTA_REQUEST, '"40%" is not a decimal number',
                 id="request-percent"),
    pytest.param(annotations(request="nan"), keys.GPU_QUOTA_REQUEST, '"nan" is not a decimal number',
                 id="request-nan"),
    pytest.param(annotations(request="1e-1"), keys.GPU_QUOTA_REQUEST, '"1e-1" is not a decimal number',
                 id="request-exponent"),
    pytest.param(annotations(request=""), keys.GPU_QUOTA_REQUEST, '"" is not a decimal number',
                 id="request-empty"),
    pytest.param(annotations(limit="1.01"), keys.GPU_QUOTA_LIMIT,
                 '"1.01" is out of range; allowed: a decimal fraction of GPU time, request <= limit <= 1',
                 id="limit-above-one"),
    pytest.param(annotations(request="0.4", limit="0"), keys.GPU_QUOTA_REQUEST,
                 f'request "0.4" is greater than {keys.GPU_QUOTA_LIMIT} "0"; allowed: request <= limit (a limit of 0 '
                 'parks the pod: request 0 too)', id="limit-zero-with-a-request"),
    pytest.param(annotations(request="0.9", limit="0.5"), keys.GPU_QUOTA_REQUEST,
                 f'request "0.9" is greater than {keys.GPU_QUOTA_LIMIT} "0.5"; allowed: request <= limit',
                 id="request-above-limit"),
    pytest.param(annotations(sm="0"), keys.GPU_SM_PARTITION,
                 '"0" is out of range; allowed: an integer percent of the SMs, 1..100', id="sm-zero"),
    pytest.param(annotations(sm="101"), keys.GPU_SM_PARTITION, '"101" is out of range', id="sm-above-100"),
    pytest.param(annotations(sm="50.5"), keys.GPU_SM_PARTITION,
                 '"50.5" is not an integer; allowed: an integer percent of the SMs, 1..100', id="sm-fraction"),
    pytest.param(annotations(sm=""), keys.GPU_SM_PARTITION, '"" is not an integer', id="sm-empty"),
    pytest.param(annotations(mem="0"), keys.GPU_MEM, '"0" is not a byte count; allowed: a positive whole number',
                 id="memory-zero"),
    pytest.param(annotations(mem="-5"), keys.GPU_MEM, '"-5" is negative; allowed: a positive whole number',
                 id="memory-negative"),
    pytest.param(annotations(mem="1.5"), keys.GPU_MEM, '"1.5" is not a byte count', id="memory-fractional-bytes"),
    pytest.param(annotations(mem="2GB"), keys.GPU_MEM, '"2GB" is not a byte count', id="memory-unknown-suffix"),
    pytest.param(annotations(mem="lots"), keys.GPU_MEM, '"lots" is not a byte count', id="memory-garbage"),
    pytest.param({**annotations(), keys.GPU_QUOTA_REQUEST: 0.4}, keys.GPU_QUOTA_REQUEST,
                 "0.4 is not a string (annotation values are quoted strings in YAML)", id="request-not-string"),
    pytest.param({**annotations(), keys.GPU_SM_PARTITION: 50}, keys.GPU_SM_PARTITION,
                 "50 is not a string", id="sm-not-string"),
]


@pytest.mark.parametrize(("given_annotations", "field", "message"), INVALID)
def test_invalid_share_names_annotation_value_and_range(given_annotations: dict[str, object], field: str,
                                                        message: str) -> None:
    with pytest.raises(InvalidShareSpec) as caught:
        parse_share(given_annotations)
    problems = [p for p in caught.value.problems if p.field == field]
    assert len(problems) == 1, caught.value.problems
    assert message in problems[0].message
    assert f"{field}: {problems[0].message}" in str(caught.value)


def test_all_problems_of_one_spec_are_reported_together() -> None:
    with pytest.raises(InvalidShareSpec) as caught:
        parse_share({keys.GPU_QUOTA_REQUEST: "2", keys.GPU_SM_PARTITION: "0"})
    assert [p.field for p in caught.value.problems] == [
        keys.GPU_QUOTA_REQUEST, keys.GPU_QUOTA_LIMIT, keys.GPU_SM_PARTITION, keys.GPU_MEM,
    ]
    assert str(caught.value).startswith("invalid GPU share: fastgshare/gpu_quota_request:")


def test_a_long_bad_value_is_shortened_in_the_message() -> None:
    with pytest.raises(InvalidShareSpec) as caught:
        parse_share(annotations(request="x" * 500))
    assert len(str(caught.value)) < 400


def test_unrelated_annotations_are_ignored() -> None:
    assert parse_share({**annotations(), "team": "vision", "fastgshare/other": "x"}) == parse_share(annotations())


def test_a_parked_share_holds_memory_and_no_time() -> None:
    parked = ShareSpec(request_permille=0, limit_permille=0, memory_bytes=2**30)
    assert parked.is_parked
    assert parked.is_best_effort
    assert parked.area == 0
    assert not ShareSpec(request_permille=0, limit_permille=1, memory_bytes=1).is_parked
    assert parse_share(share_annotations(parked)) == parked


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"request_permille": 500, "limit_permille": 400}, id="request-above-limit"),
        pytest.param({"request_permille": 1, "limit_permille": 0}, id="zero-limit-with-a-request"),
        pytest.param({"request_permille": 0, "limit_permille": 1001}, id="limit-above-window"),
        pytest.param({"request_permille": -1, "limit_permille": 10}, id="negative-request"),
        pytest.param({"request_permille": 1, "limit_permille": 10, "sm_percent": 0}, id="sm-zero"),
        pytest.param({"request_permille": 1, "limit_permille": 10, "memory_bytes": 0}, id="memory-zero"),
    ],
)
def test_share_value_object_keeps_its_invariants(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be"):
        ShareSpec(**{"memory_bytes": 1, **kwargs})


def test_best_effort_and_area() -> None:
    assert make_share(request=0, limit=500).is_best_effort
    assert make_share(request=0, limit=500).area == 0
    assert make_share(request=400, sm=12).area == 4800
    assert not make_share(request=1).is_best_effort


@pytest.mark.parametrize(("permille", "text"), [(0, "0"), (1, "0.001"), (400, "0.4"), (1000, "1"), (125, "0.125")])
def test_format_fraction(permille: int, text: str) -> None:
    assert format_fraction(permille) == text


def test_describe_is_readable() -> None:
    assert make_share(request=400, limit=1000, sm=12, mem=3 * 2**29).describe() == (
        "time 0.4..1 of the GPU, 12 % SM, 1.5 GiB")


@given(request=st.integers(0, 1000), extra=st.integers(0, 1000), sm=st.integers(1, 100),
       mem=st.integers(1, 2**50))
def test_annotations_round_trip(request: int, extra: int, sm: int, mem: int) -> None:
    share = ShareSpec(request_permille=request, limit_permille=max(1, min(1000, request + extra)),
                      sm_percent=sm, memory_bytes=mem)
    assert parse_share(share_annotations(share)) == share


@given(st.dictionaries(st.sampled_from([*keys.SHARE_ANNOTATIONS, "other"]),
                       st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.none(),
                                 st.lists(st.integers(), max_size=2))))
def test_fuzzed_annotations_raise_only_the_domain_error(raw: dict[str, object]) -> None:
    share, problems = _parse_or_problems(raw)
    if share is None:
        assert problems
        assert {problem.field for problem in problems} <= set(keys.SHARE_ANNOTATIONS)
    else:
        assert 0 <= share.request_permille <= share.limit_permille <= 1000


def _parse_or_problems(raw: dict[str, object]) -> tuple[ShareSpec | None, tuple[FieldProblem, ...]]:
    try:
        return parse_share(raw), ()
    except InvalidShareSpec as error:
        return None, error.problems


def test_a_missing_key_points_at_a_misspelt_one() -> None:
    """Issue 15, defect 6: a typo was reported only as the right key missing."""
    given = {**annotations(request=None), "fastgshare/gpu_quota_requests": "0.4"}
    with pytest.raises(InvalidShareSpec) as caught:
        parse_share(given)
    [problem] = caught.value.problems
    assert problem.message.endswith("; found fastgshare/gpu_quota_requests: a misspelling?")


def test_unknown_fastgshare_annotations_suggest_the_nearest_key() -> None:
    given = {**annotations(), "fastgshare/gpu_quota_requests": "0.4", "fastgshare/sm_partition": "5",
             "fastgshare/zzz": "1", keys.GPU_CONTAINERS_ANNOTATION: "a", "example.com/other": "x"}
    assert [str(problem) for problem in unknown_annotations(given)] == [
        "fastgshare/gpu_quota_requests: unknown annotation; did you mean fastgshare/gpu_quota_request?",
        "fastgshare/sm_partition: unknown annotation; did you mean fastgshare/gpu_sm_partition?",
        "fastgshare/zzz: unknown annotation; allowed: fastgshare/gpu_quota_request, fastgshare/gpu_quota_limit, "
        "fastgshare/gpu_sm_partition, fastgshare/gpu_mem, fastgshare/gpu_containers, "
        "fastgshare/scheduling_policy, fastgshare/model"]


HOSTILE = [
    pytest.param(annotations(sm="1" * 5000), keys.GPU_SM_PARTITION, "is 5000 characters long", id="sm-5000-digits"),
    pytest.param(annotations(mem="1" + "0" * 308), keys.GPU_MEM, "is 309 characters long", id="memory-1e308"),
    pytest.param(annotations(mem="9" * 60 + "Ti"), keys.GPU_MEM, "is out of range", id="memory-huge-with-suffix"),
    pytest.param(annotations(mem="1" * 10_000_000), keys.GPU_MEM, "is 10000000 characters long", id="memory-10MB"),
    pytest.param(annotations(mem="18446744073709551616"), keys.GPU_MEM, "is out of range", id="memory-2-to-the-64"),
    pytest.param(annotations(request="0." + "1" * 5000), keys.GPU_QUOTA_REQUEST, "is 5002 characters long",
                 id="request-5000-digits"),
    pytest.param(annotations(sm=" " * 10_000 + "5"), keys.GPU_SM_PARTITION, "is 10001 characters long",
                 id="sm-padded"),
]


@pytest.mark.parametrize(("given_annotations", "field", "message"), HOSTILE)
def test_hostile_values_are_refused_clearly(given_annotations: dict[str, str], field: str, message: str) -> None:
    """Issue 15, defect 9: these crashed the parser (ValueError, decimal.Overflow) or were accepted
    although the arbiter protocol's memory field is 64-bit."""
    with pytest.raises(InvalidShareSpec) as caught:
        parse_share(given_annotations)
    [problem] = [p for p in caught.value.problems if p.field == field]
    assert message in problem.message
    assert len(str(caught.value)) < 1000


def test_the_largest_memory_the_protocol_carries_is_accepted() -> None:
    assert parse_share(annotations(mem=str(2**64 - 1))).memory_bytes == 2**64 - 1
