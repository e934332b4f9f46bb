"""The domain's own exceptions.

Every error the core raises on bad input is a :class:`FastGShareError`, so adapters map
one family of exceptions to their outside world (a FailedNodes reason, a gRPC status, a
Kubernetes event, an exit code) and never see a ``KeyError`` or ``ValueError`` leak out.
"""

from __future__ import annotations

import attrs


class FastGShareError(Exception):
    """Base class of every error the core raises on invalid input or state."""


@attrs.frozen
class FieldProblem:
    """One thing wrong with one field: which field, the value found, and what is allowed."""

    field: str
    value: object
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidShareSpec(FastGShareError):
    """A share spec (the four ``fastgshare/`` annotations) is missing values or has bad ones.

    All problems of one spec are collected and reported together.
    """

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("invalid GPU share: " + "; ".join(str(p) for p in self.problems))


class CodecError(FastGShareError):
    """An annotation payload is malformed or has a version this code does not understand."""


class InvalidInventory(FastGShareError):
    """A GPU inventory or a GPU spec string breaks the inventory's rules."""


class InvalidWorkload(FastGShareError):
    """A workload description (shares with counts) is malformed."""


class LedgerError(FastGShareError):
    """A ledger operation that cannot be carried out (unknown pod, pod already present)."""


class InvalidPolicy(FastGShareError):
    """A placement policy name that is not one of the known policies."""
