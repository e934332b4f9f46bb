"""The port through which the provider API reads and writes FaSTFunc objects (and reads FaSTPods written
as functions). The real one is :class:`fastgshare_gateway.kube.KubeStore`; tests use an in-memory one.
Methods block (the HTTP edge runs them in a thread); failures are the Kubernetes layer's one error type,
:class:`~fastgshare_kube.errors.ApiError` (``status`` as the API server gave it, 0: no answer)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class FunctionStore(Protocol):
    def list_fastfuncs(self, namespace: str) -> list[dict[str, Any]]: ...

    def get_fastfunc(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_fastfunc(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Raises ApiError(409) when it exists."""
        ...

    def replace_fastfunc(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``body`` carries the resourceVersion read; ApiError(409) when it moved on, 404 when gone."""
        ...

    def patch_fastfunc(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...

    def delete_fastfunc(self, namespace: str, name: str) -> bool:
        """False when there was none."""
        ...

    def list_fastpods(self, namespace: str) -> list[dict[str, Any]]: ...

    def get_fastpod(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def wake_fastpod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
        """Apply a JSON patch to a parked FaSTPod (its time quota); ApiError(422) when its test fails."""
        ...
