"""Function profiles: for each configuration of a function's pods (time quota, SM percent, memory,
batch), how many requests per second one pod serves, and how fast, measured under load.

The document is versioned JSON, kept in a ConfigMap that a FaSTFunc references; this module is its
model, its codec and the one number the planner needs from a point: its **SLO capacity**, the
highest load at which the SLO's latency percentile stays under the SLO with a margin
(:data:`SLO_MARGIN`) and no errors, interpolated between the measured load steps. A point without
steps (an imported one) has only its saturation figures: its SLO capacity is its ``maxRps`` if its
percentile at saturation meets the SLO, else 0. A point of capacity 0 cannot serve the SLO at any
load (e.g. a 20 % quota for a model that needs 70 ms of GPU time per request and a 69 ms SLO).

Two importers turn the public formats of earlier systems into profiles (pure parsers of their
text): the FaST-GShare profiler's trial CSVs (a Morphling fork: ``value`` is the RPS,
``limitations`` the share, ``other_metrics`` the p95) and HAS-GPU's latency tables
(``{"model_name", "profiling_result": [{batch, sm, quota, latency}]}``, throughput derived as
``1000·batch/latency``).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from fastgshare.errors import FastGShareError
from fastgshare.jsontext import load_bounded
from fastgshare.quantity import parse_bytes

PROFILE_VERSION = 1
MAX_PROFILE_BYTES = 1024 * 1024  # a ConfigMap holds at most 1 MiB
MAX_IMPORT_BYTES = 16 * 1024 * 1024  # a file in another system's format, read once
MAX_POINTS = 10_000
SLO_MARGIN = 0.1  # the percentile must stay under (1 - margin) x the SLO latency
PERCENTILES = (50, 95, 99)


class ProfileError(FastGShareError):
    """A profile document or an imported file is malformed; the message names the field."""


@attrs.frozen(kw_only=True)
class Slo:
    percentile: int  # 50, 95 or 99
    latency_ms: float

    def __attrs_post_init__(self) -> None:
        if self.percentile not in PERCENTILES:
            raise ProfileError(f"slo.percentile: must be one of {PERCENTILES}, got {self.percentile}")
        if not (math.isfinite(self.latency_ms) and self.latency_ms > 0):
            raise ProfileError(f"slo.latencyMs: must be a positive number of milliseconds, got {self.latency_ms}")


@attrs.frozen(kw_only=True)
class LoadStep:
    """One step of the load sweep: offered and achieved rate and the latency percentiles."""

    offered_rps: float
    achieved_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    error_rate: float = 0.0

    def percentile_ms(self, percentile: int) -> float:
        return {50: self.p50_ms, 95: self.p95_ms, 99: self.p99_ms}[percentile]


@attrs.frozen(kw_only=True)
class ProfilePoint:
    """One configuration of the function's pods and what one pod of it serves."""

    quota_request: float  # 0 < request <= limit <= 1
    quota_limit: float
    sm_partition: int  # 1..100
    memory_bytes: int
    batch: int = 1
    max_rps: float  # the highest rate one pod achieved
    slo_rps: float = 0.0  # as recorded (for the document's SLO); the planner uses slo_capacity()
    p50_ms: float | None = None  # at saturation
    p95_ms: float | None = None
    p99_ms: float | None = None
    error_rate: float = 0.0
    steps: tuple[LoadStep, ...] = ()
    derived: bool = False  # computed from latencies, not measured under load

    def __attrs_post_init__(self) -> None:
        where = f"point (quota {self.quota_request}, SM {self.sm_partition})"
        if not 0 < self.quota_request <= self.quota_limit <= 1:
            raise ProfileError(f"{where}: need 0 < quotaRequest <= quotaLimit <= 1, got {self.quota_request} and "
                               f"{self.quota_limit}")
        if not 1 <= self.sm_partition <= 100:
            raise ProfileError(f"{where}: smPartition must be 1..100, got {self.sm_partition}")
        if self.memory_bytes <= 0 or self.batch < 1:
            raise ProfileError(f"{where}: memoryBytes must be > 0 and batch >= 1, got {self.memory_bytes} and "
                               f"{self.batch}")
        if not (math.isfinite(self.max_rps) and self.max_rps >= 0 and math.isfinite(self.slo_rps)
                and self.slo_rps >= 0):
            raise ProfileError(f"{where}: maxRps and sloRps must be finite and >= 0, got {self.max_rps} and "
                               f"{self.slo_rps}")

    @property
    def key(self) -> str:
        """The configuration's name in FaSTPod names and labels: ``q40-s12`` (percent)."""
        return f"q{round(self.quota_request * 100)}-s{self.sm_partition}"

    def percentile_ms(self, percentile: int) -> float | None:
        return {50: self.p50_ms, 95: self.p95_ms, 99: self.p99_ms}[percentile]


