"""The gateway's HTTP edge (aiohttp, server and client): invocations, the OpenFaaS provider API, metrics.

- ``/function/<name>[.<namespace>][/rest]``, any method: a pod from the function's pool
  (:mod:`fastgshare_gateway.pool`), then the request streamed to ``podIP:8080/rest`` and the answer
  streamed back. 404 unknown function, 429 queue full, 503 no pod within the queue timeout (the cold-start
  timeout for a function that scales from zero: the wake-up patch is sent from here), 502 the pod
  could not be reached (after one retry on another pod: a connect failure sends no body, so the retry is
  safe; the pod is then left out for a while, :mod:`fastgshare_gateway.pool`) or broke the exchange, 504
  no answer within the upstream timeout. ``X-Forwarded-For``,
  ``X-Forwarded-Host`` and ``X-Call-Id`` (kept if the client sent one, returned on the answer).
- ``POST /async-function/<name>[.<namespace>][/rest]``: the request stored through the
  :class:`~fastgshare_gateway.queue.Publisher` port (JetStream, :mod:`fastgshare_gateway.jetstream`) in the
  :mod:`fastgshare_gateway.queue` format, then 202 with ``X-Call-Id``; the queue worker
  (``fastgshare-queue-worker``) calls ``/function/...`` and posts the answer to ``X-Callback-Url``. 404 unknown
  function, 400 a callback URL that is not absolute http(s), 413 a body over :data:`MAX_BODY_BYTES` (or the
  NATS server's ``max_payload``), 408 the body not received within ``body_timeout_s``, 503 not stored (NATS
  unreachable, no acknowledgement in time, the stream full), 501 without ``--nats-url``.
- ``/system/...``: the OpenFaaS provider API over FaSTFunc objects (:mod:`fastgshare_gateway.openfaas`,
  through the :class:`~fastgshare_gateway.store.FunctionStore` port, in a thread); ``/system/logs`` through
  :mod:`fastgshare_gateway.logs`; routes OpenFaaS has and we do not (secrets, namespace mutation) answer 501
  with a message.
- ``/healthz`` (200 once the pods are listed), ``/metrics``.

Access and limits (:class:`Options`): basic auth on ``/system/*`` (and ``/function/*`` with
``auth_functions``) through :mod:`fastgshare_gateway.auth`; the admin's :class:`~fastgshare_gateway.policy.DeployPolicy`
on every deploy, update and scale (400 naming the limit); provider API bodies at most
:data:`MAX_BODY_BYTES` (413) read within ``body_timeout_s`` (408), parsed by :func:`openfaas.parse_body`
(400 naming the field, never 500). The server itself (:func:`serve`, :class:`ServerLimits`): aiohttp's
``keepalive_timeout`` closes a connection that has no complete request headers within ``idle_timeout_s``
(new, slow or idle kept-alive alike), ``max_line_size``/``max_field_size``/``max_headers`` cap the headers
(400 past them), and a connection cap that first closes the oldest connection with no request in a handler.

aiohttp: one dependency for a streaming server and client on asyncio, where a request waiting in a queue
costs a future rather than a thread (Flask/WSGI would hold a thread per waiting request).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import aiohttp
import attrs
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from fastgshare import keys
from fastgshare_gateway import auth, logs, openfaas, queue
from fastgshare_gateway.endpoints import Endpoint, FunctionKey
from fastgshare_gateway.fastfunc import scale_problem
from fastgshare_gateway.metrics import CONTENT_TYPE, function_label
from fastgshare_gateway.policy import DeployPolicy
from fastgshare_gateway.pool import ColdStartTimeout, FunctionPool, QueueFull, QueueTimeout
from fastgshare_gateway.routing import Functions
from fastgshare_gateway.store import FunctionStore
from fastgshare_kube.errors import CONFLICT, NOT_FOUND, ApiError

log = logging.getLogger(__name__)

T = TypeVar("T")
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "host"})
CHUNK = 64 * 1024
CONFLICT_RETRIES = 3
AUTOSCALED_HEADER = "X-Fastgshare-Autoscaled"
NOT_IMPLEMENTED = {
    "secrets": "secrets are not managed by fastgshare; create Kubernetes Secrets and mount them in the "
               "FaSTFunc's podSpec",
    "namespace": "namespaces are not managed by fastgshare; the gateway serves the namespaces given with "
                 "--namespace",
}


MAX_BODY_BYTES = 1 << 20  # a provider API body, an async invocation's body; invocations stream, uncapped


@attrs.frozen
class Options:
    """``auth`` None: no credentials asked anywhere (``--no-auth``)."""

    upstream_timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    body_timeout_s: float = 10.0
    auth: auth.BasicAuth | None = None
    auth_functions: bool = False
    policy: DeployPolicy = attrs.field(factory=DeployPolicy)
    log_limits: logs.LogLimits = attrs.field(factory=logs.LogLimits)


@attrs.frozen
class ServerLimits:
    """The gateway's HTTP server: connections at most, seconds to a complete request's headers (a new or
    kept-alive connection), and aiohttp's header caps (request line and each header field, in bytes;
    header fields per request)."""

    max_connections: int = 1000
    idle_timeout_s: float = 15.0
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 100


def auth_middleware(credentials: auth.BasicAuth, *, auth_functions: bool = False) -> Middleware:
    """401 with ``WWW-Authenticate`` where :func:`auth.needs_auth` says so for the route matched (not the raw
    path: no aliasing through encodings or dot segments) and the credentials are not given."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else request.path
        if auth.needs_auth(route, auth_functions=auth_functions) and not credentials.check(
                request.headers.get("Authorization")):
            return web.Response(status=401, headers={"WWW-Authenticate": f'Basic realm="{auth.REALM}"'},
                                text=f"unauthorized: {request.path} needs the gateway's credentials (Secret "
                                     f"{keys.BASIC_AUTH_SECRET}; faas-cli login --password-stdin)\n")
        return await handler(request)
    return check


