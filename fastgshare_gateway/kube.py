"""The gateway's Kubernetes adapter (through :mod:`fastgshare_kube`): watches and FaSTFunc calls.

- :class:`Watches`: the project's list/watch loop (:class:`~fastgshare_kube.reflector.Reflector`) on the
  pods of each function namespace that carry the function label (and, in the default function namespace,
  the FaSTPod label: a FaSTPod applied there is a function), and on the FaSTFuncs (their names and the
  settings the gateway uses: minimum replicas, SLO); every change is
  handed to the event loop with ``loop.call_soon_threadsafe`` (the sinks run in the watch threads);
- :class:`KubeStore`: the :class:`~fastgshare_gateway.store.FunctionStore` over the API (custom objects as
  JSON), every failure the layer's :class:`~fastgshare_kube.errors.ApiError`;
- :class:`KubePodLogs`: the :class:`~fastgshare_gateway.logs.PodLogs` port: a function's pods (the same
  labels the watches select, the same membership rule as routing), and one pod's log (``timestamps=true``)
  as a line stream that another thread can close;
- :func:`missing_crd`: one line when the FaSTFunc CRD is not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fastgshare import keys
from fastgshare_gateway.endpoints import pod_entry
from fastgshare_gateway.logs import Instance, PodLogsError
from fastgshare_gateway.routing import Functions
from fastgshare_kube import rest
from fastgshare_kube.client import ApiClient, KubeConfigError, load_api_client  # noqa: F401 - this adapter's API
from fastgshare_kube.errors import ApiError
from fastgshare_kube.reflector import Reflector
from fastgshare_kube.rest import RawListWatch

WATCH_TIMEOUT_S = 240
REQUEST_TIMEOUT = (5.0, 30.0)
CRD_HINT = {404: f"the FaSTFunc CRD ({keys.FASTFUNC_CRD_NAME}) is not installed: kubectl apply -f "
                 "deploy/crd/fastfuncs.yaml", 403: "the gateway's service account may not list this resource (RBAC)"}


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


class _OnLoop:
    """A reflector sink that replays each call on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, replace: Callable[[list[dict[str, Any]]], None],
                 upsert: Callable[[Mapping[str, Any]], None], delete: Callable[[Mapping[str, Any]], None]) -> None:
        self._loop, self._replace, self._upsert, self._delete = loop, replace, upsert, delete

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self._loop.call_soon_threadsafe(self._replace, objects)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        self._loop.call_soon_threadsafe(self._upsert, obj)

    def delete(self, obj: Mapping[str, Any]) -> None:
        self._loop.call_soon_threadsafe(self._delete, obj)


class _Merged:
    """Several reflectors' lists as one: the pods of every watched namespace and label.

    Each part's pods are kept current from its own list *and* its watch events, so a (re)list of
    one part never drops what another part's watch added since that part's last list."""

    def __init__(self, functions: Functions, parts: int) -> None:
        self._functions = functions
        self._parts: dict[int, dict[str, dict[str, Any]]] = {}  # part -> pod uid -> pod
        self._count = parts

    def replace(self, part: int, objects: list[dict[str, Any]]) -> None:
        self._parts[part] = {_uid(pod): pod for pod in objects}
        if len(self._parts) == self._count:
            self._functions.replace_pods([pod for pods in self._parts.values() for pod in pods.values()])

    def upsert(self, part: int, obj: Mapping[str, Any]) -> None:
        self._parts.setdefault(part, {})[_uid(obj)] = dict(obj)
        self._functions.upsert_pod(obj)

    def delete(self, part: int, obj: Mapping[str, Any]) -> None:
        uid = _uid(obj)
        self._parts.setdefault(part, {}).pop(uid, None)
        elsewhere = next((pods[uid] for pods in self._parts.values() if uid in pods), None)
        if elsewhere is None:
            self._functions.delete_pod(obj)
        else:  # it left one label's watch but another still sees it
            self._functions.upsert_pod(elsewhere)


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