@attrs.frozen(kw_only=True)
class Profile:
    function: str
    points: tuple[ProfilePoint, ...]
    slo: Slo | None = None
    gpu_model: str = ""
    source: str = ""
    measured_at: str = ""


def slo_capacity(point: ProfilePoint, slo: Slo, margin: float = SLO_MARGIN) -> float:
    """Requests per second one pod of ``point`` serves within ``slo`` (0: never)."""
    bound = (1 - margin) * slo.latency_ms
    if not point.steps:
        at_saturation = point.percentile_ms(slo.percentile)
        ok = at_saturation is not None and at_saturation <= bound and point.error_rate == 0
        return point.max_rps if ok else 0.0
    previous: LoadStep | None = None
    for step in sorted(point.steps, key=lambda s: s.offered_rps):
        latency = step.percentile_ms(slo.percentile)
        if latency <= bound and step.error_rate == 0:
            previous = step
            continue
        if previous is None:
            return 0.0  # even the lightest load misses the SLO
        below = previous.percentile_ms(slo.percentile)
        if step.error_rate == 0 and latency > below and step.achieved_rps > previous.achieved_rps:
            # the bound is crossed between the two steps: interpolate linearly
            return previous.achieved_rps + (bound - below) / (latency - below) * (
                step.achieved_rps - previous.achieved_rps)
        return previous.achieved_rps
    return previous.achieved_rps if previous is not None else 0.0


# --- codec -------------------------------------------------------------------------------
def encode_profile(profile: Profile) -> str:
    """The document, indented (it is read and edited in a ConfigMap)."""
    document: dict[str, Any] = {"version": PROFILE_VERSION, "function": profile.function}
    if profile.gpu_model:
        document["gpuModel"] = profile.gpu_model
    if profile.source:
        document["source"] = profile.source
    if profile.measured_at:
        document["measuredAt"] = profile.measured_at
    if profile.slo is not None:
        document["slo"] = {"percentile": profile.slo.percentile, "latencyMs": profile.slo.latency_ms}
    document["points"] = [_encode_point(point) for point in profile.points]
    return json.dumps(document, indent=1)


def _encode_point(point: ProfilePoint) -> dict[str, Any]:
    encoded: dict[str, Any] = {
        "quotaRequest": point.quota_request, "quotaLimit": point.quota_limit, "smPartition": point.sm_partition,
        "memoryBytes": point.memory_bytes, "batch": point.batch, "maxRps": point.max_rps, "sloRps": point.slo_rps}
    for name, value in (("p50Ms", point.p50_ms), ("p95Ms", point.p95_ms), ("p99Ms", point.p99_ms)):
        if value is not None:
            encoded[name] = value
    if point.error_rate:
        encoded["errorRate"] = point.error_rate
    if point.derived:
        encoded["derived"] = True
    if point.steps:
        encoded["steps"] = [{"offeredRps": s.offered_rps, "achievedRps": s.achieved_rps, "p50Ms": s.p50_ms,
                             "p95Ms": s.p95_ms, "p99Ms": s.p99_ms, **({"errorRate": s.error_rate} if s.error_rate
                                                                      else {})} for s in point.steps]
    return encoded


