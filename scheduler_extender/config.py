"""The extender's settings: one frozen value built from the command line (or by tests).

Validation lives here, so every error names the flag, the bad value and what is allowed.
"""

from __future__ import annotations

import attrs

from fastgshare.placement import DEFAULT_POLICY, Policy

DEFAULT_LISTEN = "127.0.0.1:8888"
DEFAULT_BIND_WAIT_S = 0.0
DEFAULT_MAX_BODY_BYTES = 32 * 2**20  # a NodeNames filter for 5,000 nodes is ~100 KiB; full Nodes ~25 MiB


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what is allowed."""


@attrs.frozen(kw_only=True)
class ExtenderConfig:
    """What the extender needs to know besides the cluster.

    - ``policy``: placement policy when the pod does not override it by annotation;
    - ``bind_wait_s``: 0 (the default): binds do not wait for each other. Above 0, binds to one
      node take turns, each waiting this long at most for the node agent to mark the previous
      pod allocated before it proceeds anyway (keep it well below the scheduler's
      ``httpTimeout`` for the extender);
    - ``max_body_bytes``: larger request bodies are refused with 413.
    """

    policy: Policy = DEFAULT_POLICY
    bind_wait_s: float = DEFAULT_BIND_WAIT_S
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.bind_wait_s <= 600:
            raise ConfigError(f"--bind-wait-seconds must be in 0..600, got {self.bind_wait_s}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8888`` for IPv6; an empty host means all addresses) as a pair."""
    host, separator, port_text = text.strip().rpartition(":")
    allowed = 'HOST:PORT with PORT in 0..65535, e.g. "127.0.0.1:8888", ":8888" or "[::1]:8888"'
    if not separator or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f'--listen "{text}" is malformed; allowed: {allowed}')
    host = host.removeprefix("[").removesuffix("]")
    return host or "0.0.0.0", int(port_text)