class Watches:
    def __init__(self, api: ApiClient, functions: Functions, loop: asyncio.AbstractEventLoop) -> None:
        core, custom = rest.core_v1(api), rest.custom_objects(api)
        sources = [(namespace, keys.FUNCTION_LABEL) for namespace in functions.namespaces]
        if functions.default_namespace in functions.namespaces:
            sources.append((functions.default_namespace, keys.FASTPOD_NAME_LABEL))
        merged = _Merged(functions, len(sources))
        self._reflectors = []
        for part, (namespace, label) in enumerate(sources):
            sink = _OnLoop(loop, functools.partial(merged.replace, part), functools.partial(merged.upsert, part),
                           functools.partial(merged.delete, part))
            source = RawListWatch(core.list_namespaced_pod, namespace=namespace, label_selector=label)
            self._reflectors.append(Reflector(f"function-pods-{namespace}-{label.rsplit('/', 1)[-1]}", source, sink,
                                              watch_timeout_s=WATCH_TIMEOUT_S))
        for namespace in functions.namespaces:
            source = RawListWatch(custom.list_namespaced_custom_object, group=keys.FASTFUNC_GROUP,
                                  version=keys.FASTFUNC_VERSION, namespace=namespace, plural=keys.FASTFUNC_PLURAL)
            sink = _OnLoop(loop, functools.partial(functions.replace_fastfuncs, namespace), functions.upsert_fastfunc,
                           lambda obj: functions.remove_fastfunc(_key(obj)))
            self._reflectors.append(Reflector(f"fastfuncs-{namespace}", source, sink, watch_timeout_s=WATCH_TIMEOUT_S,
                                              hints=CRD_HINT))

    def start(self) -> None:
        for reflector in self._reflectors:
            reflector.start()

    def stop(self) -> None:
        for reflector in self._reflectors:
            reflector.stop()


def missing_crd(api: ApiClient, namespace: str) -> str | None:
    """One line when FaSTFuncs cannot be listed for a reason a restart will not fix, else None."""
    try:
        rest.call(rest.custom_objects(api).list_namespaced_custom_object, keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION,
                  namespace, keys.FASTFUNC_PLURAL, limit=1, timeout_s=REQUEST_TIMEOUT)
    except ApiError as error:
        if error.status in CRD_HINT:
            return f"cannot list FaSTFuncs in namespace {namespace}: {CRD_HINT[error.status]} ({error})"
        if error.unreachable:
            return f"the Kubernetes API server does not answer: {error}; check --kubeconfig"
    return None