def decode_profile(text: str) -> Profile:
    """A profile document; :class:`ProfileError` naming the first bad field."""
    document = load_bounded(text, "profile", MAX_PROFILE_BYTES, ProfileError)
    reader = _Reader(document, "profile")
    version = reader.number("version", integer=True)
    if version != PROFILE_VERSION:
        raise ProfileError(f"profile.version: {version} is not understood; allowed: {PROFILE_VERSION}")
    slo_raw = reader.optional("slo")
    slo = None
    if slo_raw is not None:
        slo_reader = _Reader(slo_raw, "profile.slo")
        slo = Slo(percentile=int(slo_reader.number("percentile", integer=True)),
                  latency_ms=slo_reader.number("latencyMs"))
    raw_points = reader.list("points")
    if len(raw_points) > MAX_POINTS:
        raise ProfileError(f"profile.points: {len(raw_points)} points exceed {MAX_POINTS}")
    return Profile(function=reader.text("function"), gpu_model=reader.text("gpuModel", required=False),
                   source=reader.text("source", required=False),
                   measured_at=reader.text("measuredAt", required=False), slo=slo,
                   points=tuple(_decode_point(raw, f"profile.points[{n}]") for n, raw in enumerate(raw_points)))


def _decode_point(raw: object, where: str) -> ProfilePoint:
    reader = _Reader(raw, where)
    steps = tuple(_decode_step(step, f"{where}.steps[{n}]") for n, step in enumerate(reader.list("steps", []) or []))
    request = reader.number("quotaRequest")
    try:
        return ProfilePoint(
            quota_request=request, quota_limit=reader.number("quotaLimit", default=request),
            sm_partition=int(reader.number("smPartition", integer=True)),
            memory_bytes=int(reader.number("memoryBytes", integer=True)),
            batch=int(reader.number("batch", integer=True, default=1)), max_rps=reader.number("maxRps"),
            slo_rps=reader.number("sloRps", default=0.0), p50_ms=reader.optional_number("p50Ms"),
            p95_ms=reader.optional_number("p95Ms"), p99_ms=reader.optional_number("p99Ms"),
            error_rate=reader.number("errorRate", default=0.0), steps=steps,
            derived=bool(reader.optional("derived")))
    except ProfileError as error:
        raise ProfileError(f"{where}: {error}") from None


def _decode_step(raw: object, where: str) -> LoadStep:
    reader = _Reader(raw, where)
    return LoadStep(offered_rps=reader.number("offeredRps"), achieved_rps=reader.number("achievedRps"),
                    p50_ms=reader.number("p50Ms"), p95_ms=reader.number("p95Ms"), p99_ms=reader.number("p99Ms"),
                    error_rate=reader.number("errorRate", default=0.0))


class _Reader:
    """Fields of one JSON object, each checked, with errors naming ``where.field``."""

    def __init__(self, raw: object, where: str) -> None:
        if not isinstance(raw, dict):
            raise ProfileError(f"{where}: must be an object, got {type(raw).__name__}")
        self.raw, self.where = raw, where

    def optional(self, name: str) -> Any:
        return self.raw.get(name)

    def text(self, name: str, *, required: bool = True) -> str:
        value = self.raw.get(name, None if required else "")
        if not isinstance(value, str) or (required and not value):
            raise ProfileError(f"{self.where}.{name}: must be a non-empty string, got {value!r}")
        return value

    def number(self, name: str, *, integer: bool = False, default: float | None = None) -> float:
        value = self.raw.get(name, default)
        if value is None:
            raise ProfileError(f"{self.where}.{name}: is missing")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or (
                integer and value != int(value)):
            kind = "a whole number" if integer else "a number"
            raise ProfileError(f"{self.where}.{name}: must be {kind}, got {value!r}")
        return int(value) if integer else float(value)

    def optional_number(self, name: str) -> float | None:
        return None if self.raw.get(name) is None else self.number(name)

    def list(self, name: str, default: list[Any] | None = None) -> list[Any]:
        value = self.raw.get(name, default)
        if not isinstance(value, list):
            raise ProfileError(f"{self.where}.{name}: must be a list, got {type(value).__name__}")
        return value


