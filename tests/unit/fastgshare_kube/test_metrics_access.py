"""Who may read /metrics (issue 42, item 5): a bearer token the API server authenticates, of a user
allowed get on /metrics; verdicts cached by the token's hash, failures of the API never cached."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from fastgshare import keys
from fastgshare_kube.metrics_access import (
    DENIAL_PREFIX,
    MetricsAccess,
    ReviewedUser,
    ReviewUnavailable,
    bearer_token,
    guard_metrics,
)

READER = ReviewedUser("system:serviceaccount:monitoring:prometheus", uid="u-1", groups=("system:serviceaccounts",))
TENANT = ReviewedUser("system:serviceaccount:team-b:default")


class FakeReviews:
    """Tokens "reader" and "tenant" are valid; only the reader may get /metrics."""

    def __init__(self) -> None:
        self.authentications: list[str] = []
        self.authorizations: list[tuple[str, str]] = []
        self.down = False

    def authenticate(self, token: str) -> ReviewedUser | None:
        self.authentications.append(token)
        if self.down:
            raise ReviewUnavailable("connection refused")
        return {"reader": READER, "tenant": TENANT}.get(token)

    def may_get(self, user: ReviewedUser, path: str) -> tuple[bool, str]:
        self.authorizations.append((user.username, path))
        allowed = user == READER and path == "/metrics"
        return allowed, "" if allowed else "no RBAC policy matched"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def environ(token: str | None = None, header: str = "HTTP_AUTHORIZATION", path: str = "/metrics") -> dict[str, Any]:
    found: dict[str, Any] = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
    if token is not None:
        found[header] = f"Bearer {token}"
    return found


def test_without_a_token_the_answer_is_401_naming_what_is_needed() -> None:
    reviews = FakeReviews()
    verdict = MetricsAccess(reviews).decide(environ())
    assert (verdict.allowed, verdict.status) == (False, "401 Unauthorized")
    assert "bearer token" in verdict.message
    assert "/metrics" in verdict.message
    assert reviews.authentications == []  # nothing asked of the API server


@pytest.mark.parametrize(("token", "status"), [("garbage", "401 Unauthorized"), ("tenant", "403 Forbidden"),
                                               ("reader", "200 OK")])
def test_the_token_is_authenticated_then_authorised_for_get_on_metrics(token: str, status: str) -> None:
    verdict = MetricsAccess(FakeReviews()).decide(environ(token))
    assert verdict.status == status
    assert verdict.allowed is (status == "200 OK")
    if token == "tenant":
        assert TENANT.username in verdict.message
        assert "no RBAC policy matched" in verdict.message


def test_the_token_may_come_in_the_header_the_api_servers_proxy_keeps() -> None:
    header = "HTTP_" + keys.METRICS_TOKEN_HEADER.upper().replace("-", "_")
    assert bearer_token(environ("reader", header=header)) == "reader"
    assert MetricsAccess(FakeReviews()).decide(environ("reader", header=header)).allowed
    assert bearer_token({"HTTP_AUTHORIZATION": "Basic dXNlcjpwYXNz"}) is None  # not a bearer token


def test_verdicts_are_cached_allowed_a_minute_refused_ten_seconds() -> None:
    reviews, clock = FakeReviews(), Clock()
    access = MetricsAccess(reviews, clock=clock)
    for _ in range(5):
        assert access.decide(environ("reader")).allowed
        assert not access.decide(environ("tenant")).allowed
    assert reviews.authentications == ["reader", "tenant"]
    clock.now += 11  # the refusal expired, the permission did not
    access.decide(environ("reader"))
    access.decide(environ("tenant"))
    assert reviews.authentications == ["reader", "tenant", "tenant"]
    clock.now += 50
    access.decide(environ("reader"))
    assert reviews.authentications[-1] == "reader"


def test_when_the_api_server_cannot_answer_the_answer_is_503_and_not_remembered() -> None:
    reviews = FakeReviews()
    access = MetricsAccess(reviews)
    reviews.down = True
    verdict = access.decide(environ("reader"))
    assert verdict.status == "503 Service Unavailable"
    assert "connection refused" in verdict.message
    reviews.down = False
    assert access.decide(environ("reader")).allowed  # asked again, not a cached 503


def test_the_cache_holds_a_bounded_number_of_tokens() -> None:
    reviews = FakeReviews()
    access = MetricsAccess(reviews, max_entries=3)
    for index in range(10):
        access.decide(environ(f"garbage-{index}"))
    access.decide(environ("garbage-0"))  # evicted: asked again
    assert reviews.authentications.count("garbage-0") == 2
    access.decide(environ("garbage-9"))  # still cached
    assert reviews.authentications.count("garbage-9") == 1


def test_an_oversized_token_is_refused_without_asking() -> None:
    reviews = FakeReviews()
    verdict = MetricsAccess(reviews).decide(environ("x" * 20000))
    assert verdict.status == "401 Unauthorized"
    assert reviews.authentications == []


def _call(app: Any, env: dict[str, Any]) -> tuple[str, dict[str, str], bytes]:
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"], seen["headers"] = status, dict(headers)

    body = b"".join(app(env, start_response))
    return seen["status"], seen["headers"], body


def _inner(env: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"served {env['PATH_INFO']}".encode()]


def test_the_guard_decides_metrics_only_and_says_why_it_refused() -> None:
    app = guard_metrics(_inner, MetricsAccess(FakeReviews()))
    assert _call(app, environ(path="/healthz"))[2] == b"served /healthz"  # probes need no token
    status, headers, body = _call(app, environ())
    assert status == "401 Unauthorized"
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert body.decode().startswith(DENIAL_PREFIX)
    status, _, body = _call(app, environ("tenant"))
    assert status == "403 Forbidden"
    assert body.decode().startswith(DENIAL_PREFIX)
    assert _call(app, environ("reader"))[2] == b"served /metrics"
