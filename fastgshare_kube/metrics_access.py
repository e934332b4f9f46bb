"""Who may read a service's ``/metrics``: Kubernetes authentication and authorisation of a bearer
token, as kube-rbac-proxy and controller-runtime's metrics filter do (issue 42, item 5).

The node agent's metrics name every pod on the node with its share and memory; the extender's and
the controllers' name pods and FaSTPods. Any pod can reach those ports, while RBAC hides the same
facts from a tenant. So a ``GET /metrics`` must carry a bearer token that the API server
authenticates (a TokenReview) and whose user the API server allows ``get`` on the non-resource URL
``/metrics`` (a SubjectAccessReview): the permission Prometheus's usual ClusterRole already has, and
``deploy/monitoring/metrics-reader.yaml`` grants. ``/healthz`` and ``/readyz`` stay open for the
kubelet's probes.

The token is read from ``Authorization: Bearer ...`` or, because the API server removes the
caller's ``Authorization`` header before it proxies a request to a pod or node (how ``fastgshare
inspect`` reaches an agent), from :data:`~fastgshare.keys.METRICS_TOKEN_HEADER`. Verdicts are
cached by the token's SHA-256 (allowed for a minute, refused for ten seconds, a bounded number of
tokens), so Prometheus's scrapes cost the API server two reviews a minute per target, and a client
sending garbage is refused from the cache. When the API server cannot be asked, the answer is 503
and nothing is cached.

:class:`MetricsAccess` decides (no I/O but through its :class:`AccessReviews` port, which
:class:`fastgshare_kube.access_reviews.KubeAccessReviews` answers from the API server);
:func:`guard_metrics` puts the decision in front of a WSGI app. This module imports no client, so a
service's HTTP edge may use it.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import attrs

from fastgshare import keys

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
ALLOWED_TTL_S = 60.0
DENIED_TTL_S = 10.0
MAX_CACHED_TOKENS = 1024
MAX_TOKEN_BYTES = 16 * 1024
DENIAL_PREFIX = "fastgshare metrics access: "  # each refusal's body begins so (inspect tells it from the API's own)
_HEADERS = ("HTTP_AUTHORIZATION", "HTTP_" + keys.METRICS_TOKEN_HEADER.upper().replace("-", "_"))


class ReviewUnavailable(Exception):
    """The API server could not be asked (down, slow, or it refused this component the review)."""


@attrs.frozen
class ReviewedUser:
    """Who a token belongs to, as a TokenReview says."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


class AccessReviews(Protocol):
    """The two questions asked of the API server."""

    def authenticate(self, token: str) -> ReviewedUser | None:
        """The token's user, None when the token is not valid; raises :class:`ReviewUnavailable`."""

    def may_get(self, user: ReviewedUser, path: str) -> tuple[bool, str]:
        """(allowed, the authoriser's reason) for ``get`` on the non-resource URL ``path``; raises
        :class:`ReviewUnavailable`."""


@attrs.frozen
class Verdict:
    """An HTTP status line and a one-line body; ``allowed`` means serve the request."""

    allowed: bool
    status: str
    message: str
    cacheable: bool = True


def bearer_token(environ: Mapping[str, Any]) -> str | None:
    """The bearer token of a WSGI request (either header), None without one."""
    for header in _HEADERS:
        scheme, _, token = str(environ.get(header, "")).strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


class MetricsAccess:
    """Decides whether a request may read ``/metrics`` (see the module), with a bounded cache."""

    def __init__(self, reviews: AccessReviews, *, path: str = METRICS_PATH, allowed_ttl_s: float = ALLOWED_TTL_S,
                 denied_ttl_s: float = DENIED_TTL_S, max_entries: int = MAX_CACHED_TOKENS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._reviews = reviews
        self._path = path
        self._ttl = {True: allowed_ttl_s, False: denied_ttl_s}
        self._max_entries = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[bytes, tuple[float, Verdict]] = collections.OrderedDict()

    def decide(self, environ: Mapping[str, Any]) -> Verdict:
        token = bearer_token(environ)
        if token is None:
            return Verdict(False, "401 Unauthorized",
                           f"{self._path} needs a bearer token (Authorization: Bearer, or "
                           f"{keys.METRICS_TOKEN_HEADER} through the API server's proxy) of an account that may "
                           f"get the non-resource URL {self._path}")
        if len(token) > MAX_TOKEN_BYTES:
            return Verdict(False, "401 Unauthorized", f"the bearer token is over {MAX_TOKEN_BYTES} bytes")
        digest = hashlib.sha256(token.encode(errors="surrogateescape")).digest()
        now = self._clock()
        with self._lock:
            cached = self._cache.get(digest)
            if cached is not None and cached[0] > now:
                self._cache.move_to_end(digest)
                return cached[1]
        verdict = self._review(token)
        if verdict.cacheable:
            with self._lock:
                self._cache[digest] = (now + self._ttl[verdict.allowed], verdict)
                self._cache.move_to_end(digest)
                while len(self._cache) > self._max_entries:
                    self._cache.popitem(last=False)
        return verdict

    def _review(self, token: str) -> Verdict:
        try:
            user = self._reviews.authenticate(token)
            if user is None:
                return Verdict(False, "401 Unauthorized", "the bearer token is not valid (TokenReview)")
            allowed, reason = self._reviews.may_get(user, self._path)
        except ReviewUnavailable as error:
            log.warning("cannot review a %s request: %s", self._path, error)
            return Verdict(False, "503 Service Unavailable", f"cannot ask the API server who may read {self._path}: "
                           f"{error}", cacheable=False)
        if not allowed:
            return Verdict(False, "403 Forbidden", f"{user.username} may not get {self._path}"
                           + (f": {reason}" if reason else ""))
        return Verdict(True, "200 OK", "")


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def guard_metrics(app: WsgiApp, access: MetricsAccess, path: str = METRICS_PATH) -> WsgiApp:
    """``app``, with every request for ``path`` first decided by ``access``."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == path:
            verdict = access.decide(environ)
            if not verdict.allowed:
                headers = [("Content-Type", "text/plain; charset=utf-8")]
                if verdict.status.startswith("401"):
                    headers.append(("WWW-Authenticate", 'Bearer realm="fastgshare"'))
                start_response(verdict.status, headers)
                return [f"{DENIAL_PREFIX}{verdict.message}\n".encode()]
        return app(environ, start_response)

    return guarded
