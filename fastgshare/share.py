"""The GPU share one pod asks for, parsed and validated from its annotations.

Users write four annotations (on a FaSTPod or a Pod), values as strings:

- ``fastgshare/gpu_quota_request``: guaranteed fraction of GPU time, ``0 <= request <= 1``;
- ``fastgshare/gpu_quota_limit``: cap on the fraction of GPU time, ``request <= limit <= 1``;
  a limit of 0 (so with a request of 0) *parks* the pod: it holds its GPU memory and gets no
  GPU time (:attr:`ShareSpec.is_parked`);
- ``fastgshare/gpu_sm_partition``: percent of the GPU's SMs, an integer ``1..100``,
  100 when absent;
- ``fastgshare/gpu_mem``: GPU memory limit, a positive byte count (required), at most
  ``2**64 - 1`` (the arbiter protocol's field is 64-bit).

Values longer than :data:`MAX_VALUE_CHARS` are refused before they are parsed: no valid value is
that long, and hostile ones (thousands of digits) must not reach ``int`` or ``Decimal``.

Inside, everything is an integer: time in permille of the scheduling window (fractions are
rounded *up*, so a pod never gets less than it asked for), SM in percent, memory in bytes.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal

import attrs

from fastgshare import keys
from fastgshare.errors import FieldProblem, InvalidShareSpec
from fastgshare.quantity import BYTES_HELP, format_bytes, parse_bytes

DEFAULT_SM_PERCENT = 100
MAX_VALUE_CHARS = 64
MAX_MEMORY_BYTES = 2**64 - 1  # the hook <-> arbiter protocol carries memory as a u64

_FRACTION = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")
_INTEGER = re.compile(r"[0-9]+")

# Every fastgshare/ annotation key: what users write, then what the components write for each other.
USER_KEYS = (*keys.SHARE_ANNOTATIONS, keys.GPU_CONTAINERS_ANNOTATION, keys.SCHEDULING_POLICY_ANNOTATION,
             keys.MODEL_ANNOTATION)
KNOWN_KEYS = frozenset((*USER_KEYS, *keys.SYSTEM_POD_ANNOTATIONS, *keys.SYSTEM_NODE_ANNOTATIONS))

_REQUEST_RANGE = 'a decimal fraction of GPU time, 0 <= request <= 1 (e.g. "0.4")'
_LIMIT_RANGE = 'a decimal fraction of GPU time, request <= limit <= 1 (0 with request 0 parks the pod; e.g. "0.8")'
_SM_RANGE = 'an integer percent of the SMs, 1..100 (e.g. "50")'


def _permille_in_range(
    instance: object, attribute: attrs.Attribute[int], value: int
) -> None:
    if not 0 <= value <= keys.TIME_UNITS:
        raise ValueError(f"{attribute.name} must be in 0..{keys.TIME_UNITS}, got {value}")


@attrs.frozen(kw_only=True)
class ShareSpec:
    """A validated share. Build it with :func:`parse_share`, or directly in code and tests.

    Invariants: ``0 <= request_permille <= limit_permille <= 1000`` (a limit of 0 only with a
    request of 0: a parked pod), ``1 <= sm_percent <= 100`` and ``memory_bytes > 0``.
    """

    request_permille: int = attrs.field(validator=_permille_in_range)
    limit_permille: int = attrs.field(validator=_permille_in_range)
    sm_percent: int = DEFAULT_SM_PERCENT
    memory_bytes: int

    def __attrs_post_init__(self) -> None:
        if self.request_permille > self.limit_permille:
            raise ValueError("request_permille must be <= limit_permille")
        if not 1 <= self.sm_percent <= keys.SM_UNITS:
            raise ValueError(f"sm_percent must be in 1..{keys.SM_UNITS}, got {self.sm_percent}")
        if not 0 < self.memory_bytes <= MAX_MEMORY_BYTES:
            raise ValueError(f"memory_bytes must be in 1..{MAX_MEMORY_BYTES}, got {self.memory_bytes}")

    @property
    def is_best_effort(self) -> bool:
        """A pod with no guaranteed time needs only memory and a slot to be placed."""
        return self.request_permille == 0

    @property
    def is_parked(self) -> bool:
        """A parked pod (request and limit 0): it holds its GPU memory and gets no GPU time."""
        return self.limit_permille == 0

    @property
    def area(self) -> int:
        """The pod's rectangle in the GPU's 1000 x 100 (time x SM) bin, in square units."""
        return self.request_permille * self.sm_percent

    def describe(self) -> str:
        """One line for logs and messages: ``time 0.4..1 of the GPU, 12 % SM, 1.5 GiB``."""
        return (
            f"time {format_fraction(self.request_permille)}..{format_fraction(self.limit_permille)}"
            f" of the GPU, {self.sm_percent} % SM, {format_bytes(self.memory_bytes)}"
        )


def format_fraction(permille: int) -> str:
    """Permille as the decimal fraction users write: 400 -> ``"0.4"``, 1000 -> ``"1"``."""
    text = str(Decimal(permille) / keys.TIME_UNITS)
    return text.rstrip("0").rstrip(".") if "." in text else text


def share_annotations(share: ShareSpec) -> dict[str, str]:
    """The annotations that :func:`parse_share` turns back into ``share``."""
    return {
        keys.GPU_QUOTA_REQUEST: format_fraction(share.request_permille),
        keys.GPU_QUOTA_LIMIT: format_fraction(share.limit_permille),
        keys.GPU_SM_PARTITION: str(share.sm_percent),
        keys.GPU_MEM: str(share.memory_bytes),
    }


def has_share_annotations(annotations: Mapping[str, object]) -> bool:
    """Whether any of the four share annotations is present."""
    return any(key in annotations for key in keys.SHARE_ANNOTATIONS)


def unknown_annotations(annotations: Mapping[str, object]) -> list[FieldProblem]:
    """A problem for every ``fastgshare/`` key that is not one of ours, naming the nearest known key."""
    problems = []
    for key in annotations:
        if not isinstance(key, str) or not key.startswith(keys.ANNOTATION_PREFIX) or key in KNOWN_KEYS:
            continue
        nearest = _nearest_key(key, USER_KEYS)
        hint = f"did you mean {nearest}?" if nearest else f"allowed: {', '.join(USER_KEYS)}"
        problems.append(FieldProblem(key, annotations[key], f"unknown annotation; {hint}"))
    return problems


def _nearest_key(key: str, candidates: tuple[str, ...] | list[str]) -> str | None:
    """The candidate most like ``key``, compared without the shared ``fastgshare/`` prefix."""
    def bare(name: str) -> str:
        return name.removeprefix(keys.ANNOTATION_PREFIX)

    by_bare = {bare(candidate): candidate for candidate in candidates}
    matches = difflib.get_close_matches(bare(key)[:100], list(by_bare), n=1, cutoff=0.75)
    return by_bare[matches[0]] if matches else None


def parse_share(annotations: Mapping[str, object]) -> ShareSpec:
    """Parse and validate the four share annotations.

    Raises :class:`InvalidShareSpec` listing every problem found (each names the
    annotation, the bad value and the allowed range); nothing else escapes.
    """
    problems: list[FieldProblem] = []
    request = _fraction(annotations, keys.GPU_QUOTA_REQUEST, _REQUEST_RANGE, problems)
    limit = _fraction(annotations, keys.GPU_QUOTA_LIMIT, _LIMIT_RANGE, problems)
    if request is not None and limit is not None and request > limit:  # a limit of 0 only parks (request 0)
        parks = " (a limit of 0 parks the pod: request 0 too)" if limit == 0 else ""
        problems.append(FieldProblem(
            keys.GPU_QUOTA_REQUEST, annotations[keys.GPU_QUOTA_REQUEST],
            f"request {_show(annotations[keys.GPU_QUOTA_REQUEST])} is greater than "
            f"{keys.GPU_QUOTA_LIMIT} {_show(annotations[keys.GPU_QUOTA_LIMIT])}; "
            f"allowed: request <= limit{parks}",
        ))
    sm = _sm_percent(annotations, problems)
    memory = _memory(annotations, problems)
    if problems or request is None or limit is None or sm is None or memory is None:
        raise InvalidShareSpec(problems)
    return ShareSpec(
        request_permille=_to_permille(request),
        limit_permille=_to_permille(limit),
        sm_percent=sm,
        memory_bytes=memory,
    )


def _show(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return text if len(text) <= 40 else text[:37] + '..."'


def _text_value(
    annotations: Mapping[str, object], key: str, allowed: str, problems: list[FieldProblem]
) -> str | None:
    """The annotation's string value, or ``None`` after recording why there is none."""
    if key not in annotations:
        unknown = [name for name in annotations if isinstance(name, str) and name.startswith(keys.ANNOTATION_PREFIX)
                   and name not in KNOWN_KEYS and _nearest_key(name, [key]) == key]
        hint = f"; found {unknown[0]}: a misspelling?" if unknown else ""
        problems.append(FieldProblem(key, None, f"is required; allowed: {allowed}{hint}"))
        return None
    value = annotations[key]
    if not isinstance(value, str):
        problems.append(FieldProblem(
            key, value, f"{_show(value)} is not a string (annotation values are quoted "
            f"strings in YAML); allowed: {allowed}"))
        return None
    if len(value) > MAX_VALUE_CHARS:
        problems.append(FieldProblem(key, value, f"{_show(value)} is {len(value)} characters long; allowed: "
                                                 f"{allowed}, at most {MAX_VALUE_CHARS} characters"))
        return None
    return value


