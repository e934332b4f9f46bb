"""JSON text that comes from outside (an annotation, a ConfigMap, a file), parsed with a bound:
too long a text, text that is not JSON, or nesting deep enough to exhaust the parser are one
error naming what was read. Pure."""

from __future__ import annotations

import json


def load_bounded(text: str, what: str, max_chars: int, error: type[Exception]) -> object:
    """``json.loads(text)``, or ``error`` saying why not, each message prefixed with ``what``."""
    if len(text) > max_chars:
        raise error(f"{what}: a text of {len(text)} characters exceeds the limit of {max_chars}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as problem:
        raise error(f"{what}: not valid JSON ({problem})") from None
