"""The queue worker's back-off and what it retries (:mod:`fastgshare_queue.retry`)."""

from __future__ import annotations

import pytest

from fastgshare_queue.retry import delay_s, retryable


def test_429_5xx_and_no_gateway_are_retried_other_answers_are_final() -> None:
    assert all(retryable(status) for status in (None, 429, 500, 502, 503, 504, 599))
    assert not any(retryable(status) for status in (200, 202, 204, 301, 400, 401, 404, 413, 428))


def test_the_delay_doubles_from_the_base_up_to_the_cap() -> None:
    assert [delay_s(n, 0.5, 5.0) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert delay_s(10_000, 0.5, 5.0) == 5.0  # no overflow


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        delay_s(0, 1.0, 2.0)
