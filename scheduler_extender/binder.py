"""Bind: pick the pod's GPU, then create a Binding that carries the assignment: one API write a pod.

The steps, and why in this order:

1. Take the pod as the extender's watch last showed it (:meth:`ClusterState.pending_pod
   <scheduler_extender.state.ClusterState.pending_pod>`): not bound, with the uid the scheduler
   named, and not bound by a bind of ours the watch has not shown yet. Only when the cache does not
   have it so is it read from the API server (a GET). A pod already bound to this node with our
   assignment is a retried bind: success. A pod may be bound only to a node that our filter
   passed for it (``passes``): the scheduler placed it there through this extender, after its own
   filters (selectors, taints). Anything else is refused before any write (issue 15, defect 10).
2. Reserve a GPU in the cache (policy choice against the ledgers including binds in flight).
   Reserving happens before any waiting or writing, so the pods the scheduler places next see
   the share as taken; the cache's lock makes choice and reservation one step, so concurrent
   binds never over-commit a GPU.
3. Wait for room in the node's window (only with ``bind_wait_s`` > 0). Binds to one node go in
   arrival order, each once fewer than ``bind_window`` pods of the node are being written or
   wait for the node agent to mark them allocated (bounded by ``bind_wait_s``; then it proceeds
   and says so in the log). Exactness does not need the window: the agent's Allocate knows
   which pod it serves from kubelet's record and the order pods arrived on the node
   (docs/architecture.md, "Exact Allocate"), and a pod kubelet admits out of that order (after a
   kubelet restart) is stopped at ``PreStartContainer`` and replaced. The window keeps a node
   whose agent or kubelet is down from taking pods kubelet refuses meanwhile; a window of 1 is
   for agents without kubelet's PodResources API.
4. Create the Binding with the assignment and its signature (our key, over the pod's uid, node,
   GPU and share: :mod:`fastgshare.assignment_signature`) in its ``metadata.annotations``: the API
   server sets the pod's node and copies the annotations onto the pod in one write, so a pod is
   never bound without its assignment nor assigned without being bound. The Binding names the pod's uid and
   the resourceVersion it was read at, which API servers check from 1.23 on (kubernetes PR
   105913): a pod replaced, or changed (its share, say), since it was read is answered 409, and
   on 409 the pod is re-read: one that was replaced, bound meanwhile or whose share changed is
   refused, else the Binding is sent again at the new resourceVersion. Older API servers, like
   the v1.20 test tier, check only that the pod is not bound yet: a share edited in the
   milliseconds between read and bind is then taken up after the bind as a live share change
   (:mod:`scheduler_extender.share_changes`).

Any failure releases the reservation: a Binding that failed wrote nothing. One answered with an
error other than 404 is checked first: one that took effect anyway (a timeout after the write)
counts as done if the pod is bound to the node with exactly the assignment this bind wrote, so
a bound pod never loses its share on the ledger.
"""

from __future__ import annotations

import logging
import time

from fastgshare import keys
from fastgshare.codec import PodAssignment, encode_assignment
from fastgshare.placement import Policy
from scheduler_extender.decisions import InvalidRequest, pod_request
from scheduler_extender.metrics import Metrics
from scheduler_extender.passes import FilterPasses
from scheduler_extender.placements import pod_assignment
from scheduler_extender.ports import ApiConflict, ApiFailure, KubePort, PodNotFound
from scheduler_extender.records import PodRecord
from scheduler_extender.state import BindOutcome, ClusterState, Reservation, ReservationRefused
from scheduler_extender.wire import BindingArgs

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5


class BindRefused(Exception):
    """The pod cannot be bound; ``label`` is the metrics reason, the message the user's."""

    def __init__(self, label: str, message: str) -> None:
        super().__init__(message)
        self.label = label