def _fraction(
    annotations: Mapping[str, object], key: str, allowed: str, problems: list[FieldProblem]
) -> Decimal | None:
    text = _text_value(annotations, key, allowed, problems)
    if text is None:
        return None
    if not _FRACTION.fullmatch(text.strip()):
        what = "is negative" if _negative(text, _FRACTION.fullmatch) else "is not a decimal number"
        problems.append(FieldProblem(key, text, f"{_show(text)} {what}; allowed: {allowed}"))
        return None
    value = Decimal(text.strip())
    if value > 1:
        problems.append(FieldProblem(key, text, f"{_show(text)} is out of range; allowed: {allowed}"))
        return None
    return value


def _sm_percent(annotations: Mapping[str, object], problems: list[FieldProblem]) -> int | None:
    if keys.GPU_SM_PARTITION not in annotations:
        return DEFAULT_SM_PERCENT
    text = _text_value(annotations, keys.GPU_SM_PARTITION, _SM_RANGE, problems)
    if text is None:
        return None
    if not _INTEGER.fullmatch(text.strip()):
        what = "is negative" if _negative(text, _INTEGER.fullmatch) else "is not an integer"
        problems.append(FieldProblem(keys.GPU_SM_PARTITION, text, f"{_show(text)} {what}; allowed: {_SM_RANGE}"))
        return None
    value = int(text.strip())
    if not 1 <= value <= keys.SM_UNITS:
        problems.append(FieldProblem(keys.GPU_SM_PARTITION, text,
                                     f"{_show(text)} is out of range; allowed: {_SM_RANGE}"))
        return None
    return value


def _memory(annotations: Mapping[str, object], problems: list[FieldProblem]) -> int | None:
    text = _text_value(annotations, keys.GPU_MEM, BYTES_HELP, problems)
    if text is None:
        return None
    value = parse_bytes(text)
    if value is None:
        what = "is negative" if _negative(text, parse_bytes) else "is not a byte count"
        problems.append(FieldProblem(keys.GPU_MEM, text, f"{_show(text)} {what}; allowed: {BYTES_HELP}"))
    elif value > MAX_MEMORY_BYTES:
        problems.append(FieldProblem(keys.GPU_MEM, text, f"{_show(text)} is out of range; allowed: {BYTES_HELP}, "
                                                         f"at most {MAX_MEMORY_BYTES} (16 EiB)"))
        return None
    return value


def _negative(text: str, parses: Callable[[str], object]) -> bool:
    """Whether ``text`` is a minus sign before something ``parses`` accepts."""
    stripped = text.strip()
    return stripped.startswith("-") and parses(stripped[1:].strip()) is not None


def _to_permille(fraction: Decimal) -> int:
    """Round up, so the rectangle never covers less time than the user asked for."""
    return math.ceil(fraction * keys.TIME_UNITS)
