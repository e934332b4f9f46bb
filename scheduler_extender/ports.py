"""What bind needs from the API server, as a narrow interface, and the failures it reports.

:class:`scheduler_extender.kube.KubeApi` implements it over the kubernetes client; tests use
an in-memory fake. Keeping the port this small keeps bind's logic testable without a cluster.
"""

from __future__ import annotations

from typing import Protocol

from scheduler_extender.records import PodRecord


class ApiConflict(Exception):
    """The object changed since it was read (HTTP 409): re-read and decide again."""


class PodNotFound(Exception):
    """The pod no longer exists (HTTP 404)."""


class ApiFailure(Exception):
    """Any other failure of an API call; the message gives the status and the server's words."""


class KubePort(Protocol):
    def read_pod(self, namespace: str, name: str) -> PodRecord | None:
        """The pod as the API server has it now, or None if there is none."""
        ...

    def patch_pod_annotation(self, pod: PodRecord, key: str, value: str | None) -> PodRecord:
        """Set (``value``) or remove (None) one annotation, only if the pod is still at
        ``pod.resource_version``; returns the updated pod."""
        ...

    def create_binding(self, pod: PodRecord, node: str) -> None:
        """Bind the pod to ``node`` (newer API servers also check ``pod.uid``)."""
        ...
