"""Label selectors: matching, the string form /scale reports, and problems named by field."""

from __future__ import annotations

import pytest

from fastgshare.errors import FieldProblem
from fastpod_crd_controller.selector import parse_selector


def parse(raw: object) -> tuple[str, list[str]]:
    problems: list[FieldProblem] = []
    selector = parse_selector(raw, "spec.selector", problems)
    return str(selector), [str(p) for p in problems]


@pytest.mark.parametrize(("raw", "labels", "matches"), [
    ({"matchLabels": {"app": "web"}}, {"app": "web", "x": "y"}, True),
    ({"matchLabels": {"app": "web"}}, {"app": "api"}, False),
    ({"matchExpressions": [{"key": "t", "operator": "In", "values": ["a", "b"]}]}, {"t": "b"}, True),
    ({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]}, {}, True),
    ({"matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]}, {"t": "a"}, False),
    ({"matchExpressions": [{"key": "t", "operator": "Exists"}]}, {"t": ""}, True),
    ({"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]}, {"t": "x"}, False),
], ids=["labels", "labels-differ", "in", "notin-missing", "notin-present", "exists", "does-not-exist"])
def test_matching(raw: dict, labels: dict, matches: bool) -> None:
    problems: list[FieldProblem] = []
    assert parse_selector(raw, "s", problems).matches(labels) is matches
    assert problems == []


def test_the_string_form_is_sorted_by_key_as_the_api_prints_it() -> None:
    text, problems = parse({"matchLabels": {"b": "2", "a": "1"}, "matchExpressions": [
        {"key": "c", "operator": "NotIn", "values": ["z", "y"]}, {"key": "aa", "operator": "Exists"}]})
    assert (text, problems) == ("a=1,aa,b=2,c notin (y,z)", [])


@pytest.mark.parametrize(("raw", "expected"), [
    ({}, "spec.selector: must not be empty (it would select every pod in the namespace); omit spec.selector "
         "to use the default"),
    ({"matchLabels": {"app": "a b"}}, "spec.selector.matchLabels['app']: 'a b' is not a label value: empty, or up to "
                                      "63 of [A-Za-z0-9-_.] starting and ending alphanumeric"),
    ({"matchExpressions": [{"key": "t", "operator": "Matches"}]},
     "spec.selector.matchExpressions[0].operator: 'Matches' is not one of In, NotIn, Exists, DoesNotExist"),
    ({"matchExpressions": [{"key": "t", "operator": "In"}]},
     "spec.selector.matchExpressions[0].values: must list at least one value for operator In"),
    ({"matchExpressions": [{"key": "t", "operator": "Exists", "values": ["x"]}]},
     "spec.selector.matchExpressions[0].values: must be empty for operator Exists"),
], ids=["empty", "bad-value", "bad-operator", "in-without-values", "exists-with-values"])
def test_problems_name_the_field(raw: dict, expected: str) -> None:
    assert parse(raw)[1] == [expected]
