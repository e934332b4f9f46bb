"""Byte quantities as users write them: plain bytes, or Kubernetes-style suffixes.

``"2700000000"``, ``"1.5Gi"``, ``"512Mi"`` and ``"2G"`` are accepted; the result must be a
whole, positive number of bytes. Rendering goes the other way for tables and messages.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
DECIMAL_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SUFFIXES = {**BINARY_SUFFIXES, **DECIMAL_SUFFIXES}
_QUANTITY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|k|M|G|T)?")

BYTES_HELP = 'a positive whole number of bytes, e.g. "2700000000", "1536Mi" or "1.5Gi"'


def parse_bytes(text: str) -> int | None:
    """The byte count ``text`` denotes, or ``None`` if it is not a positive whole quantity."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        return None
    try:
        number = Decimal(match["number"])
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        return None
    value = number * _SUFFIXES.get(match["suffix"] or "", 1)
    if value <= 0 or value != value.to_integral_value():
        return None
    return int(value)


def format_bytes(count: int) -> str:
    """A short human form: ``1.5 GiB``, ``512 MiB``, ``100 B``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(count) >= size:
            return f"{count / size:.4g} {unit}"
    return f"{count} B"
