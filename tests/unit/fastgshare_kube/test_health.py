"""The services' health server: liveness and readiness each from their own check, metrics beside them."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from fastgshare_kube.health import HealthServer, start_health


def status_of(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_readiness_has_its_own_check_and_liveness_stays_up_meanwhile() -> None:
    synced = [False]
    server = HealthServer("127.0.0.1", 0, lambda: True, ready=lambda: synced[0])
    server.start()
    try:
        assert (status_of(server.port, "/healthz"), status_of(server.port, "/readyz")) == (200, 503)
        synced[0] = True
        assert (status_of(server.port, "/healthz"), status_of(server.port, "/readyz")) == (200, 200)
    finally:
        server.stop()


def test_without_a_readiness_check_both_probes_follow_the_one_check() -> None:
    sound = [True]
    server = HealthServer("127.0.0.1", 0, lambda: sound[0])
    server.start()
    try:
        assert (status_of(server.port, "/healthz"), status_of(server.port, "/readyz")) == (200, 200)
        sound[0] = False
        assert (status_of(server.port, "/healthz"), status_of(server.port, "/readyz")) == (503, 503)
        assert status_of(server.port, "/metrics") == 404  # no metrics given
    finally:
        server.stop()


def test_metrics_are_served_beside_the_probes() -> None:
    server = HealthServer("127.0.0.1", 0, lambda: True, lambda: (b"up 1\n", "text/plain; version=0.0.4"),
                          name="metrics")
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
            assert response.read() == b"up 1\n"
    finally:
        server.stop()


def test_an_empty_address_is_off_and_a_bad_one_names_the_flag() -> None:
    assert start_health("", lambda: True) is None
    with pytest.raises(ValueError, match="--health-address must be HOST:PORT, got 'nowhere'"):
        start_health("nowhere", lambda: True)
