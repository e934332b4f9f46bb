"""Live share changes of running pods, judged: may a bound pod have the time share it now asks for?

A pod's share annotations may be edited after it was bound (by a user, or by the FaSTPod
controller for a time-only change). The extender's ledger is the one place that decides: the
change is re-checked against the pod's own GPU, with the pod's old rectangle taken out.

- Only the time share (request and limit) may change on a running pod. The SM percentage is
  fixed when the process starts (MPS reads ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` once, at the
  first CUDA call) and so is the memory limit (the hook's memory ledger and what
  ``cuMemGetInfo`` shows are set at its ``HELLO``): such a change is refused with why.
- A lower request with the same SM and memory always fits (its rectangle shrinks; the GPU
  gives nothing away); so does a limit-only change (the limit takes no room in the packing).
- A higher request must fit the GPU with the other pods on it; if it does not, the refusal says
  how much of the time the GPU has left for the pod at its SM percentage.
- A *parked* pod (request and limit 0: it holds its memory, gets no GPU time) is woken by a
  change to a non-zero share. A wake whose request does not fit is not refused (the parked pod
  would wait for GPU time it never gets): the pod is *woken without its request*, with request 0
  and the new limit (the GPU's idle time up to its limit, no guarantee), and
  :attr:`ShareChange.short_of` says what did not fit. Its annotations still ask for the request,
  so the change is retried like a refused one.

The pod's model (:mod:`fastgshare.model`) does not change with its share: its memory is fixed,
and so is the model it declared, which the check charges as it did when the pod was placed.

Pure: no I/O, no clock; the cache calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from fastgshare import keys
from fastgshare.errors import InvalidShareSpec
from fastgshare.ledger import GpuLedger
from fastgshare.model import ModelRef
from fastgshare.share import ShareSpec, format_fraction, parse_share

SM_FIXED = ("the SM percentage is fixed when the process starts (MPS reads CUDA_MPS_ACTIVE_THREAD_PERCENTAGE once)")
MEMORY_FIXED = "the memory limit is fixed when the process starts (the hook's memory ledger is set at its HELLO)"
RECREATE = "a FaSTPod rolls its pods for such a change; a bare pod must be recreated"


class ShareChangeRefused(Exception):
    """The pod keeps its share; the message says why, naming the field, the value and what is allowed."""


@attrs.frozen
class ShareChange:
    """What a judged change gives the pod: ``share``; ``short_of`` is None when that is the share
    asked for, else why the request was not given (a parked pod woken without its request)."""

    share: ShareSpec
    short_of: str | None = None


def wanted_share(annotations: Mapping[str, str]) -> ShareSpec:
    """The share the pod's annotations ask for now; :class:`ShareChangeRefused` with the parser's words."""
    try:
        return parse_share(annotations)
    except InvalidShareSpec as error:
        raise ShareChangeRefused(str(error)) from None


def change_key(annotations: Mapping[str, str]) -> tuple[str | None, ...]:
    """What identifies one change: the four share annotations as written (one refusal event each)."""
    return tuple(annotations.get(key) for key in keys.SHARE_ANNOTATIONS)


def judge_change(current: ShareSpec, wanted: ShareSpec, ledger: GpuLedger | None,
                 model: ModelRef | None = None) -> ShareChange:
    """The share that replaces ``current`` on the GPU of ``ledger`` (the pod, of ``model``, taken out): ``wanted``
    if it may, request 0 with ``wanted``'s limit for a parked pod's wake that does not fit; else
    raise :class:`ShareChangeRefused`."""
    stays = f"the share stays {current.describe()}"
    if wanted.sm_percent != current.sm_percent:
        raise ShareChangeRefused(f"{keys.GPU_SM_PARTITION} {wanted.sm_percent} (was {current.sm_percent}) cannot "
                                 f"change on a running pod: {SM_FIXED}; {RECREATE}; {stays}")
    if wanted.memory_bytes != current.memory_bytes:
        raise ShareChangeRefused(f"{keys.GPU_MEM} {wanted.memory_bytes} (was {current.memory_bytes}) cannot change "
                                 f"on a running pod: {MEMORY_FIXED}; {RECREATE}; {stays}")
    if wanted.request_permille <= current.request_permille:
        return ShareChange(wanted)  # a smaller (or the same) rectangle: always fits where the old one was
    if ledger is None:
        raise ShareChangeRefused(f"the pod's GPU is not in the node's inventory; {stays}")
    fit = ledger.check(wanted, model)
    if fit.ok:
        return ShareChange(wanted)
    room = most_request_that_fits(ledger, current, wanted, model)
    left = (f"at most {format_fraction(room)} of the time is free for it at {wanted.sm_percent} % SM"
            if room else f"no time is free for it at {wanted.sm_percent} % SM")
    short = (f"{keys.GPU_QUOTA_REQUEST} {format_fraction(wanted.request_permille)} does not fit GPU "
             f"{ledger.gpu.index} ({ledger.gpu.uuid}) with the pods it runs: {fit.message}; {left}")
    if current.is_parked:
        woken = attrs.evolve(wanted, request_permille=0)
        if ledger.fits(woken, model):  # its memory and slot, which it held parked
            return ShareChange(woken, short_of=short)
    raise ShareChangeRefused(f"{short}; {stays}")


def most_request_that_fits(ledger: GpuLedger, current: ShareSpec, wanted: ShareSpec,
                           model: ModelRef | None = None) -> int | None:
    """The largest request (permille, at least the current one, below the wanted one) the pod could
    have on ``ledger``, or None if not even the current one fits (an over-committed GPU)."""
    def fits(request: int) -> bool:
        return ledger.fits(ShareSpec(request_permille=request, limit_permille=max(request, wanted.limit_permille),
                                     sm_percent=wanted.sm_percent, memory_bytes=wanted.memory_bytes), model)

    low, high = current.request_permille, wanted.request_permille - 1
    if not fits(low):
        return None
    while low < high:  # invariant: fits(low); the answer is in low..high
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low
