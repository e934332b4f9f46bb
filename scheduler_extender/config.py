"""The extender's settings: one frozen value built from the command line (or by tests).

Validation lives here, so every error names the flag, the bad value and what is allowed.
"""

from __future__ import annotations

import attrs

from fastgshare import keys
from fastgshare.placement import DEFAULT_POLICY, Policy

DEFAULT_LISTEN = "127.0.0.1:8888"
DEFAULT_BIND_WAIT_S = 5.0
DEFAULT_BIND_WINDOW = 8
FILTER_PASSES = ("best", "fitting")  # which fitting nodes filter passes; see scheduler_extender.decisions
DEFAULT_FILTER_PASSES = "best"
DEFAULT_MAX_BODY_BYTES = 32 * 2**20  # a NodeNames filter for 5,000 nodes is ~100 KiB; full Nodes ~25 MiB
# Who may write keys.SYSTEM_POD_ANNOTATIONS / SYSTEM_NODE_ANNOTATIONS (the admission webhook refuses
# anyone else): the extender's and the node agent's service accounts.
DEFAULT_SYSTEM_WRITERS = tuple(f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{account}"
                               for account in (keys.SCHEDULER_SERVICE_ACCOUNT, keys.NODE_AGENT_SERVICE_ACCOUNT))


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what is allowed."""


@attrs.frozen(kw_only=True)
class ExtenderConfig:
    """What the extender needs to know besides the cluster.

    - ``policy``: placement policy when the pod does not override it by annotation;
    - ``bind_wait_s`` and ``bind_window``: a bind to a node where ``bind_window`` pods are being
      written or wait for the node agent waits up to ``bind_wait_s`` for one of them to be marked
      allocated, then proceeds anyway (keep it well below the scheduler's ``httpTimeout`` for the
      extender); ``bind_wait_s`` 0: binds never wait for each other;
    - ``filter_passes``: ``best``, only the fitting nodes the policy scores highest pass filter (the
      choice is made there, and the scheduler skips scoring when one node is left); ``fitting``, every
      node where the pod fits passes and prioritize ranks them;
    - ``max_body_bytes``: larger request bodies are refused with 413;
    - ``system_writers``: the user names (as the API server authenticates them) that may set, change
      or remove fastgshare's system annotations; the admission webhook refuses anyone else.
    """

    policy: Policy = DEFAULT_POLICY
    bind_wait_s: float = DEFAULT_BIND_WAIT_S
    bind_window: int = DEFAULT_BIND_WINDOW
    filter_passes: str = DEFAULT_FILTER_PASSES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    system_writers: tuple[str, ...] = DEFAULT_SYSTEM_WRITERS

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.bind_wait_s <= 600:
            raise ConfigError(f"--bind-wait-seconds must be in 0..600, got {self.bind_wait_s}")
        if not 1 <= self.bind_window <= 1000:
            raise ConfigError(f"--bind-window must be in 1..1000, got {self.bind_window}")
        if self.filter_passes not in FILTER_PASSES:
            raise ConfigError(f"--filter-passes must be one of {', '.join(FILTER_PASSES)}, got {self.filter_passes!r}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")
        if parse_system_writers(",".join(self.system_writers)) != self.system_writers:
            raise ConfigError(f"--system-writers {self.system_writers!r} is malformed; allowed: user names "
                              "without blanks or commas")


def parse_system_writers(text: str) -> tuple[str, ...]:
    """``--system-writers``: comma-separated user names (blanks around a name are dropped)."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    allowed = ('comma-separated user names without blanks, at least one, e.g. '
               f'"{",".join(DEFAULT_SYSTEM_WRITERS)}"')
    if not names or any(char.isspace() for name in names for char in name):
        raise ConfigError(f"--system-writers {text[:200]!r} is malformed; allowed: {allowed}")
    return names