class Binder:
    """Carries out the scheduler's bind requests."""

    def __init__(self, state: ClusterState, kube: KubePort, *, default_policy: Policy, bind_wait_s: float,
                 metrics: Metrics, passes: FilterPasses) -> None:
        self._state = state
        self._passes = passes
        self._kube = kube
        self._default_policy = default_policy
        self._bind_wait_s = bind_wait_s
        self._metrics = metrics

    def bind(self, args: BindingArgs) -> str:
        """Empty if the pod is bound to ``args.node``, else why it is not (for ``Error``)."""
        try:
            pod = self._pod_to_bind(args)
            if pod is None:
                return ""
            self._check_filtered(pod, args.node)
            reservation = self._reserve(pod, args.node)
            self._write(reservation, pod)
            self._passes.forget(pod.uid)
        except BindRefused as error:
            log.warning("bind pod=%s node=%s refused: %s", args.pod_key, args.node, error)
            self._metrics.count("bind", {"refused": 1})
            self._metrics.fail("bind", {error.label: 1})
            return f"fastgshare: {error}"
        self._metrics.count("bind", {"bound": 1})
        return ""

    def _pod_to_bind(self, args: BindingArgs) -> PodRecord | None:
        """The pod to bind, or None if it is already bound there by us."""
        if args.pod_uid:
            cached = self._state.pending_pod(args.pod_key, args.pod_uid)
            if cached is not None:
                return cached
        try:
            pod = self._kube.read_pod(args.pod_namespace, args.pod_name)
        except ApiFailure as error:
            raise BindRefused("api-error", f"reading pod {args.pod_key} failed: {error}") from None
        if pod is None:
            raise BindRefused("pod-gone", f"pod {args.pod_key} no longer exists")
        if args.pod_uid and pod.uid != args.pod_uid:
            raise BindRefused("pod-replaced", f"pod {args.pod_key} was replaced (uid {pod.uid}, not {args.pod_uid})")
        if pod.node_name:
            if pod.node_name == args.node and _assigned_node(pod, self._state) == args.node:
                log.info("bind pod=%s node=%s already bound, nothing to do", pod.key, args.node)
                return None
            raise BindRefused("already-bound", f"pod {pod.key} is already bound to node {pod.node_name}")
        return pod

    def _check_filtered(self, pod: PodRecord, node: str) -> None:
        """Bind only where the scheduler placed the pod through our filter (issue 15, defect 10)."""
        reason = self._passes.refusal(pod.uid, node)
        if reason is not None:
            raise BindRefused("not-filtered", f"pod {pod.key} did not pass the fastgshare extender's filter for node "
                                              f"{node} ({reason}); only nodes the filter passed may be bound")

    def _reserve(self, pod: PodRecord, node: str) -> Reservation:
        try:
            request = pod_request(pod, self._default_policy)
            return self._state.reserve(uid=pod.uid, pod_key=pod.key, node=node, share=request.share,
                                       policy=request.policy, model=request.model)
        except InvalidRequest as error:
            raise BindRefused("invalid-request", str(error)) from None
        except ReservationRefused as error:
            raise BindRefused("no-room", f"node {node}: {error}") from None

    def _write(self, reservation: Reservation, pod: PodRecord) -> None:
        """Take the node's turn, bind with the assignment; always end the reservation."""
        outcome = BindOutcome.RELEASED
        try:
            self._take_turn(reservation)
            self._bind_with_assignment(reservation, pod)
            outcome = BindOutcome.BOUND
        finally:
            self._state.finish_bind(reservation.uid, reservation.node, outcome)
        log.info("bound pod=%s node=%s gpu=%s index=%d share=%s", reservation.pod_key, reservation.node,
                 reservation.gpu_uuid, reservation.gpu_index, reservation.share.describe())

    def _take_turn(self, reservation: Reservation) -> None:
        started = time.monotonic()
        if not self._state.wait_turn(reservation.uid, reservation.node, self._bind_wait_s):
            log.warning("bind pod=%s node=%s proceeding without its turn: the pods bound to the node before it "
                        "were not marked allocated within %.1fs (is the node agent running?)", reservation.pod_key,
                        reservation.node, self._bind_wait_s)
        self._metrics.bind_turn_wait.observe(time.monotonic() - started)

    def _bind_with_assignment(self, reservation: Reservation, pod: PodRecord) -> None:
        """One Binding that sets the node and the assignment; re-read and retry on conflicts."""
        assigned_at_ms = self._state.now_ms()  # the cache's clock: turns compare against it
        self._state.stamp(reservation.uid, assigned_at_ms)
        assignment = PodAssignment(
            node_name=reservation.node, gpu_uuid=reservation.gpu_uuid, gpu_index=reservation.gpu_index,
            share=reservation.share, assigned_at_ms=assigned_at_ms)
        payload = encode_assignment(assignment)
        annotations = {keys.POD_ASSIGNMENT_ANNOTATION: payload}
        signature = self._state.trust.sign(reservation.uid, assignment)
        if signature is not None:
            annotations[keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION] = signature
        node = reservation.node
        for _ in range(CONFLICT_RETRIES):
            try:
                self._kube.create_binding(pod, node, annotations)
                return
            except ApiConflict:
                current = self._reread(pod, reservation, payload)
                if current is None:
                    log.info("pod=%s binding to node=%s reported a conflict but took effect", pod.key, node)
                    return
                pod = current
            except PodNotFound:
                raise BindRefused("pod-gone", f"pod {pod.key} was deleted during the bind") from None
            except ApiFailure as error:
                if self._binding_landed(pod, node, payload):
                    log.info("pod=%s binding to node=%s reported %s but took effect", pod.key, node, error)
                    return
                raise BindRefused("api-error", f"binding pod {pod.key} to node {node} failed: {error}") from None
        raise BindRefused("conflict", f"pod {pod.key} kept changing; gave up after {CONFLICT_RETRIES} conflicts")

    def _reread(self, pod: PodRecord, reservation: Reservation, payload: str) -> PodRecord | None:
        """The pod again after a conflict, if it is still the one we reserved for and not bound;
        None if it is bound to the node with this bind's assignment (the Binding took effect)."""
        try:
            current = self._kube.read_pod(pod.namespace, pod.name)
        except ApiFailure as error:
            raise BindRefused("api-error", f"re-reading pod {pod.key} failed: {error}") from None
        if current is None or current.uid != pod.uid:
            raise BindRefused("pod-gone", f"pod {pod.key} was deleted or replaced during the bind")
        if current.node_name:
            if _carries(current, reservation.node, payload):
                return None
            raise BindRefused("already-bound", f"pod {pod.key} was bound to node {current.node_name} meanwhile")
        try:
            request = pod_request(current, self._default_policy)
        except InvalidRequest as error:
            raise BindRefused("invalid-request", str(error)) from None
        if request.share != reservation.share:
            raise BindRefused("conflict", f"the share of pod {pod.key} changed during the bind")
        if request.model != reservation.model:
            raise BindRefused("conflict", f"the model of pod {pod.key} changed during the bind")
        log.info("pod=%s conflict binding, retrying", pod.key)
        return current

    def _binding_landed(self, pod: PodRecord, node: str, payload: str) -> bool:
        """Whether a binding whose answer was an error (a timeout, say) was carried out anyway."""
        try:
            current = self._kube.read_pod(pod.namespace, pod.name)
        except ApiFailure:
            return False
        return current is not None and current.uid == pod.uid and _carries(current, node, payload)


def _carries(pod: PodRecord, node: str, payload: str) -> bool:
    """The pod is bound to ``node`` with exactly the assignment ``payload`` (this bind's write)."""
    return pod.node_name == node and pod.assignment_text == payload


def _assigned_node(pod: PodRecord, state: ClusterState) -> str | None:
    assignment = pod_assignment(pod, state.trust)
    return assignment.node_name if assignment is not None else None
