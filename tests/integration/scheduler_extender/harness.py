"""The extender's harness for the tests: :mod:`bench.extender_harness`, with the tests' assignment
key (:data:`tests.builders.TEST_ASSIGNMENT_KEY`), which the tests' node agents and fakes trust."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import extender_harness
from bench.extender_harness import (
    REPO,
    AllocationMarker,
    get_json,
    is_ready,
    raw_core_api,
    scheduler_config,
    serving,
)
from tests.builders import TEST_ASSIGNMENT_KEY

__all__ = ["REPO", "AllocationMarker", "ExtenderProcess", "get_json", "is_ready", "raw_core_api", "scheduler_config",
           "serving"]


class ExtenderProcess(extender_harness.ExtenderProcess):
    """:class:`bench.extender_harness.ExtenderProcess` signing with the tests' assignment key."""

    def __init__(self, kubeconfig: Path, port: int, log_path: Path, **options: Any) -> None:
        super().__init__(kubeconfig, port, log_path, assignment_key=TEST_ASSIGNMENT_KEY, **options)
