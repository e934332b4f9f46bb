"""The controller's exceptions, free of any Kubernetes client type.

:class:`ApiError` is how :mod:`.kube` (and the test fakes) report a failed API call, so the
rest of the controller never sees ``kubernetes.client.ApiException``. :class:`InvalidFaSTPod`
collects everything wrong with one FaSTPod; its message is what the ``InvalidSpec``
condition and the Warning event show.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastgshare.errors import FieldProblem

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


class ConfigError(Exception):
    """The controller is configured so that it cannot work; the message says what and how to fix it."""


class InvalidFaSTPod(Exception):
    """A FaSTPod the controller cannot turn into pods; every problem is listed.

    ``reason`` is the CamelCase reason of the ``InvalidSpec`` condition (for example
    ``InvalidShareAnnotations``); the message names each field, the bad value and what is allowed.
    """

    def __init__(self, reason: str, problems: Iterable[FieldProblem | str]) -> None:
        self.reason = reason
        self.problems = tuple(str(problem) for problem in problems)
        super().__init__("; ".join(self.problems))
