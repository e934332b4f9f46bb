"""The one error type of a failed Kubernetes API call, free of any client type.

:class:`ApiError` is how the layer's client calls (:mod:`fastgshare_kube.rest`) and every test fake
report a failure, so no service ever sees ``kubernetes.client.ApiException`` or a urllib3 error.
``status`` 0 means no answer at all (the API server unreachable, a dropped connection).
"""

from __future__ import annotations

UNREACHABLE = 0
NOT_FOUND = 404
CONFLICT = 409
GONE = 410
INVALID = 422


class ApiError(Exception):
    """An API call failed with HTTP ``status``; ``message`` is the server's explanation.

    ``causes`` lists ``(field, problem)`` pairs of an invalid body (422), fields as paths in the
    object sent (``spec.containers[0].image``), whether the API server or the client refused it.
    """

    def __init__(self, status: int, reason: str = "", message: str = "",
                 causes: tuple[tuple[str, str], ...] = ()) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")

    @property
    def not_found(self) -> bool:
        return self.status == NOT_FOUND

    @property
    def conflict(self) -> bool:
        return self.status == CONFLICT

    @property
    def gone(self) -> bool:
        return self.status == GONE

    @property
    def unreachable(self) -> bool:
        return self.status == UNREACHABLE


class KubeConfigError(Exception):
    """The Kubernetes layer is configured so that it cannot work (no usable kubeconfig, no namespace
    for the Lease); the message says which and how to fix it."""
