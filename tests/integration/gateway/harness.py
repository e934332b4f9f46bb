"""A gateway in this process on loopback, with endpoints injected (no Kubernetes), and small aiohttp
upstreams standing in for function pods."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import web

from fastgshare import keys
from fastgshare_gateway.http import Gateway, Options
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.pool import Limits
from fastgshare_gateway.routing import Functions
from fastgshare_kube.errors import CONFLICT, ApiError

NS = keys.DEFAULT_FUNCTION_NAMESPACE


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` on 127.0.0.1 (a free port); yields ``host:port``."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def gateway(limits: Limits | None = None, options: Options | None = None, store: Any = None,
                  namespaces: tuple[str, ...] = (NS,), cold_start_timeout_s: float = 120.0,
                  ) -> AsyncIterator[tuple[Gateway, str]]:
    functions = Functions(namespaces, limits or Limits(), GatewayMetrics(), cold_start_timeout_s=cold_start_timeout_s)
    functions.replace_pods([])
    gw = Gateway(functions, store, options)
    async with serving(gw.app()) as address:
        yield gw, f"http://{address}"


def free_port_address() -> str:
    """An address nothing listens on (a port bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def echo_app(name: str = "pod", gate: asyncio.Event | None = None, delay_s: float = 0.0) -> web.Application:
    """Answers with what it saw: method, path, query, headers, body length, and which pod it is."""
    async def handler(request: web.Request) -> web.StreamResponse:
        if gate is not None:
            await gate.wait()
        if delay_s:
            await asyncio.sleep(delay_s)
        body = await request.read()
        if request.path == "/echo":
            return web.Response(body=body, headers={"X-Pod": name, "Content-Type": "application/octet-stream"})
        return web.json_response({"pod": name, "method": request.method, "path": request.path,
                                  "query": request.query_string, "headers": dict(request.headers),
                                  "bodyLength": len(body)}, status=201 if request.path.startswith("/created") else 200)
    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", handler)
    return app


class MemoryStore:
    """The FunctionStore port in memory, as the API server would answer (resourceVersion, conflicts)."""

    def __init__(self, fastpods: list[dict[str, Any]] | None = None) -> None:
        self.fastfuncs: dict[tuple[str, str], dict[str, Any]] = {}
        self.fastpods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in fastpods or []}
        self._version = 0
        self.patches: list[tuple[str, str, dict[str, Any]]] = []  # every patch_fastfunc call, in order
        self.wakes: list[tuple[str, str, list[dict[str, Any]]]] = []  # every wake_fastpod call, in order

    def _stamp(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self._version += 1
        stored = copy.deepcopy(dict(obj))
        stored["metadata"]["resourceVersion"] = str(self._version)
        stored["metadata"].setdefault("creationTimestamp", "2026-01-02T03:04:05Z")
        return stored

    def list_fastfuncs(self, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(f) for (ns, _), f in self.fastfuncs.items() if ns == namespace]

    def get_fastfunc(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.fastfuncs.get((namespace, name))
        return copy.deepcopy(found) if found else None

    def create_fastfunc(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        key = (namespace, body["metadata"]["name"])
        if key in self.fastfuncs:
            raise ApiError(CONFLICT, "AlreadyExists", "already exists")
        self.fastfuncs[key] = self._stamp(body)
        return self.fastfuncs[key]

    def replace_fastfunc(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        current = self.fastfuncs.get((namespace, name))
        if current is None:
            raise ApiError(404, "NotFound", "not found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(CONFLICT, "Conflict", "the object has been modified")
        self.fastfuncs[(namespace, name)] = self._stamp(body)
        return self.fastfuncs[(namespace, name)]

    def patch_fastfunc(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.patches.append((namespace, name, copy.deepcopy(dict(patch))))
        current = self.fastfuncs[(namespace, name)]
        for field, value in patch["spec"].items():
            current["spec"][field] = {**current["spec"].get(field, {}), **value}
        return copy.deepcopy(current)

    def delete_fastfunc(self, namespace: str, name: str) -> bool:
        return self.fastfuncs.pop((namespace, name), None) is not None

    def list_fastpods(self, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for (ns, _), p in self.fastpods.items() if ns == namespace]

    def get_fastpod(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.fastpods.get((namespace, name))
        return copy.deepcopy(found) if found else None

    def wake_fastpod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
        """A JSON patch on a FaSTPod's annotations, as the API server applies it (a failed test: 422)."""
        self.wakes.append((namespace, name, copy.deepcopy(patch)))
        current = self.fastpods.get((namespace, name))
        if current is None:
            raise ApiError(404, "NotFound", "not found")
        annotations = dict(current["metadata"].get("annotations") or {})
        for op in patch:
            key = op["path"].removeprefix("/metadata/annotations/").replace("~1", "/").replace("~0", "~")
            if op["op"] == "test" and annotations.get(key) != op["value"]:
                raise ApiError(422, "Invalid", f"the test of {key} failed")
            if op["op"] in ("add", "replace"):
                annotations[key] = op["value"]
        current["metadata"]["annotations"] = annotations
