"""What every service's process does the same way: read a listen address and stop on a signal.

- :func:`parse_listen`: a ``HOST:PORT`` flag (``--listen``, ``--health-address``, ...) as a
  ``(host, port)`` pair; ``[::1]:8080`` for IPv6, an empty host (``:8080``) for all addresses. A value
  that is not one raises :class:`ListenAddressError`, one line naming the flag, the value and what is
  allowed.
- :func:`stop_on_signals`: SIGTERM and SIGINT logged as ``received SIGTERM, stopping`` and turned into
  the service's own stop (an event it waits on); in an asyncio service, on its event loop.

The services' ``main.py`` call these; nothing here knows a service.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from types import FrameType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class ListenAddressError(ValueError):
    """A listen address flag that is not ``HOST:PORT``; the message names the flag and the value."""


def parse_listen(text: str, flag: str, *, example: str = "127.0.0.1:8080") -> tuple[str, int]:
    """``HOST:PORT`` as ``(host, port)``: brackets around an IPv6 host dropped, an empty host
    ``0.0.0.0`` (all addresses), the port 0..65535 (0: any free port)."""
    host, colon, port = text.strip().rpartition(":")
    if not colon or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ListenAddressError(f"{flag} must be HOST:PORT, got {text!r} (PORT 0..65535, e.g. {example}; "
                                 "an empty HOST listens on all addresses, [::1]:PORT for IPv6)")
    return host.removeprefix("[").removesuffix("]") or "0.0.0.0", int(port)


def stop_on_signals(stop: Callable[[], None], *, loop: asyncio.AbstractEventLoop | None = None,
                    signals: Sequence[signal.Signals] = STOP_SIGNALS,
                    logger: logging.Logger | None = None) -> Callable[[], None]:
    """On each of ``signals`` log ``received <NAME>, stopping`` (to ``logger``: the service's own, so
    the line carries its name) and call ``stop``; returns what puts the handlers that were there
    before back. With ``loop`` the handler runs on that event loop (``loop.add_signal_handler``), as
    an asyncio service needs: a plain handler would not wake it."""

    def received(signum: int) -> None:
        (logger or log).info("received %s, stopping", signal.Signals(signum).name)
        stop()

    if loop is not None:
        for signum in signals:
            loop.add_signal_handler(signum, received, signum)

        def remove() -> None:
            for signum in signals:
                loop.remove_signal_handler(signum)
        return remove

    def handler(signum: int, frame: FrameType | None) -> None:
        received(signum)

    previous = {signum: signal.signal(signum, handler) for signum in signals}

    def restore() -> None:
        for signum, before in previous.items():
            signal.signal(signum, before)
    return restore
