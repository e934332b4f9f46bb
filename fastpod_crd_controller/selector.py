"""Label selectors as FaSTPods write them (``matchLabels``, ``matchExpressions``).

Parsed into a value that matches label sets and prints the string form the API uses in
``/scale`` (``status.selector``), which the HorizontalPodAutoscaler and ``kubectl`` parse back:
requirements sorted by key, ``k=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from fastgshare.errors import FieldProblem

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}")
_LABEL_VALUE = re.compile(rf"({_NAME})?")
KEY_HELP = "a label key: an optional DNS prefix and '/', then up to 63 of [A-Za-z0-9-_.]"
VALUE_HELP = "a label value: empty, or up to 63 of [A-Za-z0-9-_.] starting and ending alphanumeric"


@attrs.frozen
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # NotIn: a missing key matches

    def __str__(self) -> str:
        values = ",".join(sorted(self.values))
        return {"Exists": self.key, "DoesNotExist": f"!{self.key}", "In": f"{self.key} in ({values})",
                "NotIn": f"{self.key} notin ({values})"}[self.operator]


@attrs.frozen
class LabelSelector:
    match_labels: Mapping[str, str] = attrs.field(factory=dict)
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return (all(labels.get(key) == value for key, value in self.match_labels.items())
                and all(requirement.matches(labels) for requirement in self.expressions))

    def __str__(self) -> str:
        parts = [(key, f"{key}={value}") for key, value in self.match_labels.items()]
        parts += [(requirement.key, str(requirement)) for requirement in self.expressions]
        return ",".join(text for _, text in sorted(parts))


def valid_label_key(key: object) -> bool:
    return isinstance(key, str) and len(key) <= 316 and _LABEL_KEY.fullmatch(key) is not None


def valid_label_value(value: object) -> bool:
    return isinstance(value, str) and _LABEL_VALUE.fullmatch(value) is not None


def parse_selector(raw: object, where: str, problems: list[FieldProblem]) -> LabelSelector:
    """The selector ``raw`` describes; anything wrong is appended to ``problems``."""
    found_before = len(problems)
    if not isinstance(raw, Mapping):
        problems.append(FieldProblem(where, raw, "must be a label selector (matchLabels, matchExpressions)"))
        return LabelSelector()
    labels = _match_labels(raw.get("matchLabels") or {}, f"{where}.matchLabels", problems)
    expressions = raw.get("matchExpressions") or []
    if not isinstance(expressions, list):
        problems.append(FieldProblem(f"{where}.matchExpressions", expressions, "must be a list"))
        expressions = []
    requirements = [_requirement(item, f"{where}.matchExpressions[{index}]", problems)
                    for index, item in enumerate(expressions)]
    selector = LabelSelector(labels, tuple(r for r in requirements if r is not None))
    if not selector.match_labels and not selector.expressions and len(problems) == found_before:
        problems.append(FieldProblem(where, raw, "must not be empty (it would select every pod in the "
                                     "namespace); omit spec.selector to use the default"))
    return selector


def _match_labels(raw: object, where: str, problems: list[FieldProblem]) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        problems.append(FieldProblem(where, raw, "must be a map of label keys to values"))
        return {}
    labels = {}
    for key, value in raw.items():
        if not valid_label_key(key):
            problems.append(FieldProblem(f"{where}[{key!r}]", key, f"is not {KEY_HELP}"))
        elif not valid_label_value(value):
            problems.append(FieldProblem(f"{where}[{key!r}]", value, f"{value!r} is not {VALUE_HELP}"))
        else:
            labels[key] = value
    return labels


def _requirement(raw: object, where: str, problems: list[FieldProblem]) -> Requirement | None:
    if not isinstance(raw, Mapping):
        problems.append(FieldProblem(where, raw, "must be {key, operator, values}"))
        return None
    key, operator, values = raw.get("key"), raw.get("operator"), raw.get("values") or []
    if not valid_label_key(key):
        problems.append(FieldProblem(f"{where}.key", key, f"{key!r} is not {KEY_HELP}"))
        return None
    if operator not in OPERATORS:
        problems.append(FieldProblem(f"{where}.operator", operator,
                                     f"{operator!r} is not one of {', '.join(OPERATORS)}"))
        return None
    if not isinstance(values, list) or not all(valid_label_value(v) for v in values):
        problems.append(FieldProblem(f"{where}.values", values, f"must be a list of label values ({VALUE_HELP})"))
        return None
    if (operator in ("In", "NotIn")) != bool(values):
        need = "must list at least one value" if operator in ("In", "NotIn") else "must be empty"
        problems.append(FieldProblem(f"{where}.values", values, f"{need} for operator {operator}"))
        return None
    return Requirement(str(key), str(operator), tuple(str(v) for v in values))
