"""The controller's exceptions, free of any Kubernetes client type.

:class:`ApiError` (the one API error type of :mod:`fastgshare_kube.errors`) is how the Kubernetes
layer and the test fakes report a failed API call, so the controller never sees
``kubernetes.client.ApiException``. :class:`InvalidFaSTPod` collects everything wrong with one
FaSTPod; its message is what the ``InvalidSpec`` condition and the Warning event show.
"""

from __future__ import annotations

from collections.abc import Iterable

from fastgshare.errors import FieldProblem
from fastgshare_kube.errors import CONFLICT, GONE, INVALID, NOT_FOUND, ApiError  # noqa: F401 - re-exported
from fastgshare_kube.errors import KubeConfigError as ConfigError  # noqa: F401 - re-exported

# ConfigError: the controller is configured so that it cannot work (no usable kubeconfig, no Lease
# namespace); the message says what and how to fix it.


class InvalidFaSTPod(Exception):
    """A FaSTPod the controller cannot turn into pods; every problem is listed.

    ``reason`` is the CamelCase reason of the ``InvalidSpec`` condition (for example
    ``InvalidShareAnnotations``); the message names each field, the bad value and what is allowed.
    """

    def __init__(self, reason: str, problems: Iterable[FieldProblem | str]) -> None:
        self.reason = reason
        self.problems = tuple(str(problem) for problem in problems)
        super().__init__("; ".join(self.problems))