# --- importers ---------------------------------------------------------------------------
def import_fast_profiler_csv(text: str, *, function: str) -> Profile:
    """The FaST-GShare profiler's trial rows (``namespace, trial_name, key, value, limitations,
    other_metrics``): ``value`` is the RPS one pod sustained, ``limitations`` its share
    (``GPU_QUOTA``, ``GPU_SM``, ``GPU_MEMORY``), ``other_metrics.p95`` its p95 in ms there."""
    points = []
    for number, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        where = f"line {number}"
        try:
            limits, metrics = _loose_json(row["limitations"], where), _loose_json(row.get("other_metrics") or "{}",
                                                                                   where)
            memory = parse_bytes(str(limits.get("GPU_MEMORY", "")))
            if memory is None:
                raise ProfileError(f"{where}: limitations.GPU_MEMORY {limits.get('GPU_MEMORY')!r} is not a byte count")
            quota = float(limits["GPU_QUOTA"])
            p95 = metrics.get("p95")
            points.append(ProfilePoint(
                quota_request=quota, quota_limit=quota, sm_partition=round(float(limits["GPU_SM"])),
                memory_bytes=memory, max_rps=float(row["value"]), p95_ms=None if p95 is None else float(p95),
                error_rate=float(metrics.get("error_rate") or 0.0)))
        except (KeyError, ValueError, TypeError) as error:
            raise ProfileError(f"{where}: {error!r} (need key, value, limitations with GPU_QUOTA, GPU_SM, "
                               "GPU_MEMORY)") from None
    return Profile(function=function, points=tuple(points), source="fast-gshare-profiler")


def import_has_gpu_json(text: str, *, memory_bytes: int, function: str | None = None) -> Profile:
    """A HAS-GPU latency table: per (sm, batch, quota %) the latency of one request in ms; the
    throughput is derived (``1000·batch/latency``) and the point marked so."""
    document = load_bounded(text, "HAS-GPU profile", MAX_IMPORT_BYTES, ProfileError)
    reader = _Reader(document, "HAS-GPU profile")
    points = []
    for number, raw in enumerate(reader.list("profiling_result")):
        entry = _Reader(raw, f"profiling_result[{number}]")
        latency, batch = entry.number("latency"), int(entry.number("batch", integer=True, default=1))
        if latency <= 0:
            raise ProfileError(f"profiling_result[{number}].latency: must be > 0 ms, got {latency}")
        quota = entry.number("quota") / 100
        points.append(ProfilePoint(
            quota_request=quota, quota_limit=quota, sm_partition=int(entry.number("sm", integer=True)),
            memory_bytes=memory_bytes, batch=batch, max_rps=1000 * batch / latency, p50_ms=latency, p95_ms=latency,
            p99_ms=latency, derived=True))
    return Profile(function=function or reader.text("model_name"), points=tuple(points), source="has-gpu")


def _loose_json(text: str, where: str) -> Mapping[str, Any]:
    """A JSON object, also in the single-quoted form Python's repr writes."""
    for candidate in (text, text.replace("'", '"')):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise ProfileError(f"{where}: {text[:80]!r} is not a JSON object")


def with_slo(points: Iterable[ProfilePoint], slo: Slo) -> list[tuple[ProfilePoint, float]]:
    """Each point with its SLO capacity for ``slo``."""
    return [(point, slo_capacity(point, slo)) for point in points]
