"""The services' process basics: listen addresses read one way, SIGTERM/SIGINT turned into a stop."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading

import pytest

from fastgshare_kube.process import ListenAddressError, parse_listen, stop_on_signals


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:8080", ("127.0.0.1", 8080)),
    ("0.0.0.0:0", ("0.0.0.0", 0)),
    (":9401", ("0.0.0.0", 9401)),
    ("[::1]:8888", ("::1", 8888)),
    ("localhost:65535", ("localhost", 65535)),
])
def test_a_listen_address_is_a_host_and_a_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text, "--listen") == expected


@pytest.mark.parametrize("text", ["8081", "host:", "host:http", "host:65536", "host:-1", "host:８０", ""])
def test_a_bad_listen_address_is_one_line_naming_the_flag_the_value_and_what_is_allowed(text: str) -> None:
    with pytest.raises(ListenAddressError) as raised:
        parse_listen(text, "--health-address", example="0.0.0.0:8081")
    message = str(raised.value)
    assert message.startswith(f"--health-address must be HOST:PORT, got {text!r}")
    assert "0..65535" in message
    assert "e.g. 0.0.0.0:8081" in message
    assert "\n" not in message


def test_a_stop_signal_calls_stop_and_the_old_handlers_come_back(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")
    stopped = threading.Event()
    before = signal.getsignal(signal.SIGTERM)
    restore = stop_on_signals(stopped.set, logger=logging.getLogger("some_service"))
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in the main thread, before the next line
        assert stopped.wait(5)
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is before
    assert [(r.name, r.getMessage()) for r in caplog.records] == [("some_service", "received SIGTERM, stopping")]


def test_on_an_event_loop_a_stop_signal_wakes_the_loop(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO")

    async def serve() -> None:
        stop = asyncio.Event()
        remove = stop_on_signals(stop.set, loop=asyncio.get_running_loop())
        try:
            asyncio.get_running_loop().call_later(0.01, os.kill, os.getpid(), signal.SIGINT)
            await asyncio.wait_for(stop.wait(), 5)
        finally:
            remove()

    asyncio.run(serve())
    assert "received SIGINT, stopping" in caplog.text
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
