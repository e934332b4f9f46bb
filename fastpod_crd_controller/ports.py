"""The narrow interfaces the controller writes through; :mod:`.kube` implements them for real.

Bodies are plain dicts as the API serves them. Failures are
:class:`~fastgshare_kube.errors.ApiError`. Tests pass in-memory fakes that record
the calls, as client-go's fake clientset does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fastgshare_kube.leader import LeasePort  # noqa: F401 - the Lease calls, re-exported


class KubePort(Protocol):
    """Pod, FaSTPod-status and event writes."""

    def create_pod(self, namespace: str, body: Mapping[str, Any], *, checked: bool = False) -> dict[str, Any]:
        """Create a pod; returns the created object (with the generated name). ``checked``: the same
        body was created before, so the client may skip its own check of the body (the API server
        still validates it)."""
        ...

    def patch_pod(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        """JSON-merge-patch a pod (``metadata.uid`` in ``body`` makes it fail if the pod was replaced)."""
        ...

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a pod, only if it still has ``uid`` (a precondition)."""
        ...

    def patch_fastpod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch ``status`` through the FaSTPod's status subresource."""
        ...

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...

    def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None: ...


class EventPort(Protocol):
    """Where the controller records events on FaSTPods (:mod:`.events`)."""

    def event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Record a ``kind`` (Normal, Warning) event on ``obj``; never raises for a failed write."""
        ...


class ReconcileObserver(Protocol):
    """Hears what the workers do, for the metrics (:class:`~fastpod_crd_controller.metrics.ControllerMetrics`)."""

    def reconciled(self, result: str, seconds: float) -> None:
        """One reconcile finished with ``result`` (synced, invalid, gone, error) after ``seconds``."""
        ...

    def retried(self) -> None: ...

    def queue_waited(self, seconds: float) -> None: ...


class NoObserver:
    """The observer when nobody listens."""

    def reconciled(self, result: str, seconds: float) -> None:
        pass

    def retried(self) -> None:
        pass

    def queue_waited(self, seconds: float) -> None:
        pass
