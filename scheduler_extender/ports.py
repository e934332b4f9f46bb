"""What bind needs from the API server, as a narrow interface, and the failures it reports.

:class:`scheduler_extender.kube.KubeApi` implements it over the kubernetes client; tests use
an in-memory fake. Keeping the port this small keeps bind's logic testable without a cluster. The
port's failures are the Kubernetes layer's one API error type, sorted into what bind does with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from fastgshare_kube.errors import CONFLICT, NOT_FOUND, ApiError
from scheduler_extender.records import PodRecord


class _PortError(ApiError):
    """An :class:`~fastgshare_kube.errors.ApiError` (the layer's one API error type) as bind sees it:
    its text is the explanation alone, as bind's answers quote it."""

    status_code = 0
    reason_text = ""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(self.status_code if status is None else status, self.reason_text, message)

    def __str__(self) -> str:
        return self.message


class ApiConflict(_PortError):
    """The object changed since it was read (HTTP 409): re-read and decide again."""

    status_code, reason_text = CONFLICT, "Conflict"


class PodNotFound(_PortError):
    """The pod no longer exists (HTTP 404)."""

    status_code, reason_text = NOT_FOUND, "NotFound"


class ApiFailure(_PortError):
    """Any other failure of an API call (``status`` 0: no answer); the message gives the status and the
    server's words."""


class KubePort(Protocol):
    def read_pod(self, namespace: str, name: str) -> PodRecord | None:
        """The pod as the API server has it now, or None if there is none."""
        ...

    def patch_pod_annotation(self, pod: PodRecord, key: str, value: str | None) -> PodRecord:
        """Set (``value``) or remove (None) one annotation, only if the pod is still at
        ``pod.resource_version``; returns the updated pod."""
        ...

    def patch_pod_annotations(self, pod: PodRecord, annotations: Mapping[str, str | None]) -> PodRecord:
        """:meth:`patch_pod_annotation` for several annotations in one write."""
        ...

    def create_binding(self, pod: PodRecord, node: str, annotations: Mapping[str, str] | None = None) -> None:
        """Bind the pod to ``node`` and set ``annotations`` on it, in one write (the API server copies a
        Binding's annotations onto the pod). API servers from 1.23 on also check that the pod is still
        ``pod.uid`` at ``pod.resource_version`` (409 if not); older ones check only that it is not bound."""
        ...