def _text(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=message + "\n", headers=headers)


class Gateway:
    """The handlers; ``store`` None: no provider API (503 on ``/system/function*``)."""

    def __init__(self, functions: Functions, store: FunctionStore | None = None,
                 options: Options | None = None, pod_logs: logs.PodLogs | None = None,
                 async_queue: queue.Publisher | None = None) -> None:
        self.functions = functions
        self.async_queue = async_queue
        self.metrics = functions.metrics
        self.store = store
        self.options = options or Options()
        self.logs = logs.LogServer(pod_logs, self.options.log_limits)
        self._session: aiohttp.ClientSession | None = None
        self._wakeups: set[asyncio.Task[None]] = set()
        if store is not None:
            functions.waker = self._wake
            functions.parked_waker = self._wake_parked

    # --- the application ---------------------------------------------------------------------
    def app(self) -> web.Application:
        middlewares = ([auth_middleware(self.options.auth, auth_functions=self.options.auth_functions)]
                       if self.options.auth is not None else [])
        app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
        routes = [
            web.route("*", "/function/{name}", self.invoke),
            web.route("*", "/function/{name}/{tail:.*}", self.invoke),
            web.get("/system/functions", self.list_functions),
            web.post("/system/functions", self.deploy),
            web.put("/system/functions", self.update),
            web.delete("/system/functions", self.delete),
            web.get("/system/function/{name}", self.function),
            web.post("/system/scale-function/{name}", self.scale),
            web.get("/system/info", self.info),
            web.get("/system/namespaces", self.namespaces),
            web.get("/healthz", self.healthz, allow_head=True),
            web.get("/metrics", self.metrics_page),
            web.get("/system/logs", self.function_logs),
            web.route("*", "/system/secrets", self.not_implemented),
            web.route("*", "/system/namespace/{name}", self.not_implemented),
            web.post("/async-function/{name}", self.invoke_async),
            web.post("/async-function/{name}/{tail:.*}", self.invoke_async),
            web.route("*", "/system/{tail:.*}", self.not_implemented),
        ]
        app.add_routes(routes)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              skip_auto_headers=("User-Agent", "Content-Type", "Accept-Encoding"))

    async def _stop(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    # --- scale from zero ---------------------------------------------------------------------
    def _wake(self, key: FunctionKey, patch: Mapping[str, Any]) -> None:
        """Send a wake-up patch (Functions decided it is due); runs on the event loop."""
        task = asyncio.get_running_loop().create_task(self._send_wake(key, patch))
        self._wakeups.add(task)
        task.add_done_callback(self._wakeups.discard)

    async def _send_wake(self, key: FunctionKey, patch: Mapping[str, Any]) -> None:
        namespace, name = key
        store = self._store()
        log.info("waking function=%s.%s from zero replicas: patching spec.fixed.replicas=%s, holding its requests "
                 "up to %gs", name, namespace, patch["spec"]["fixed"]["replicas"], self.functions.cold_start_timeout_s)
        try:
            woken = await self._call(store.patch_fastfunc, namespace, name, patch)
        except ApiError as error:
            log.warning("function=%s.%s could not be woken: %s; the next request retries", name, namespace, error)
            self.functions.wake_failed(key)
            return
        self.functions.upsert_fastfunc(woken, namespace)  # before the watch brings it

    def _wake_parked(self, key: FunctionKey, fastpod: str, patch: list[dict[str, Any]]) -> None:
        """Send a parked child's wake-up (Functions decided it is due); runs on the event loop."""
        task = asyncio.get_running_loop().create_task(self._send_wake_parked(key, fastpod, patch))
        self._wakeups.add(task)
        task.add_done_callback(self._wakeups.discard)

    async def _send_wake_parked(self, key: FunctionKey, fastpod: str, patch: list[dict[str, Any]]) -> None:
        namespace, name = key
        log.info("waking the parked pods of function=%s.%s: FaSTPod %s to time quota %s..%s", name, namespace,
                 fastpod, patch[1]["value"], patch[2]["value"])
        try:
            await self._call(self._store().wake_fastpod, namespace, fastpod, patch)
        except ApiError as error:
            if error.status == 422:  # the test failed: no longer parked (woken meanwhile)
                return
            log.warning("function=%s.%s: its parked pods could not be woken: %s; the next request retries",
                        name, namespace, error)
            self.functions.wake_failed(key)

    # --- invocations -------------------------------------------------------------------------
    async def invoke(self, request: web.Request) -> web.StreamResponse:
        name, namespace = openfaas.split_function_name(request.match_info["name"], self.functions.default_namespace)
        key = (namespace, name)
        pool = self.functions.pool(key)
        if pool is None:
            return _text(404, f"no function {name!r} in namespace {namespace!r} (served namespaces: "
                              f"{', '.join(self.functions.namespaces)})")
        label = function_label(name, namespace)
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.metrics.invocation_started(label)
        code = 499  # the client left before an answer (nginx's code)
        try:
            response = await self._invoke(request, pool, key, request.match_info.get("tail", ""))
            code = response.status
            return response
        finally:
            settings = self.functions.settings(key)
            self.metrics.invocation_done(label, code, loop.time() - started, settings.slo_s if settings else None)
            self.functions.observe(key)

    async def _invoke(self, request: web.Request, pool: FunctionPool, key: FunctionKey,
                      tail: str) -> web.StreamResponse:
        self.functions.observe(key)
        self.functions.arriving(key)
        try:
            endpoint = await pool.acquire()
        except QueueFull:
            return _text(429, f"function {key[1]}.{key[0]}: {pool.queued} requests already wait for a pod "
                              f"(--max-queue {pool.limits.max_queue}); retry later")
        except ColdStartTimeout as error:
            return _text(503, f"function {key[1]}.{key[0]}: scaled to zero and woken, but it did not become ready "
                              f"within the cold-start timeout ({error.timeout_s:g}s, --cold-start-timeout)")
        except QueueTimeout:
            return _text(503, f"function {key[1]}.{key[0]}: no ready pod took the request within "
                              f"{pool.limits.queue_timeout_s:g}s ({len(pool.endpoints)} ready pods)")
        tried = [endpoint.pod]
        try:
            while True:
                try:
                    return await self._forward(request, endpoint, tail)
                except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as error:
                    pool.unreachable(endpoint.pod)
                    retry = pool.retry_endpoint(tried) if len(tried) == 1 else None
                    log.warning("function=%s.%s pod=%s unreachable (%s)%s", key[1], key[0], endpoint.pod, error,
                                f"; retrying on pod={retry.pod}" if retry else "")
                    if retry is None:
                        return _text(502, f"function {key[1]}.{key[0]}: pod {endpoint.pod} ({endpoint.address}) "
                                          f"could not be reached: {error}")
                    pool.release(endpoint)
                    endpoint = retry
                    tried.append(endpoint.pod)
        finally:
            pool.release(endpoint)

    def _upstream_headers(self, request: web.Request, call_id: str) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        peer = request.remote or ""
        forwarded = request.headers.get("X-Forwarded-For")
        headers["X-Forwarded-For"] = f"{forwarded}, {peer}" if forwarded else peer
        headers["X-Forwarded-Host"] = request.headers.get("X-Forwarded-Host") or request.host
        headers["X-Call-Id"] = call_id
        return headers

    async def _forward(self, request: web.Request, endpoint: Endpoint, tail: str) -> web.StreamResponse:
        assert self._session is not None
        call_id = request.headers.get("X-Call-Id") or str(uuid.uuid4())
        url = f"http://{endpoint.address}/{tail}" + (f"?{request.query_string}" if request.query_string else "")
        timeout = aiohttp.ClientTimeout(total=self.options.upstream_timeout_s, connect=self.options.connect_timeout_s)
        response: web.StreamResponse | None = None
        try:
            async with self._session.request(
                    request.method, url, headers=self._upstream_headers(request, call_id),
                    data=request.content if request.body_exists else None, allow_redirects=False,
                    timeout=timeout) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in HOP_BY_HOP:
                        response.headers.add(name, value)
                response.headers["X-Call-Id"] = call_id
                await response.prepare(request)
                async for chunk in upstream.content.iter_chunked(CHUNK):
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
            raise  # nothing was sent: the caller may retry on another pod
        except TimeoutError:
            if response is not None and response.prepared:
                raise  # the answer began: it can only be cut off
            return _text(504, f"pod {endpoint.pod} ({endpoint.address}) did not answer within "
                              f"{self.options.upstream_timeout_s:g}s")
        except aiohttp.ClientError as error:
            if response is not None and response.prepared:
                raise
            return _text(502, f"pod {endpoint.pod} ({endpoint.address}) broke the exchange: {error}")

    # --- asynchronous invocations ------------------------------------------------------------
    def _async_refusal(self, request: web.Request, name: str, namespace: str) -> web.Response | None:
        """What refuses an async invocation before its body is read: 501, 404, 400, 413 (declared length)."""
        if self.async_queue is None:
            return _text(501, "not implemented: asynchronous invocations need a NATS JetStream server; start the "
                              "gateway with --nats-url nats://HOST:4222")
        if not self.functions.exists((namespace, name)):
            return _text(404, f"no function {name!r} in namespace {namespace!r} (served namespaces: "
                              f"{', '.join(self.functions.namespaces)})")
        callback = request.headers.get(queue.CALLBACK_HEADER)
        if callback is not None and (problem := queue.callback_problem(callback)):
            return _text(400, problem)
        if (request.content_length or 0) > MAX_BODY_BYTES:
            return _async_too_large()
        return None

    async def _async_body(self, request: web.Request) -> bytes | web.Response:
        try:
            async with asyncio.timeout(self.options.body_timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _async_too_large()
        except TimeoutError:
            return _text(408, f"body: not received within {self.options.body_timeout_s:g}s")

    async def invoke_async(self, request: web.Request) -> web.StreamResponse:
        name, namespace = openfaas.split_function_name(request.match_info["name"], self.functions.default_namespace)
        if refusal := self._async_refusal(request, name, namespace):
            return refusal
        assert self.async_queue is not None
        body = await self._async_body(request)
        if isinstance(body, web.Response):
            return body
        callback = request.headers.get(queue.CALLBACK_HEADER)
        call_id = queue.call_id(request.headers.get(queue.CALL_ID_HEADER))
        forwarded = self._upstream_headers(request, call_id)
        stored = queue.AsyncRequest(
            call_id=call_id, function=name, namespace=namespace, method=request.method,
            path=request.match_info.get("tail", ""), query=request.rel_url.raw_query_string,
            headers=queue.kept_headers(forwarded.items()), body=body, callback_url=callback, queued_at=time.time())
        try:
            duplicate = await self.async_queue.publish(stored)
        except queue.TooLarge as error:
            return _text(413, f"body: too large to queue ({error})")
        except queue.QueueUnavailable as error:
            log.warning("async call=%s function=%s.%s not queued: %s", call_id, name, namespace, error)
            return _text(503, f"not queued, retry later: {error}", headers={queue.CALL_ID_HEADER: call_id})
        log.info("async call=%s function=%s.%s queued (%d bytes%s%s)", call_id, name, namespace, len(body),
                 ", callback" if callback else "", ", a duplicate of a call already stored" if duplicate else "")
        return web.Response(status=202, headers={queue.CALL_ID_HEADER: call_id})

    # --- the provider API --------------------------------------------------------------------
    async def _call(self, method: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(method, *args)

    def _store(self) -> FunctionStore:
        if self.store is None:
            raise web.HTTPServiceUnavailable(text="this gateway runs without Kubernetes: no provider API\n")
        return self.store

    def _namespace(self, request: web.Request, namespace: str | None = None) -> str:
        namespace = namespace or request.query.get("namespace") or self.functions.default_namespace
        if namespace not in self.functions.namespaces:
            raise web.HTTPBadRequest(text=f"namespace {namespace!r} is not served by this gateway; served: "
                                          f"{', '.join(self.functions.namespaces)} (--namespace)\n")
        return namespace

    async def _json(self, request: web.Request) -> object:
        """The body's JSON: 413 past MAX_BODY_BYTES, 408 not received in time, 400 naming the problem."""
        try:
            async with asyncio.timeout(self.options.body_timeout_s):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise web.HTTPRequestEntityTooLarge(
                max_size=MAX_BODY_BYTES, actual_size=request.content_length or MAX_BODY_BYTES + 1,
                text=f"body: more than {MAX_BODY_BYTES} bytes, the most a provider API request may send\n") from None
        except TimeoutError:
            raise web.HTTPRequestTimeout(text=f"body: not received within {self.options.body_timeout_s:g}s\n") from None
        try:
            return openfaas.parse_body(raw)
        except openfaas.InvalidDeployment as error:
            raise web.HTTPBadRequest(text=self._problems(error)) from None

    @staticmethod
    def _problems(error: openfaas.InvalidDeployment) -> str:
        return "\n".join(f"{p.field}: {p.message} (got {openfaas._show(p.value)})" for p in error.problems) + "\n"

    def _within_policy(self, fastfunc: Mapping[str, Any]) -> None:
        if problems := self.options.policy.fastfunc_problems(fastfunc):
            raise openfaas.InvalidDeployment(problems)

    @classmethod
    def _invalid(cls, error: openfaas.InvalidDeployment) -> web.Response:
        return web.Response(status=400, text=cls._problems(error))

    @staticmethod
    def _store_failed(error: ApiError) -> web.Response:
        if error.status in (400, 422):  # the API server's validation: the body's fault, not ours
            return _text(400, f"the Kubernetes API refused the function: {error.message or error}")
        if error.status == NOT_FOUND:
            return _text(500, f"the FaSTFunc CRD ({keys.FASTFUNC_CRD_NAME}) is not installed: {error.message or error}")
        return _text(500 if error.status else 502, f"the Kubernetes API refused or did not answer: {error}")

    def _count(self, name: str, namespace: str) -> float:
        return self.metrics.invocation_count(function_label(name, namespace))

    async def list_functions(self, request: web.Request) -> web.StreamResponse:
        store, namespace = self._store(), self._namespace(request)
        try:
            fastfuncs = await self._call(store.list_fastfuncs, namespace)
            fastpods = (await self._call(store.list_fastpods, namespace)
                        if namespace == self.functions.default_namespace else [])
        except ApiError as error:
            return self._store_failed(error)
        found = [openfaas.function_status(f, self._count(f["metadata"]["name"], namespace)) for f in fastfuncs]
        found += [openfaas.fastpod_status(p, self._count(p["metadata"]["name"], namespace))
                  for p in fastpods if openfaas.is_function_fastpod(p)]
        return web.json_response(sorted(found, key=lambda status: str(status["name"])))

    async def function(self, request: web.Request) -> web.StreamResponse:
        store = self._store()
        name, dotted = openfaas.split_function_name(request.match_info["name"], "")
        namespace = self._namespace(request, dotted or None)
        try:
            fastfunc = await self._call(store.get_fastfunc, namespace, name)
            if fastfunc is not None:
                return web.json_response(openfaas.function_status(fastfunc, self._count(name, namespace)))
            if namespace == self.functions.default_namespace:
                fastpod = await self._call(store.get_fastpod, namespace, name)
                if fastpod is not None and openfaas.is_function_fastpod(fastpod):
                    return web.json_response(openfaas.fastpod_status(fastpod, self._count(name, namespace)))
        except ApiError as error:
            return self._store_failed(error)
        return _text(404, f"no function {name!r} in namespace {namespace!r}")

    async def deploy(self, request: web.Request) -> web.StreamResponse:
        store, body = self._store(), await self._json(request)
        try:
            fastfunc = openfaas.to_fastfunc(body, self.functions.default_namespace)
            self._within_policy(fastfunc)
        except openfaas.InvalidDeployment as error:
            return self._invalid(error)
        name, namespace = fastfunc["metadata"]["name"], self._namespace(request, fastfunc["metadata"]["namespace"])
        try:
            created = await self._call(store.create_fastfunc, namespace, fastfunc)
        except ApiError as error:
            if error.status == CONFLICT:
                return _text(409, f"function {name!r} already exists in namespace {namespace!r}; "
                                  "update it with PUT /system/functions")
            return self._store_failed(error)
        self.functions.upsert_fastfunc(created, namespace)
        log.info("deployed function=%s.%s", name, namespace)
        return web.Response(status=202)

    async def update(self, request: web.Request) -> web.StreamResponse:
        store, body = self._store(), await self._json(request)
        try:
            self._within_policy(openfaas.to_fastfunc(body, self.functions.default_namespace))  # before any read
            assert isinstance(body, Mapping)
            name = str(body["service"])
            namespace = self._namespace(request, body.get("namespace") or None)
            for _ in range(CONFLICT_RETRIES):
                existing = await self._call(store.get_fastfunc, namespace, name)
                if existing is None:
                    return _text(404, f"no function {name!r} in namespace {namespace!r}; create it with POST "
                                      "/system/functions")
                wanted = openfaas.to_fastfunc(body, namespace, replicas=openfaas.fixed_replicas(existing))
                try:
                    await self._call(store.replace_fastfunc, namespace, name, _updated(existing, wanted))
                    return web.Response(status=202)
                except ApiError as error:
                    if error.status != CONFLICT:
                        raise
        except openfaas.InvalidDeployment as error:
            return self._invalid(error)
        except ApiError as error:
            return self._store_failed(error)
        return _text(409, f"function {name!r} changed {CONFLICT_RETRIES} times while being updated; retry")

    async def delete(self, request: web.Request) -> web.StreamResponse:
        store, body = self._store(), await self._json(request)
        try:
            name, namespace = openfaas.parse_delete_request(body, self.functions.default_namespace)
        except openfaas.InvalidDeployment as error:
            return self._invalid(error)
        namespace = self._namespace(request, namespace)
        try:
            if not await self._call(store.delete_fastfunc, namespace, name):
                return _text(404, f"no function {name!r} in namespace {namespace!r}")
        except ApiError as error:
            return self._store_failed(error)
        self.functions.remove_fastfunc((namespace, name))
        log.info("deleted function=%s.%s", name, namespace)
        return web.Response(status=202)

    async def scale(self, request: web.Request) -> web.StreamResponse:
        store = self._store()
        name, dotted = openfaas.split_function_name(request.match_info["name"], "")
        body = await self._json(request)
        try:
            replicas = openfaas.parse_scale_request(body, name)
            if over := self.options.policy.replicas_problem(replicas):
                raise openfaas.InvalidDeployment([over])
        except openfaas.InvalidDeployment as error:
            return self._invalid(error)
        asked = body.get("namespace") if isinstance(body, Mapping) else None
        namespace = self._namespace(request, dotted or asked or None)
        try:
            fastfunc = await self._call(store.get_fastfunc, namespace, name)
            if fastfunc is None:
                return await self._not_scaled(store, namespace, name, replicas)
            if problem := scale_problem(fastfunc, name, replicas):
                return _text(400, problem)
            if not openfaas.is_fixed(fastfunc):
                return web.Response(status=202, headers={AUTOSCALED_HEADER: "true"})
            await self._call(store.patch_fastfunc, namespace, name, openfaas.scale_patch(replicas))
        except ApiError as error:
            return self._store_failed(error)
        log.info("scaled function=%s.%s replicas=%d", name, namespace, replicas)
        return web.Response(status=202)

    async def _not_scaled(self, store: FunctionStore, namespace: str, name: str, replicas: int) -> web.Response:
        """The answer to scaling a function that is no FaSTFunc: 400 for a FaSTPod function, else 404."""
        fastpod = (await self._call(store.get_fastpod, namespace, name)
                   if namespace == self.functions.default_namespace else None)
        if fastpod is not None and openfaas.is_function_fastpod(fastpod):
            return _text(400, f"function {name!r} is a FaSTPod, served read-only; scale it with "
                              f"kubectl scale fastpod {name} -n {namespace} --replicas={replicas}")
        return _text(404, f"no function {name!r} in namespace {namespace!r}")

    async def info(self, request: web.Request) -> web.StreamResponse:
        try:
            release = importlib.metadata.version("fastgshare")
        except importlib.metadata.PackageNotFoundError:
            release = "dev"
        return web.json_response({"provider": "fastgshare", "orchestration": "kubernetes",
                                  "version": {"sha": "", "release": release, "commit_message": ""}})

    async def namespaces(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(list(self.functions.namespaces))

    async def healthz(self, request: web.Request) -> web.StreamResponse:
        if not self.functions.synced:
            return _text(503, "the function pods are not listed yet")
        return _text(200, "OK")

    async def metrics_page(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def function_logs(self, request: web.Request) -> web.StreamResponse:
        answer = await self.logs.open(dict(request.query.items()), lambda ns: self._namespace(request, ns),
                                      lambda ns, name: self.functions.exists((ns, name)))
        if isinstance(answer, logs.Refusal):
            return _text(answer.status, answer.message)
        response = web.StreamResponse(headers={"Content-Type": logs.CONTENT_TYPE})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            async for chunk in answer.chunks(lambda: _connected(request)):
                await response.write(chunk)
            await response.write_eof()
        except ConnectionError:
            log.info("the log reader of function=%s.%s went away", answer.query.name, answer.namespace)
        finally:
            answer.close()
        return response

    async def not_implemented(self, request: web.Request) -> web.StreamResponse:
        parts = request.path.strip("/").split("/")
        what = parts[1] if len(parts) > 1 else parts[0]
        message = NOT_IMPLEMENTED.get(what) or (f"{request.method} {request.path} is not part of fastgshare's "
                                                "OpenFaaS provider API")
        return _text(501, f"not implemented: {message}")


def _async_too_large() -> web.Response:
    return _text(413, f"body: more than {MAX_BODY_BYTES} bytes, the most an asynchronous invocation may queue; "
                      "call /function/ for larger bodies")


def _connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


def _updated(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """``existing`` with what a FunctionDeployment says: labels, annotations and the pod template replaced,
    scaling and fixed fields merged; other spec fields (SLO, profile, autoscaler settings) kept."""
    metadata = dict(existing.get("metadata") or {})
    for field in ("labels", "annotations"):
        metadata.pop(field, None)
        if wanted["metadata"].get(field):
            metadata[field] = wanted["metadata"][field]
    spec = dict(existing.get("spec") or {})
    new_spec = wanted["spec"]
    spec["podSpec"] = new_spec["podSpec"]
    for field in ("scaling", "fixed"):
        if field in new_spec:
            spec[field] = {**(spec.get(field) or {}), **new_spec[field]}
    if "memory" in new_spec:
        spec["memory"] = new_spec["memory"]
    return {"apiVersion": existing.get("apiVersion", keys.FASTFUNC_API_VERSION),
            "kind": existing.get("kind", keys.FASTFUNC_KIND), "metadata": metadata, "spec": spec}


class _ConnectionGuard:
    """The connection cap: a new connection over ``limit`` first closes the oldest connection that has no
    request in a handler (idle, or still sending its headers); with none such it is closed itself."""

    def __init__(self, limit: int) -> None:
        self.server: web.Server | None = None  # the runner's, once set up
        self.limit = limit
        self.busy: set[asyncio.BaseProtocol] = set()

    @web.middleware
    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        protocol = request.protocol
        self.busy.add(protocol)
        try:
            return await handler(request)
        finally:
            self.busy.discard(protocol)

    def __call__(self) -> asyncio.Protocol:
        assert self.server is not None
        connections = self.server.connections
        if len(connections) >= self.limit:
            idle = next((c for c in connections if c not in self.busy), None)
            if idle is None:
                log.warning("refusing a connection: %d open, all with a request in progress", len(connections))
                return _Refused()
            idle.force_close()
        return self.server()


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


async def serve(app: web.Application, host: str, port: int, stop: asyncio.Event, *,
                started: Callable[[int], None] | None = None, shutdown_timeout_s: float = 10.0,
                limits: ServerLimits | None = None) -> None:
    """Serve ``app`` until ``stop`` is set, then finish the requests in progress (up to the timeout)."""
    limits = limits or ServerLimits()
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout_s,
                           keepalive_timeout=limits.idle_timeout_s, max_line_size=limits.max_line_size,
                           max_field_size=limits.max_field_size, max_headers=limits.max_headers)
    guard = _ConnectionGuard(limits.max_connections)
    app.middlewares.insert(0, guard.track)
    await runner.setup()
    listener: asyncio.Server | None = None
    try:
        guard.server = runner.server
        listener = await asyncio.get_running_loop().create_server(guard, host, port, backlog=1024)
        bound = listener.sockets[0].getsockname()[1] if listener.sockets else port
        log.info("listening on %s:%d (at most %d connections, %gs to a request's headers)", host, bound,
                 limits.max_connections, limits.idle_timeout_s)
        if started is not None:
            started(bound)
        await stop.wait()
    finally:
        if listener is not None:
            listener.close()  # stop accepting; the runner finishes the requests in progress
        await runner.cleanup()
