"""The API server's answers to "who is this token?" (TokenReview) and "may they get this URL?"
(SubjectAccessReview): the :class:`~fastgshare_kube.metrics_access.AccessReviews` port of
:class:`~fastgshare_kube.metrics_access.MetricsAccess`, asked with the component's own account,
which needs ClusterRole ``system:auth-delegator``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastgshare_kube import rest
from fastgshare_kube.client import ApiClient
from fastgshare_kube.errors import ApiError
from fastgshare_kube.metrics_access import MetricsAccess, ReviewedUser, ReviewUnavailable

REVIEW_TIMEOUT_S = 5.0


class KubeAccessReviews:
    """:class:`AccessReviews` on the API server: ``tokenreviews`` and ``subjectaccessreviews``,
    which the component's own account may create (ClusterRole ``system:auth-delegator``)."""

    def __init__(self, api: ApiClient, *, timeout_s: float = REVIEW_TIMEOUT_S) -> None:
        self._api = api
        self._timeout_s = timeout_s

    def authenticate(self, token: str) -> ReviewedUser | None:
        status = self._create("/apis/authentication.k8s.io/v1/tokenreviews",
                              {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                               "spec": {"token": token}}).get("status") or {}
        if not status.get("authenticated"):
            return None
        user = status.get("user") or {}
        extra = user.get("extra") or {}
        return ReviewedUser(username=str(user.get("username", "")), uid=str(user.get("uid", "")),
                            groups=tuple(user.get("groups") or ()),
                            extra=tuple(sorted((str(name), tuple(values or ())) for name, values in extra.items())))

    def may_get(self, user: ReviewedUser, path: str) -> tuple[bool, str]:
        spec: dict[str, Any] = {"user": user.username, "groups": list(user.groups),
                                "nonResourceAttributes": {"path": path, "verb": "get"}}
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = {name: list(values) for name, values in user.extra}
        status = self._create("/apis/authorization.k8s.io/v1/subjectaccessreviews",
                              {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                               "spec": spec}).get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason", ""))

    def _create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return rest.send(self._api, "POST", path, body, timeout_s=self._timeout_s)
        except ApiError as error:
            hint = (" (the component's account needs ClusterRole system:auth-delegator)"
                    if error.status == 403 else "")
            raise ReviewUnavailable(f"{path}: {error}{hint}") from None
        except OSError as error:
            raise ReviewUnavailable(f"{path}: {error}") from None


def kubernetes_metrics_access(api: ApiClient) -> MetricsAccess:
    """The access every component serves its ``/metrics`` with under ``--metrics-auth kubernetes``."""
    return MetricsAccess(KubeAccessReviews(api))
