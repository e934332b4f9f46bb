"""Filter and prioritize: which candidate nodes can take the pod, and how much the policy likes each.

The pod's share comes from its annotations (:func:`fastgshare.share.parse_share`) and its
policy from ``fastgshare/scheduling_policy`` or the extender's default. The judging itself is
the core's (:func:`fastgshare.placement.evaluate_node` and ``score_node``) on the cache's
ledgers, which include binds in flight.

Where a rejected node goes:

- ``FailedAndUnresolvableNodes`` when waiting cannot help: an invalid share or policy (every
  node, with the parser's message), no usable inventory, or a pod that would not fit even on
  the node emptied of pods (too much memory for any GPU, every GPU unhealthy);
- ``FailedNodes`` when it may fit later: the GPUs are taken now, or the node is not in the
  cache yet.
"""

from __future__ import annotations

import logging
from collections import Counter

import attrs

from fastgshare import keys
from fastgshare.errors import InvalidPolicy, InvalidShareSpec
from fastgshare.ledger import Rejection
from fastgshare.placement import NodeVerdict, Policy, parse_policy
from fastgshare.share import ShareSpec, parse_share
from scheduler_extender.metrics import Metrics
from scheduler_extender.nodes import NodeEntry
from scheduler_extender.passes import FilterPasses
from scheduler_extender.records import PodRecord
from scheduler_extender.state import ClusterState
from scheduler_extender.wire import ExtenderArgs, FilterResult

log = logging.getLogger(__name__)

NOT_SYNCED = "the fastgshare extender's cache has not synced with the API server yet; retrying"


class InvalidRequest(Exception):
    """The pod's share or policy annotation is invalid; the message is the parser's."""


@attrs.frozen
class PodRequest:
    """What the pod asks for and how to place it."""

    share: ShareSpec
    policy: Policy


def pod_request(pod: PodRecord, default_policy: Policy) -> PodRequest:
    """The pod's share and placement policy, or :class:`InvalidRequest` saying what is wrong."""
    try:
        share = parse_share(pod.annotations)
    except InvalidShareSpec as error:
        raise InvalidRequest(str(error)) from None
    text = pod.annotations.get(keys.SCHEDULING_POLICY_ANNOTATION)
    try:
        policy = parse_policy(text) if text is not None else default_policy
    except InvalidPolicy as error:
        raise InvalidRequest(f"{keys.SCHEDULING_POLICY_ANNOTATION}: {error}") from None
    return PodRequest(share, policy)


@attrs.frozen
class Refusal:
    """Why one node cannot take the pod: a metrics label, the sentence, and whether waiting helps."""

    label: str
    reason: str
    resolvable: bool


class Decisions:
    """Answers filter and prioritize from the cache."""

    def __init__(self, state: ClusterState, default_policy: Policy, metrics: Metrics,
                 passes: FilterPasses | None = None) -> None:
        self._state = state
        self._default_policy = default_policy
        self._metrics = metrics
        self._passes = passes if passes is not None else FilterPasses()

    def filter(self, args: ExtenderArgs) -> FilterResult:
        """The nodes that can take the pod now; bind will bind it only to one of them."""
        result = self._filter(args)
        self._passes.record(args.pod.uid, result.passed)
        return result

    def _filter(self, args: ExtenderArgs) -> FilterResult:
        if not self._state.synced:
            self._metrics.fail("filter", {"not-synced": 1})
            return FilterResult(error=NOT_SYNCED)
        try:
            request = pod_request(args.pod, self._default_policy)
        except InvalidRequest as error:
            log.info("filter pod=%s refused everywhere: %s", args.pod.key, error)
            self._metrics.fail("filter", {"invalid-request": len(args.node_names)})
            self._metrics.count("filter", {"unresolvable": len(args.node_names)})
            return FilterResult(unresolvable={name: str(error) for name in args.node_names})
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        labels: Counter[str] = Counter()
        entries = self._state.entries_for(args.pod.uid, args.node_names)
        for name, entry in zip(args.node_names, entries, strict=True):
            refusal = judge(name, entry, request)
            if refusal is None:
                passed.append(name)
                continue
            (failed if refusal.resolvable else unresolvable)[name] = refusal.reason
            labels[refusal.label] += 1
        self._metrics.count("filter", {"passed": len(passed), "failed": len(failed),
                                       "unresolvable": len(unresolvable)})
        self._metrics.fail("filter", labels)
        log.debug("filter pod=%s share=%s policy=%s passed=%d failed=%d unresolvable=%d", args.pod.key,
                  request.share.describe(), request.policy.value, len(passed), len(failed), len(unresolvable))
        return FilterResult(passed=tuple(passed), failed=failed, unresolvable=unresolvable)

    def prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        """A 0..10 score per node; 0 for nodes that cannot take the pod or an invalid request."""
        try:
            request = pod_request(args.pod, self._default_policy)
        except InvalidRequest:
            return [(name, 0) for name in args.node_names]
        entries = self._state.entries_for(args.pod.uid, args.node_names)
        scores = [(name, entry.score(request.share, request.policy) if entry is not None else 0)
                  for name, entry in zip(args.node_names, entries, strict=True)]
        self._metrics.count("prioritize", {"scored": len(scores)})
        return scores


def judge(name: str, entry: NodeEntry | None, request: PodRequest) -> Refusal | None:
    """None if the node can take the pod now, else why not."""
    if entry is None:
        return Refusal("not-cached", f"node {name} is not in the fastgshare extender's cache yet", True)
    verdict = entry.verdict(request.share, request.policy)
    if verdict is None:
        return Refusal("no-inventory", entry.problem, False)
    if verdict.fits:
        return None
    empty = entry.fits_when_empty(request.share)
    if empty is not None and not empty.fits:
        return Refusal(rejection_label(empty), empty.reason, False)
    return Refusal(rejection_label(verdict), verdict.reason, True)


def rejection_label(verdict: NodeVerdict) -> str:
    """The most common reason the node's GPUs refused, as a metrics label."""
    kinds = Counter(fit.rejection for _, fit in verdict.refusals if fit.rejection is not None)
    if not kinds:
        return "no-gpus"
    order = list(Rejection)
    kind = max(kinds, key=lambda rejection: (kinds[rejection], -order.index(rejection)))
    return kind.value
