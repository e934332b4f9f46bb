"""The arbiter's native scheduler (``arbiter_engine/policy.c``, driven through
:class:`~device_plugin.arbiter.native.NativePolicy`) decides exactly as its specification,
:class:`~fastgshare.arbitration.GpuArbiter`:

- fed the same random operations (clients coming, changing their share and going; requests that
  report no use, part of the token, all of it or an overrun; releases; decisions at times that stand
  still, creep, jump windows ahead or land on the last wake-up), with and without MPS and for several
  window and minimum-token settings, both grant the same clients in the same order, with the same
  tokens and wake-up times, and after every operation they agree on who waits, who holds a token
  until when, each client's usage and share, and whether anyone waits;
- the deterministic tenant simulations of ``tests/arbiter_sim.py`` (kernels overrunning their tokens,
  bursty tenants, shares changed mid-run) make the same decisions and give every tenant the same share;
- both refuse the same misuses with :class:`~fastgshare.arbitration.ArbitrationError`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from typing import Any, cast

import attrs
import pytest

from device_plugin.arbiter.native import NativePolicy
from fastgshare.arbitration import ArbitrationError, Decision, GpuArbiter, TimeShare
from tests.arbiter_sim import MS, Tenant, bursty, saturating, simulate

US = 1_000
SETTINGS = [(100 * MS, 2 * MS), (10 * MS, 20 * US), (1_000 * MS, 1 * MS)]  # (window, minimum token)
SETTING_IDS = ["100ms-2ms", "10ms-20us", "1s-1ms"]
NAMES = [f"c{i}" for i in range(6)]
OPERATIONS = 2_000  # per seed
# A few shares that several clients take at once, so that ties in the ranking are common.
COMMON_SHARES = [TimeShare(200, 1000, 100), TimeShare(200, 1000, 50), TimeShare(0, 50, 100), TimeShare(250, 250, 50)]


class _Twin:
    """A GpuArbiter and a NativePolicy fed the same operations; every answer is checked to agree."""

    def __init__(self, seed: int, window_ns: int, min_token_ns: int, mps: bool) -> None:
        self.python = GpuArbiter(window_ns=window_ns, min_token_ns=min_token_ns, mps_enabled=mps)
        self.native = NativePolicy(window_ns=window_ns, min_token_ns=min_token_ns, mps_enabled=mps)
        self.setting = f"seed={seed} window_ns={window_ns} min_token_ns={min_token_ns} mps_enabled={mps}"
        self.log: list[str] = []

    def context(self) -> str:
        """What led here: the settings and the last operations (the whole sequence is the seed's)."""
        return f"{self.setting}, after {len(self.log)} operations, the last ones:\n  " + "\n  ".join(self.log[-25:])

    def do(self, operation: str, *args: Any) -> Any:
        """The operation on both: the same answer, or ArbitrationError from both."""
        self.log.append(f"{operation}{args!r}")
        outcomes = []
        for implementation in (self.python, self.native):
            try:
                outcomes.append(("returned", getattr(implementation, operation)(*args)))
            except ArbitrationError:
                outcomes.append(("raised ArbitrationError", None))
        assert outcomes[1] == outcomes[0], self.context()
        return outcomes[0][1]

    def check(self, now_ns: int) -> None:
        """Every client's state as both see it at ``now_ns``."""
        clients = self.python.clients
        assert self.native.clients == clients, self.context()
        assert _observe(self.native, clients, now_ns) == _observe(self.python, clients, now_ns), self.context()


def _observe(arbiter: GpuArbiter | NativePolicy, clients: tuple[Hashable, ...], now_ns: int) -> dict[object, object]:
    state: dict[object, object] = {"anyone_waiting": arbiter.anyone_waiting}
    for client in clients:
        state[client] = (arbiter.is_waiting(client), arbiter.holding_until(client), arbiter.usage_ns(client, now_ns),
                         arbiter.share(client))
    return state


def _random_share(rng: random.Random) -> TimeShare:
    if rng.random() < 0.3:
        return rng.choice(COMMON_SHARES)
    request = rng.choice([0, 0, 1, 10, 100, 250, 500, 999, 1000, rng.randint(0, 1000), rng.randint(0, 1000)])
    limit = rng.choice([1000, 1000, request, max(request, 50), max(request, 1), rng.randint(request, 1000)])
    sm = rng.choice([100, 100, 50, 50, 25, 1, rng.randint(1, 100)])
    return TimeShare(request, limit, sm)


def _advance(rng: random.Random, now: int, wake: int | None, window: int, min_token: int) -> int:
    roll = rng.random()
    if roll < 0.15 and wake is not None and wake >= now:
        return wake  # exactly when the last decision said to look again
    if roll < 0.4:
        return now  # several operations at one instant
    if roll < 0.75:
        return now + rng.randint(1, min_token)
    if roll < 0.92:
        return now + rng.randint(1, window // 10)
    if roll < 0.98:
        return now + rng.randint(1, window // 2)
    return now + rng.randint(window // 2, 3 * window)  # idle for windows


def _used(rng: random.Random, grant: tuple[int, int] | None, now: int, window: int) -> int:
    """What a client reports it used of its last token: nothing, part, all, an overrun, the time since
    its grant began (or part of it), or a nonsensical negative."""
    if grant is None:
        return rng.choice([0, rng.randint(0, window)])
    start, token = grant
    elapsed = max(0, now - start)
    return rng.choice([0, rng.randint(1, max(1, token - 1)), token, token, token + rng.randint(1, window),
                       elapsed, rng.randint(0, elapsed), -rng.randint(1, token)])


def _pick(rng: random.Random, clients: tuple[Hashable, ...]) -> Hashable:
    return rng.choice(clients) if clients and rng.random() < 0.97 else "unknown"


@pytest.mark.parametrize("mps", [True, False], ids=["mps", "no-mps"])
@pytest.mark.parametrize(("window_ns", "min_token_ns"), SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("seed", range(8))
def test_random_operations_get_the_same_answers(seed: int, window_ns: int, min_token_ns: int, mps: bool) -> None:
    rng = random.Random(seed)
    twin = _Twin(seed, window_ns, min_token_ns, mps)
    now, wake = rng.randint(0, 10 * window_ns), None
    grants: dict[Hashable, tuple[int, int]] = {}  # client -> (start, token) of its last grant
    granted = 0
    for _ in range(OPERATIONS):
        if rng.random() < 0.6:
            now = _advance(rng, now, wake, window_ns, min_token_ns)
        clients = twin.python.clients
        roll = rng.random()
        if roll < 0.06 or not clients:
            absent = [name for name in NAMES if name not in clients]
            name = rng.choice(absent) if absent and rng.random() < 0.95 else rng.choice(NAMES)  # or a duplicate
            twin.do("add_client", name, _random_share(rng))
            if name not in clients:
                grants.pop(name, None)  # a new client: no token yet
        elif roll < 0.1:
            twin.do("update_share", _pick(rng, clients), _random_share(rng))
        elif roll < 0.13:
            twin.do("remove_client", _pick(rng, clients))
        elif roll < 0.45:
            client = _pick(rng, clients)
            twin.do("request", client, now, _used(rng, grants.get(client), now, window_ns))
        elif roll < 0.52:
            client = _pick(rng, clients)
            twin.do("release", client, now, _used(rng, grants.get(client), now, window_ns))
        else:
            decision: Decision = twin.do("schedule", now)
            for grant in decision.grants:
                grants[grant.client] = (now, grant.token_ns)
            granted += len(decision.grants)
            wake = decision.wake_at_ns
        twin.check(now)
    assert granted > OPERATIONS // 20  # the sequences exercise the decisions, not only the bookkeeping


# --- the simulations -------------------------------------------------------------------------------


class _Recording:
    """An arbiter that keeps every decision, so that two runs can be compared decision by decision."""

    def __init__(self, arbiter: GpuArbiter | NativePolicy) -> None:
        self.arbiter = arbiter
        self.decisions: list[tuple[int, Decision]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.arbiter, name)

    def schedule(self, now_ns: int) -> Decision:
        decision = self.arbiter.schedule(now_ns)
        self.decisions.append((now_ns, decision))
        return decision


@attrs.frozen
class _Outcome:
    shares: dict[str, float]  # of the GPU's time after the warm-up, per tenant
    grants: dict[str, int]  # per tenant
    decisions: list[tuple[int, Decision]]  # (time, decision), every one


def _run(make: Callable[..., GpuArbiter | NativePolicy], tenants: dict[str, Tenant], *, mps: bool = True,
         window_ns: int = 100 * MS, min_token_ns: int = 2 * MS, duration_ms: int = 1_500,
         changes: Callable[[_Recording], dict[int, Callable[[], None]]] | None = None) -> _Outcome:
    arbiter = _Recording(make(window_ns=window_ns, min_token_ns=min_token_ns, mps_enabled=mps))
    shares = simulate(cast(GpuArbiter, arbiter), tenants, duration_ms=duration_ms, warmup_ms=200,
                      changes=changes(arbiter) if changes else None)
    return _Outcome(shares, {name: tenant.grants for name, tenant in tenants.items()}, arbiter.decisions)


MIXES: dict[str, Callable[[], dict[str, Tenant]]] = {
    "three saturating": lambda: {"a": saturating(0.2, 0.3), "b": saturating(0.3, 0.5, sm=60),
                                 "c": saturating(0.1, 1.0, sm=40)},
    "a 10 ms kernel at a 0.25 limit, alone": lambda: {"a": saturating(0.25, 0.25, kernel_ms=10)},
    "kernel overruns": lambda: {"a": saturating(0.25, 0.25, kernel_ms=10), "b": saturating(0.1, 0.1, kernel_ms=20),
                                "c": saturating(0.2, 1.0, sm=50, kernel_ms=3)},
    "bursty": lambda: {"steady": saturating(0.3, 1.0), "burst": bursty(0.5, 1.0, on_ms=200, off_ms=200),
                       "flicker": bursty(0.1, 0.4, sm=50, on_ms=30, off_ms=70)},
    "a whole GPU among halves": lambda: {"big": saturating(0.5, 1.0, sm=100), "s1": saturating(0.1, 1.0, sm=50),
                                         "s2": saturating(0.1, 1.0, sm=50, kernel_ms=1)},
    "best effort": lambda: {"be": saturating(0, 1.0, sm=30), "capped": saturating(0, 0.05, sm=30),
                            "half": bursty(0.5, 0.5, sm=50, on_ms=120, off_ms=50)},
}


# The Python scheduler finds an over-limit client's wake-up in time quadratic in its grants: best-effort
# tenants on 100 µs tokens take it seconds, so they run on the long window only.
SIMULATIONS = [pytest.param(mix, *setting, id=f"{mix}-{label}") for mix in MIXES
               for setting, label in [((100 * MS, 2 * MS), "100ms-2ms"), ((10 * MS, 100 * US), "10ms-100us")]
               if mix != "best effort" or label == "100ms-2ms"]


@pytest.mark.parametrize("mps", [True, False], ids=["mps", "no-mps"])
@pytest.mark.parametrize(("mix", "window_ns", "min_token_ns"), SIMULATIONS)
def test_the_simulations_give_every_tenant_the_same(mix: str, window_ns: int, min_token_ns: int, mps: bool) -> None:
    def run(make: Callable[..., GpuArbiter | NativePolicy]) -> _Outcome:
        return _run(make, MIXES[mix](), mps=mps, window_ns=window_ns, min_token_ns=min_token_ns)

    python, native = run(GpuArbiter), run(NativePolicy)
    assert native.shares == python.shares
    assert native.grants == python.grants
    assert native.decisions == python.decisions


def test_a_share_changed_mid_run_gives_the_same() -> None:
    def changes(arbiter: _Recording) -> dict[int, Callable[[], None]]:
        # (the SM partitions stay: the simulation checks the SM rule with the tenants' first shares)
        return {700: lambda: arbiter.update_share("a", TimeShare(100, 600, 100)),
                1_200: lambda: arbiter.update_share("b", TimeShare(0, 50, 60)),
                1_600: lambda: arbiter.update_share("a", TimeShare(300, 300, 100))}

    def tenants() -> dict[str, Tenant]:
        return {"a": saturating(0.1, 0.3, kernel_ms=4), "b": saturating(0.3, 0.5, sm=60),
                "c": bursty(0.2, 1.0, sm=40, on_ms=90, off_ms=40)}

    python = _run(GpuArbiter, tenants(), duration_ms=2_500, changes=changes)
    native = _run(NativePolicy, tenants(), duration_ms=2_500, changes=changes)
    assert native.shares == python.shares
    assert native.grants == python.grants
    assert native.decisions == python.decisions
    assert python.shares["a"] > 0.3  # more than its first limit: the changes took effect


# --- errors ----------------------------------------------------------------------------------------


def _both() -> list[GpuArbiter | NativePolicy]:
    return [GpuArbiter(window_ns=100 * MS, min_token_ns=2 * MS),
            NativePolicy(window_ns=100 * MS, min_token_ns=2 * MS)]


@pytest.mark.parametrize(("operation", "args"), [
    ("update_share", (TimeShare(1, 1, 1),)), ("request", (0, 0)), ("release", (0, 0)), ("is_waiting", ()),
    ("holding_until", ()), ("usage_ns", (0,)), ("share", ()),
])
def test_an_unknown_client_is_an_error_in_both(operation: str, args: tuple[object, ...]) -> None:
    for arbiter in _both():
        arbiter.add_client("a", TimeShare(100, 1000, 100))
        with pytest.raises(ArbitrationError, match="is not registered"):
            getattr(arbiter, operation)("zz", *args)
        arbiter.remove_client("a")
        with pytest.raises(ArbitrationError, match="is not registered"):
            getattr(arbiter, operation)("a", *args)  # nor is one that was removed
        arbiter.remove_client("a")  # removing twice or an unknown client is harmless in both


def test_adding_a_client_twice_is_an_error_in_both() -> None:
    for arbiter in _both():
        arbiter.add_client("a", TimeShare(100, 1000, 100))
        with pytest.raises(ArbitrationError, match="already registered"):
            arbiter.add_client("a", TimeShare(200, 1000, 100))
        assert arbiter.share("a") == TimeShare(100, 1000, 100)  # the first registration stands
        assert arbiter.clients == ("a",)


@pytest.mark.parametrize(("window_ns", "min_token_ns"), [(0, 1), (-100, 1), (100, 0), (100, -1), (100, 101)])
def test_bad_window_settings_are_an_error_in_both(window_ns: int, min_token_ns: int) -> None:
    with pytest.raises(ArbitrationError, match="min_token_ns"):
        GpuArbiter(window_ns=window_ns, min_token_ns=min_token_ns)
    with pytest.raises(ArbitrationError, match="min_token_ns"):
        NativePolicy(window_ns=window_ns, min_token_ns=min_token_ns)


def test_the_edge_settings_are_accepted_by_both() -> None:
    for window_ns, min_token_ns in [(1, 1), (100, 100)]:
        GpuArbiter(window_ns=window_ns, min_token_ns=min_token_ns)
        NativePolicy(window_ns=window_ns, min_token_ns=min_token_ns)


def test_a_use_reported_near_the_int64_limit_is_charged_up_to_now_in_both() -> None:
    """A report no hook makes (the engine passes a u64 on, capped at INT64_MAX) is charged up to now: the
    C once added it to the grant's start in int64, wrapped around and charged nothing (a process
    reporting 2**63 - 1 after every token held 99.8 % of the GPU at a 10 % limit)."""
    answers = []
    for arbiter in _both():
        arbiter.add_client("a", TimeShare(100, 500, 100))
        arbiter.request("a", 1 * MS, 0)
        arbiter.schedule(1 * MS)
        arbiter.request("a", 50 * MS, 2**63 - 1)
        answers.append((arbiter.usage_ns("a", 50 * MS), arbiter.schedule(50 * MS)))
    assert answers[1] == answers[0]


def test_a_parked_pod_woken_again_and_again_is_granted_at_once_in_both() -> None:
    """A pod parked (limit 0) between requests and woken to 0.4 each time: the idle time before it
    was parked counts, so no debt builds up over the wakes (it grew to a 60 ms wait per wake)."""
    on, off = TimeShare(400, 400, 40), TimeShare(0, 0, 40)
    for arbiter in _both():
        arbiter.add_client("p", on)
        now = 1_000 * MS
        arbiter.request("p", now, 0)
        assert arbiter.schedule(now).grants
        waits = []
        for _ in range(6):
            now += 300 * MS  # idle, holding its last token, then parked
            arbiter.update_share("p", off)
            arbiter.schedule(now)
            now += 10 * MS
            arbiter.request("p", now, 40 * MS)  # a request while parked: nothing is granted
            assert not arbiter.schedule(now).grants
            now += 40 * MS
            arbiter.update_share("p", on)  # woken
            decision, woken = arbiter.schedule(now), now
            while not decision.grants:
                assert decision.wake_at_ns is not None
                now = decision.wake_at_ns
                decision = arbiter.schedule(now)
            waits.append(now - woken)
        assert waits == [0] * 6, type(arbiter).__name__
