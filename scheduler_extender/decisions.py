"""Filter and prioritize: which candidate nodes can take the pod, and how much the policy likes each.

The pod's share comes from its annotations (:func:`fastgshare.share.parse_share`) and its
policy from ``fastgshare/scheduling_policy`` or the extender's default; its model from
``fastgshare/model`` (:attr:`~scheduler_extender.records.PodRecord.model`): a GPU already holding
it is charged only the pod's own memory, and the policies prefer such GPUs
(:mod:`fastgshare.placement`). A malformed model annotation is refused like a malformed share
(unresolvable everywhere, with the parser's line): admission refuses both when the pod is made,
and the pod's weights could never be served (the node agent reads the same annotation). The
judging itself is
the core's (:func:`fastgshare.placement.evaluate_node` and ``score_node``) on the cache's
ledgers, which include binds in flight.

Where a rejected node goes:

- ``FailedAndUnresolvableNodes`` when waiting cannot help: an invalid share, policy or model (every
  node, with the parser's message), no usable inventory, or a pod that would not fit even on
  the node emptied of pods (too much memory for any GPU, every GPU unhealthy);
- ``FailedNodes`` when it may fit later: the GPUs are taken now, or the node is not in the
  cache yet.

Which fitting nodes pass: by default only those the policy scores highest (``best_only``), so
filter makes the choice. Under ``binpack`` that is one node in most cases (the fullest that
fits), and a scheduler left with one node binds it without scoring: it skips its own score
plugins and the prioritize call. Nodes tied for the best score all pass, and the scheduler's
plugins (preferred affinities, spreading) break the tie. With ``best_only`` off every fitting
node passes and prioritize ranks them, so a configuration that weighs the extender lightly lets
those plugins outvote a small difference in GPU score. A fitting node that was outscored is
left out of the reply (not listed as failed: the pod can be placed, and the list would grow the
reply with every node).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence

import attrs

from fastgshare import keys
from fastgshare.errors import InvalidPolicy, InvalidShareSpec
from fastgshare.ledger import Rejection
from fastgshare.model import ModelRef
from fastgshare.placement import NodeVerdict, Policy, parse_policy
from fastgshare.share import ShareSpec, parse_share
from scheduler_extender.metrics import Metrics
from scheduler_extender.nodes import NodeEntry
from scheduler_extender.passes import FilterPasses
from scheduler_extender.records import PodRecord, model_problem
from scheduler_extender.state import ClusterState
from scheduler_extender.wire import (
    ExtenderArgs,
    FilterResult,
    encode_filter_result,
    priorities_json,
    priorities_text,
    priority_fragment,
)

log = logging.getLogger(__name__)

_NO_POD = PodRecord(uid="", namespace="", name="", node_name="", phase="", annotations={})  # encoding needs names only
NOT_SYNCED = "the fastgshare extender's cache has not synced with the API server yet; retrying"


class InvalidRequest(Exception):
    """The pod's share or policy annotation is invalid; the message is the parser's."""


@attrs.frozen
class PodRequest:
    """What the pod asks for and how to place it."""

    share: ShareSpec
    policy: Policy
    model: ModelRef | None = None


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
    problem = model_problem(pod)
    if problem is not None:
        raise InvalidRequest(problem)
    return PodRequest(share, policy, pod.model)


@attrs.frozen
class Refusal:
    """Why one node cannot take the pod: a metrics label, the sentence, and whether waiting helps."""

    label: str
    reason: str
    resolvable: bool


@attrs.frozen
class NodeAnswer:
    """What filter and prioritize say about one node for one pod: a refusal (None: it fits) and a score."""

    refusal: Refusal | None
    score: int


ANSWER_LIMIT = 100_000  # remembered (share, policy, model, node signature) answers, all together
CHAIN_LIMIT = 64  # remembered evaluations per verb, one per (share, policy, model)
DELTA_FRACTION = 4  # patch an evaluation while at most 1/4 of its nodes changed; else start afresh


@attrs.frozen
class _Evaluation:
    """The answers for one list of nodes at one cache generation, and the encoded reply."""

    generation: int
    names: tuple[str, ...]
    answers: list[NodeAnswer]
    positions: dict[str, int] | None  # name -> index, built when the first change is patched in
    result: FilterResult | None  # filter only
    labels: dict[str, int]
    body: bytes
    fragments: list[str] | None = None  # prioritize only: each node's part of the body
    outscored: int = 0  # filter only: fitting nodes left out because others scored higher


class Decisions:
    """Answers filter and prioritize from the cache.

    Three levels of memory keep a request cheap at thousands of nodes, none of which can change
    an answer: the ledgers' own fit memo (:mod:`fastgshare.ledger`); one :class:`NodeAnswer` per
    request (share, policy, model) and node signature, so each distinct node state is judged once for a share
    however many nodes share it, across cache rebuilds; and per verb and (share, policy) the last
    evaluation (every node's answer and the encoded reply) per request with its cache generation. A request
    for the same nodes at the same generation is answered with that reply (the pods of one
    FaSTPod, or a prioritize after its filter); at a later generation, only the nodes the cache
    says changed since (:meth:`ClusterState.changed_entries`) are judged again. A pod whose own
    unbound assignment is in the cache is judged afresh (its node is judged without it).
    """

    def __init__(self, state: ClusterState, default_policy: Policy, metrics: Metrics,
                 passes: FilterPasses | None = None, *, best_only: bool = True) -> None:
        self._state = state
        self._best_only = best_only
        self._default_policy = default_policy
        self._metrics = metrics
        self._passes = passes if passes is not None else FilterPasses()
        self._answers: dict[PodRequest, dict[int, NodeAnswer]] = {}
        self._answer_count = 0
        self._chains: dict[str, OrderedDict[PodRequest, _Evaluation]] = {
            "filter": OrderedDict(), "prioritize": OrderedDict()}
        self._lock = threading.Lock()  # guards the chains

    def filter(self, args: ExtenderArgs) -> FilterResult:
        """The nodes that can take the pod now; bind will bind it only to one of them."""
        return self._filter_evaluation(args)[0]

    def filter_body(self, args: ExtenderArgs) -> bytes:
        """:meth:`filter`, encoded as the JSON answer (``ExtenderFilterResult``)."""
        result, body = self._filter_evaluation(args)
        return body if body is not None else _dumps(encode_filter_result(args, result))

    def _filter_evaluation(self, args: ExtenderArgs) -> tuple[FilterResult, bytes | None]:
        if not self._state.synced:
            self._metrics.fail("filter", {"not-synced": 1})
            result = FilterResult(error=NOT_SYNCED)
        else:
            try:
                request = pod_request(args.pod, self._default_policy)
            except InvalidRequest as error:
                log.info("filter pod=%s refused everywhere: %s", args.pod.key, error)
                self._metrics.fail("filter", {"invalid-request": len(args.node_names)})
                self._metrics.count("filter", {"unresolvable": len(args.node_names)})
                result = FilterResult(unresolvable={name: str(error) for name in args.node_names})
            else:
                evaluation = self._evaluate("filter", args, request)
                if evaluation.result is None:  # pragma: no cover - filter evaluations carry their result
                    raise AssertionError("a filter evaluation without its result")
                result = evaluation.result
                self._metrics.count("filter", {"passed": len(result.passed), "failed": len(result.failed),
                                               "unresolvable": len(result.unresolvable),
                                               "outscored": evaluation.outscored})
                self._metrics.fail("filter", evaluation.labels)
                log.debug("filter pod=%s share=%s policy=%s passed=%d outscored=%d failed=%d unresolvable=%d",
                          args.pod.key, request.share.describe(), request.policy.value, len(result.passed),
                          evaluation.outscored, len(result.failed), len(result.unresolvable))
                self._passes.record(args.pod.uid, result.passed)
                return result, evaluation.body if args.node_cache_capable else None
        self._passes.record(args.pod.uid, result.passed)
        return result, None

    def prioritize(self, args: ExtenderArgs) -> list[tuple[str, int]]:
        """A 0..10 score per node; 0 for nodes that cannot take the pod or an invalid request."""
        try:
            request = pod_request(args.pod, self._default_policy)
        except InvalidRequest:
            return [(name, 0) for name in args.node_names]
        evaluation = self._evaluate("prioritize", args, request)
        self._metrics.count("prioritize", {"scored": len(args.node_names)})
        return [(name, answer.score) for name, answer in zip(args.node_names, evaluation.answers, strict=True)]

    def prioritize_body(self, args: ExtenderArgs) -> bytes:
        """:meth:`prioritize`, encoded as the JSON answer (``HostPriorityList``)."""
        try:
            request = pod_request(args.pod, self._default_policy)
        except InvalidRequest:
            return priorities_json([(name, 0) for name in args.node_names])
        evaluation = self._evaluate("prioritize", args, request)
        self._metrics.count("prioritize", {"scored": len(args.node_names)})
        return evaluation.body

    # --- evaluations -------------------------------------------------------------------------
    def _evaluate(self, verb: str, args: ExtenderArgs, request: PodRequest) -> _Evaluation:
        names = args.node_names
        generation, stale = self._state.generation_for(args.pod.uid)
        key = request
        chains = self._chains[verb]
        with self._lock:
            last = chains.get(key)
        if stale is None and last is not None and last.names == names:
            if last.generation == generation:
                return last
            patched = self._patched(verb, last, request)
            if patched is not None:
                return self._keep(chains, key, patched)
        entries, generation = self._state.entries_and_generation(args.pod.uid, names)
        evaluation = _finish(verb, generation, names, self._node_answers(entries, names, request), None,
                             best_only=self._best_only)
        return evaluation if stale is not None else self._keep(chains, key, evaluation)

    def _patched(self, verb: str, last: _Evaluation, request: PodRequest) -> _Evaluation | None:
        """``last`` brought to the cache's generation by judging only the nodes changed since, if few did."""
        delta = self._state.changed_entries(last.generation)
        if delta is None or len(delta[1]) * DELTA_FRACTION > len(last.names):
            return None
        generation, changed = delta
        positions = last.positions
        if positions is None:
            positions = {name: index for index, name in enumerate(last.names)}
        changed_names = [name for name in changed if name in positions]
        fresh = self._node_answers([changed[name] for name in changed_names], changed_names, request)
        answers = last.answers
        moved = [(positions[name], answer) for name, answer in zip(changed_names, fresh, strict=True)
                 if answer != answers[positions[name]]]
        if verb == "filter" and not self._best_only and all(
                answer.refusal == answers[index].refusal for index, answer in moved):
            moved = []  # a filter reply passing every fitting node shows refusals only, not scores
        if not moved:
            return attrs.evolve(last, generation=generation, positions=positions)
        answers = list(answers)
        for index, answer in moved:
            answers[index] = answer
        if verb == "prioritize" and last.fragments is not None:
            fragments = list(last.fragments)
            for index, answer in moved:
                fragments[index] = priority_fragment(last.names[index], answer.score)
            return _Evaluation(generation, last.names, answers, positions, None, {}, priorities_text(fragments),
                               fragments)
        return _finish(verb, generation, last.names, answers, positions, best_only=self._best_only)

    def _keep(self, chains: OrderedDict[PodRequest, _Evaluation], key: PodRequest,
              evaluation: _Evaluation) -> _Evaluation:
        with self._lock:
            current = chains.get(key)
            if current is None or current.generation <= evaluation.generation:
                chains[key] = evaluation
                chains.move_to_end(key)
                while len(chains) > CHAIN_LIMIT:
                    chains.popitem(last=False)
        return evaluation

    def _node_answers(self, entries: Sequence[NodeEntry | None], names: Sequence[str],
                      request: PodRequest) -> list[NodeAnswer]:
        """One answer per node, from the answers remembered per node signature where possible."""
        table = self._answers.get(request)
        if table is None:
            table = self._answers.setdefault(request, {})
        answers: list[NodeAnswer] = []
        append = answers.append
        for name, entry in zip(names, entries, strict=True):
            if entry is None:
                append(NodeAnswer(Refusal("not-cached", f"node {name} is not in the fastgshare extender's cache yet",
                                          True), 0))
                continue
            signature = entry.signature
            answer = table.get(signature) if signature is not None else None
            if answer is None:
                answer = node_answer(name, entry, request)
                if signature is not None:
                    if self._answer_count >= ANSWER_LIMIT:
                        self._answers.clear()
                        self._answer_count = 0
                        table = self._answers.setdefault(request, {})
                    table[signature] = answer
                    self._answer_count += 1
            append(answer)
        return answers


def _finish(verb: str, generation: int, names: tuple[str, ...], answers: list[NodeAnswer],
            positions: dict[str, int] | None, *, best_only: bool) -> _Evaluation:
    """The evaluation of ``answers``: the reply (and for filter the result and its metrics labels;
    with ``best_only`` the fitting nodes pass only if no fitting node scored higher)."""
    if verb == "prioritize":
        fragments = [priority_fragment(name, answer.score) for name, answer in zip(names, answers, strict=True)]
        return _Evaluation(generation, names, answers, positions, None, {}, priorities_text(fragments), fragments)
    passed: list[str] = []
    scores: list[int] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    labels: dict[str, int] = {}
    for name, answer in zip(names, answers, strict=True):
        refusal = answer.refusal
        if refusal is None:
            passed.append(name)
            scores.append(answer.score)
            continue
        (failed if refusal.resolvable else unresolvable)[name] = refusal.reason
        labels[refusal.label] = labels.get(refusal.label, 0) + 1
    fitting = len(passed)
    if best_only and fitting > 1:
        best = max(scores)
        passed = [name for name, score in zip(passed, scores, strict=True) if score == best]
    result = FilterResult(passed=tuple(passed), failed=failed, unresolvable=unresolvable)
    body = _dumps(encode_filter_result(ExtenderArgs(pod=_NO_POD, node_names=names), result))
    return _Evaluation(generation, names, answers, positions, result, labels, body, outscored=fitting - len(passed))


def node_answer(name: str, entry: NodeEntry, request: PodRequest) -> NodeAnswer:
    """Judge and score one node for the pod (what the remembered answers hold)."""
    refusal = judge(name, entry, request)
    return NodeAnswer(refusal, entry.score(request.share, request.policy, request.model) if refusal is None else 0)


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def judge(name: str, entry: NodeEntry | None, request: PodRequest) -> Refusal | None:
    """None if the node can take the pod now, else why not."""
    if entry is None:
        return Refusal("not-cached", f"node {name} is not in the fastgshare extender's cache yet", True)
    verdict = entry.verdict(request.share, request.policy, request.model)
    if verdict is None:
        return Refusal("no-inventory", entry.problem, False)
    if verdict.fits:
        return None
    empty = entry.fits_when_empty(request.share, request.model)
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