class KubeStore:
    def __init__(self, api: ApiClient) -> None:
        self._custom = rest.custom_objects(api)

    def _fastfunc_args(self, namespace: str) -> tuple[str, str, str, str]:
        return keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, namespace, keys.FASTFUNC_PLURAL

    def list_fastfuncs(self, namespace: str) -> list[dict[str, Any]]:
        return list(rest.call(self._custom.list_namespaced_custom_object, *self._fastfunc_args(namespace),
                              timeout_s=REQUEST_TIMEOUT).get("items") or [])

    def get_fastfunc(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return rest.call(self._custom.get_namespaced_custom_object, *self._fastfunc_args(namespace), name,
                             timeout_s=REQUEST_TIMEOUT)
        except ApiError as error:
            if error.not_found and "could not find the requested resource" not in error.message:
                return None
            raise

    def create_fastfunc(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return rest.call(self._custom.create_namespaced_custom_object, *self._fastfunc_args(namespace),
                         rest.raw(body), timeout_s=REQUEST_TIMEOUT)

    def replace_fastfunc(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return rest.call(self._custom.replace_namespaced_custom_object, *self._fastfunc_args(namespace), name,
                         rest.raw(body), timeout_s=REQUEST_TIMEOUT)

    def patch_fastfunc(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return rest.call(self._custom.patch_namespaced_custom_object, *self._fastfunc_args(namespace), name,
                         rest.raw(patch), _content_type=rest.MERGE_PATCH, timeout_s=REQUEST_TIMEOUT)

    def delete_fastfunc(self, namespace: str, name: str) -> bool:
        try:
            rest.call(self._custom.delete_namespaced_custom_object, *self._fastfunc_args(namespace), name,
                      body=rest.raw({"propagationPolicy": "Background"}), timeout_s=REQUEST_TIMEOUT)
            return True
        except ApiError as error:
            if error.not_found and "could not find the requested resource" not in error.message:
                return False
            raise

    def list_fastpods(self, namespace: str) -> list[dict[str, Any]]:
        try:
            return list(rest.call(self._custom.list_namespaced_custom_object, keys.FASTPOD_GROUP,
                                  keys.FASTPOD_VERSION, namespace, keys.FASTPOD_PLURAL,
                                  timeout_s=REQUEST_TIMEOUT).get("items") or [])
        except ApiError as error:
            if error.not_found:
                return []  # no FaSTPod CRD: no FaSTPod functions
            raise

    def get_fastpod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return rest.call(self._custom.get_namespaced_custom_object, keys.FASTPOD_GROUP, keys.FASTPOD_VERSION,
                             namespace, keys.FASTPOD_PLURAL, name, timeout_s=REQUEST_TIMEOUT)
        except ApiError as error:
            if error.not_found:
                return None
            raise


    def wake_fastpod(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> None:
        rest.call(self._custom.patch_namespaced_custom_object, keys.FASTPOD_GROUP, keys.FASTPOD_VERSION,
                  namespace, keys.FASTPOD_PLURAL, name, [dict(op) for op in patch], _content_type=rest.JSON_PATCH,
                  timeout_s=REQUEST_TIMEOUT)


MAX_LINE_BYTES = 64 * 1024  # a longer log line is cut into lines of this size


class KubePodLogs:
    """A function's pods and their logs through the API server (``pods`` list, ``pods/log`` get)."""

    def __init__(self, api: ApiClient, default_namespace: str = keys.DEFAULT_FUNCTION_NAMESPACE) -> None:
        self._core = rest.core_v1(api)
        self._default_namespace = default_namespace

    def function_pods(self, namespace: str, name: str) -> list[Instance]:
        """The pods of function ``name`` (``name`` a DNS label: safe in a selector), by name."""
        labels = [keys.FUNCTION_LABEL] + ([keys.FASTPOD_NAME_LABEL] if namespace == self._default_namespace else [])
        found: dict[str, Instance] = {}
        for label in labels:
            with _port_errors():
                listed = rest.call(self._core.list_namespaced_pod, namespace, label_selector=f"{label}={name}",
                                   timeout_s=REQUEST_TIMEOUT)
            for pod in listed.get("items") or []:
                if (namespace, name) in pod_entry(pod, self._default_namespace).functions:
                    containers = (pod.get("spec") or {}).get("containers") or [{}]
                    pod_name = str(pod["metadata"]["name"])
                    found[pod_name] = Instance(pod_name, containers[0].get("name"))
        return [found[pod] for pod in sorted(found)]

    def open(self, namespace: str, instance: Instance, *, follow: bool, tail: int | None,
             since_seconds: int | None, timeout_s: float) -> _PodLogStream:
        options: dict[str, Any] = {"follow": follow, "timestamps": True}
        if instance.container:
            options["container"] = instance.container
        if tail is not None:
            options["tail_lines"] = tail
        if since_seconds is not None:
            options["since_seconds"] = since_seconds
        with _port_errors(), rest.translated():
            response = self._core.read_namespaced_pod_log(instance.pod, namespace, **options, _preload_content=False,
                                                          _request_timeout=(REQUEST_TIMEOUT[0], timeout_s))
        return _PodLogStream(response)


class _PodLogStream:
    """An open log answer read as lines; :meth:`close` from another thread shuts its socket down."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def __iter__(self) -> Iterator[str]:
        buffer = bytearray()
        with _port_errors(), rest.translated():
            for chunk in self._response.stream(None, decode_content=False):
                buffer.extend(chunk)
                while (end := buffer.find(b"\n")) != -1 or len(buffer) >= MAX_LINE_BYTES:
                    cut = end if end != -1 and end < MAX_LINE_BYTES else MAX_LINE_BYTES
                    yield buffer[:cut].decode("utf-8", errors="replace")
                    del buffer[:cut + 1 if cut == end else cut]
        if buffer:
            yield buffer.decode("utf-8", errors="replace")

    def close(self) -> None:
        sock = getattr(getattr(self._response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._response.release_conn()


@contextlib.contextmanager
def _port_errors() -> Iterator[None]:
    """The layer's :class:`ApiError` as the logs port's :class:`PodLogsError`."""
    try:
        yield
    except ApiError as error:
        raise PodLogsError(error.status, error.message or str(error)) from None
