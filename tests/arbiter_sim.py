"""A discrete-event simulation of tenants under a :class:`GpuArbiter`, for deterministic tests.

Each tenant asks for a token, uses it (all of it; or, with ``kernel_ms``, in whole kernels, the
last one running past the token's end as a launch in flight at its end does), and asks again
while it wants the GPU. The simulation checks the arbiter's SM rule at every grant and
returns what each tenant really got.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import attrs

from fastgshare import keys
from fastgshare.arbitration import GpuArbiter, TimeShare

MS = 1_000_000


@attrs.define
class Tenant:
    share: TimeShare
    wants: Callable[[int], bool] = lambda now: True  # does it want the GPU at time now?
    kernel_ns: int = 0  # launches of this length: a token's use is whole kernels; 0: the token exactly
    busy_ns: int = 0  # time spent holding tokens inside the measured interval
    grants: int = 0


def saturating(request: float, limit: float, sm: int = 100, *, kernel_ms: float = 0) -> Tenant:
    return Tenant(TimeShare(round(request * 1000), round(limit * 1000), sm), kernel_ns=round(kernel_ms * MS))


def bursty(request: float, limit: float, sm: int = 100, *, on_ms: int, off_ms: int) -> Tenant:
    period = (on_ms + off_ms) * MS
    return Tenant(TimeShare(round(request * 1000), round(limit * 1000), sm),
                  wants=lambda now: now % period < on_ms * MS)


def simulate(arbiter: GpuArbiter, tenants: dict[str, Tenant], *, duration_ms: int, warmup_ms: int = 500,
             changes: dict[int, Callable[[], None]] | None = None) -> dict[str, float]:
    """Run the tenants; return each one's share of GPU time between warm-up and the end."""
    for name, tenant in tenants.items():
        arbiter.add_client(name, tenant.share)
    end, start = duration_ms * MS, warmup_ms * MS
    events: list[tuple[int, int, str, str]] = []  # (time, seq, kind, tenant)
    seq = 0

    def push(time: int, kind: str, name: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (time, seq, kind, name))

    holding: dict[str, tuple[int, int, int]] = {}  # tenant -> (grant, end of its use, end of its token)
    for name in tenants:
        push(0, "want", name)
    for at_ms in changes or {}:
        push(at_ms * MS, "change", str(at_ms))
    wake: int | None = None
    while events:
        now, _, kind, name = heapq.heappop(events)
        if now > end:
            break
        if kind == "change":
            (changes or {})[int(name)]()
        elif kind == "want" and not _ask(arbiter, tenants[name], name, holding, now):
            push(now + MS, "want", name)  # idle: look again in 1 ms
        decision = arbiter.schedule(now)
        for grant in decision.grants:
            tenant = tenants[grant.client]
            use = _use_ns(tenant, grant.token_ns)
            holding[grant.client] = (now, now + use, now + grant.token_ns)
            tenant.grants += 1
            tenant.busy_ns += max(0, min(now + use, end) - max(now, start))
            push(now + use, "want", grant.client)
        _check_sm_rule(arbiter, tenants, holding, now)
        if decision.wake_at_ns is not None and decision.wake_at_ns != wake:
            wake = decision.wake_at_ns
            push(wake, "tick", "")
    return {name: tenant.busy_ns / (end - start) for name, tenant in tenants.items()}


def _use_ns(tenant: Tenant, token_ns: int) -> int:
    """GPU time a token takes: the token, or the whole kernels started before its end (at least one)."""
    if not tenant.kernel_ns:
        return token_ns
    return max(1, -(-token_ns // tenant.kernel_ns)) * tenant.kernel_ns


def _ask(arbiter: GpuArbiter, tenant: Tenant, name: str, holding: dict[str, tuple[int, int, int]],
         now: int) -> bool:
    """The tenant's token ended and its last kernel with it: it reports what it used and asks again
    if it still wants the GPU."""
    held = holding.pop(name, None)
    began, use_end, _ = held or (now, now, now)
    if not tenant.wants(now):
        if held is not None:
            arbiter.release(name, now, use_end - began)
        return False
    arbiter.request(name, now, use_end - began)
    return True


def _check_sm_rule(arbiter: GpuArbiter, tenants: dict[str, Tenant], holding: dict[str, tuple[int, int, int]],
                   now: int) -> None:
    active = [name for name, (_, _, token_end) in holding.items() if token_end > now]
    if arbiter.mps_enabled:
        assert sum(tenants[n].share.sm_percent for n in active) <= keys.SM_UNITS, (now, active)
    else:
        assert len(active) <= 1, (now, active)
