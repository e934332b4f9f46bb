"""The arbiter's native engine (``arbiter_engine/``, C), loaded with ctypes: the binding, nothing more.

:class:`NativeEngine` owns the arbiter's connections and answers the token renewals itself on a
thread of its own (``arbiter_engine/engine_abi.h`` says what it does and what it hands to Python);
:class:`~device_plugin.arbiter.server.ArbiterServer` drives it. :class:`NativePolicy` and
:class:`NativeMeter` expose the engine's scheduler and usage meter with the interfaces of their
specifications, :class:`~fastgshare.arbitration.GpuArbiter` and
:class:`~fastgshare.usage.UsageMeter`, so the tests can hold them to the same behaviour.

The library is built by every install of the package (``setup.py``: an extension module
``device_plugin.arbiter._engine`` with no Python API). Its whole ABI is one header,
``arbiter_engine/engine_abi.h``; :data:`ABI_FUNCTIONS`, :data:`ABI_STRUCTS` and :data:`ABI_CONSTANTS`
mirror it, and ``tests/unit/device_plugin/test_engine_abi.py`` checks them against the header and the
compiler's layout. Change the header and these tables together.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
from collections.abc import Hashable, Sequence

import attrs

from fastgshare.arbitration import ArbitrationError, Decision, Grant, TimeShare
from fastgshare.protocol import MAX_FRAME
from fastgshare.usage import WAIT_BUCKETS_S, GpuUsage, PodUsage, UsageSnapshot

NO_TIME = -(2**63)
MAX_WAIT_BUCKETS = 32
MAX_POD_NAME = 320
EVENT_ACCEPTED, EVENT_FRAME, EVENT_BAD, EVENT_CLOSED = 1, 2, 3, 4
ABI_CONSTANTS: dict[str, int] = {
    "FGS_NO_TIME": NO_TIME, "FGS_MAX_WAIT_BUCKETS": MAX_WAIT_BUCKETS, "FGS_MAX_POD_NAME": MAX_POD_NAME,
    "FGS_EVENT_ACCEPTED": EVENT_ACCEPTED, "FGS_EVENT_FRAME": EVENT_FRAME, "FGS_EVENT_BAD": EVENT_BAD,
    "FGS_EVENT_CLOSED": EVENT_CLOSED,
}
WAIT_BOUNDS_NS = tuple(round(bound * 1e9) for bound in WAIT_BUCKETS_S)


class NativeEngineMissing(RuntimeError):
    """The engine's library was not built with this installation."""


class _Share(ctypes.Structure):
    _fields_ = [("request_permille", ctypes.c_int32), ("limit_permille", ctypes.c_int32),
                ("sm_percent", ctypes.c_int32)]


class _Grant(ctypes.Structure):
    _fields_ = [("client", ctypes.c_uint32), ("token_ns", ctypes.c_int64)]


class _Event(ctypes.Structure):
    _fields_ = [("connection", ctypes.c_uint64), ("kind", ctypes.c_int32), ("pid", ctypes.c_int32),
                ("length", ctypes.c_uint32)]


class _PodUsage(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_int32), ("pod", ctypes.c_char * MAX_POD_NAME), ("in_window_ns", ctypes.c_int64),
                ("used_ns_total", ctypes.c_int64), ("throttled_ns_total", ctypes.c_int64),
                ("wait_sum_ns", ctypes.c_int64), ("wait_counts", ctypes.c_int64 * (MAX_WAIT_BUCKETS + 1))]


ABI_STRUCTS: dict[str, type[ctypes.Structure]] = {
    "fgs_share": _Share, "fgs_grant": _Grant, "fgs_event": _Event, "fgs_pod_usage": _PodUsage,
}

_p, _u64, _i64, _i32, _u32 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint32
_bool, _str = ctypes.c_bool, ctypes.c_char_p
_u8p, _i64p = ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(ctypes.c_int64)
# name: (return type, argument types), in engine_abi.h's order. Opaque handles are c_void_p; a byte
# buffer (uint8_t *) that Python fills or passes as bytes is c_char_p.
ABI_FUNCTIONS: dict[str, tuple[object, tuple[object, ...]]] = {
    "fgs_policy_new": (_p, (_i64, _i64, _bool)),
    "fgs_policy_free": (None, (_p,)),
    "fgs_policy_add": (_i32, (_p, _u32, _Share)),
    "fgs_policy_set_share": (_i32, (_p, _u32, _Share)),
    "fgs_policy_get_share": (_i32, (_p, _u32, ctypes.POINTER(_Share))),
    "fgs_policy_remove": (None, (_p, _u32)),
    "fgs_policy_request": (_i32, (_p, _u32, _i64, _i64)),
    "fgs_policy_release": (_i32, (_p, _u32, _i64, _i64)),
    "fgs_policy_is_waiting": (_i32, (_p, _u32)),
    "fgs_policy_holding_until": (_i64, (_p, _u32)),
    "fgs_policy_usage": (_i64, (_p, _u32, _i64)),
    "fgs_policy_anyone_waiting": (_bool, (_p,)),
    "fgs_policy_schedule": (_i32, (_p, _i64, ctypes.POINTER(ctypes.POINTER(_Grant)), _i64p)),
    "fgs_token_charge": (_i64, (_i64, _i64, _i64, _u64)),
    "fgs_meter_new": (_p, (_i64, _i64p, _i32, _i32)),
    "fgs_meter_free": (None, (_p,)),
    "fgs_meter_join": (_p, (_p, _i32, _str)),
    "fgs_meter_leave": (None, (_p,)),
    "fgs_meter_asked": (None, (_p, _i64, _bool)),
    "fgs_meter_granted": (None, (_p, _p, _i64)),
    "fgs_meter_used": (None, (_p, _p, _i64, _i64)),
    "fgs_meter_snapshot": (_i32, (_p, _i64, ctypes.POINTER(ctypes.POINTER(_PodUsage)), _i64p)),
    "fgs_engine_new": (_p, (_i32, _i32, _u8p, _i64, _i64, _i64, _i64p, _i32)),
    "fgs_engine_start": (_i32, (_p,)),
    "fgs_engine_stop": (None, (_p,)),
    "fgs_engine_free": (None, (_p,)),
    "fgs_engine_event_fd": (_i32, (_p,)),
    "fgs_engine_next_event": (_i32, (_p, ctypes.POINTER(_Event), _str, _u32)),
    "fgs_engine_set_group": (_i32, (_p, _u64, _u32)),
    "fgs_engine_add_probe": (_i32, (_p, _i32)),
    "fgs_engine_send": (_i32, (_p, _u64, _str, _u32)),
    "fgs_engine_close": (_i32, (_p, _u64)),
    "fgs_engine_register": (_i32, (_p, _u64, _i32, _str, _Share)),
    "fgs_engine_token": (_i32, (_p, _u64, _u32, _u64)),
    "fgs_engine_set_share": (_i32, (_p, _i32, _str, _Share)),
    "fgs_engine_snapshot": (_i32, (_p, ctypes.POINTER(ctypes.POINTER(_PodUsage)), _i64p, _i64p)),
}


def library_path() -> str:
    spec = importlib.util.find_spec("device_plugin.arbiter._engine")
    if spec is None or spec.origin is None or not os.path.exists(spec.origin):
        raise NativeEngineMissing(
            "the arbiter's native engine (device_plugin/arbiter/_engine*.so) is not built: install the package "
            "again with gcc present (make install, or pip install -e .), which compiles arbiter_engine/")
    return spec.origin


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(library_path())
    for name, (restype, argtypes) in ABI_FUNCTIONS.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


_lib: ctypes.CDLL | None = None


def _library() -> ctypes.CDLL:
    global _lib  # noqa: PLW0603 - loaded once, on first use
    if _lib is None:
        _lib = _load()
    return _lib


def _share(share: TimeShare) -> _Share:
    return _Share(share.request_permille, share.limit_permille, share.sm_percent)


def _bounds() -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * len(WAIT_BOUNDS_NS))(*WAIT_BOUNDS_NS)


def _pod_usages(pods: ctypes._Pointer[_PodUsage], count: int, gpu_names: Sequence[str],
                window_ns: int) -> list[PodUsage]:
    usages = []
    for index in range(count):
        raw = pods[index]
        counts = list(raw.wait_counts[:len(WAIT_BOUNDS_NS) + 1])
        cumulative, running = [], 0
        for count_in_bucket in counts:
            running += count_in_bucket
            cumulative.append(running)
        usages.append(PodUsage(pod=raw.pod.decode(), gpu=gpu_names[raw.gpu],
                               share=min(1.0, raw.in_window_ns / window_ns),
                               used_seconds_total=raw.used_ns_total / 1e9,
                               throttled_seconds_total=raw.throttled_ns_total / 1e9,
                               wait_bucket_counts=tuple(cumulative), wait_sum_seconds=raw.wait_sum_ns / 1e9,
                               wait_count=running))
    return usages


def _snapshot(pods: list[PodUsage], busy: Sequence[int], gpu_names: Sequence[str], window_ns: int) -> UsageSnapshot:
    gpus = [GpuUsage(gpu=name, busy_share=min(1.0, busy[index] / window_ns))
            for index, name in enumerate(gpu_names) if busy[index] >= 0]
    return UsageSnapshot(window_s=window_ns / 1e9, pods=tuple(sorted(pods, key=lambda p: (p.gpu, p.pod))),
                         gpus=tuple(sorted(gpus, key=lambda g: g.gpu)))


@attrs.frozen
class EngineEvent:
    kind: int
    connection: int
    pid: int
    data: bytes


class NativeEngine:
    """The engine over a listening unix socket (which the caller keeps and closes after :meth:`stop`)."""

    def __init__(self, listen_fd: int, gpus: Sequence[tuple[str, bool]], *, window_ns: int, min_token_ns: int,
                 meter_window_ns: int) -> None:
        self._lib = _library()
        self.gpu_names = [name for name, _ in gpus]
        self._gpu_index = {name: index for index, name in enumerate(self.gpu_names)}
        self._meter_window_ns = meter_window_ns
        mps = (ctypes.c_uint8 * max(1, len(gpus)))(*[1 if enabled else 0 for _, enabled in gpus])
        self._engine = self._lib.fgs_engine_new(listen_fd, len(gpus), mps, window_ns, min_token_ns, meter_window_ns,
                                                _bounds(), len(WAIT_BOUNDS_NS))
        if not self._engine:
            raise ArbitrationError(f"the native engine refused window_ns={window_ns} min_token_ns={min_token_ns} "
                                   "(need 0 < min_token_ns <= window_ns)")
        self._event = _Event()
        self._buffer = ctypes.create_string_buffer(4 * MAX_FRAME)
        self._busy = (ctypes.c_int64 * max(1, len(gpus)))()
        self.event_fd = int(self._lib.fgs_engine_event_fd(self._engine))

    def start(self) -> None:
        error = self._lib.fgs_engine_start(self._engine)
        if error:
            raise OSError(error, f"cannot start the arbiter's engine thread: {os.strerror(error)}")

    def close(self) -> None:
        """Stop the thread, close every connection (no events) and free the engine; calls after this do nothing."""
        engine, self._engine = self._engine, None
        if engine:
            self._lib.fgs_engine_free(engine)

    def events(self, limit: int) -> list[EngineEvent]:
        """Up to ``limit`` of the events waiting now, one group after another (read :attr:`event_fd`
        first, so that later ones wake the loop again)."""
        with contextlib.suppress(BlockingIOError):
            os.read(self.event_fd, 8)
        taken: list[EngineEvent] = []
        while len(taken) < limit and self._engine and self._lib.fgs_engine_next_event(
                self._engine, ctypes.byref(self._event), self._buffer, len(self._buffer)):
            event = self._event
            taken.append(EngineEvent(event.kind, event.connection, event.pid, self._buffer.raw[:event.length]))
        return taken

    def set_group(self, connection: int, group: int) -> None:
        """Whose the connection is (1..2**20, one number per peer); the engine reads it from now on."""
        if self._engine and self._lib.fgs_engine_set_group(self._engine, connection, group) == -2:
            raise MemoryError("the arbiter's engine is out of memory")

    def add_probe(self, descriptor: int) -> bool:
        """Hand one end of a socketpair to the engine (it owns it from now on): it answers PINGs there."""
        if not self._engine:
            os.close(descriptor)
            return False
        return bool(self._lib.fgs_engine_add_probe(self._engine, descriptor) == 0)

    def send(self, connection: int, data: bytes) -> None:
        if self._engine:
            self._lib.fgs_engine_send(self._engine, connection, data, len(data))

    def close_connection(self, connection: int) -> None:
        if self._engine:
            self._lib.fgs_engine_close(self._engine, connection)

    def register(self, connection: int, gpu: str, pod: str, share: TimeShare) -> bool:
        """The connection's HELLO was accepted: False if it is gone already (its CLOSED event follows)."""
        if not self._engine:
            return False
        result = self._lib.fgs_engine_register(self._engine, connection, self._gpu_index[gpu], pod.encode(),
                                               _share(share))
        if result == -2:
            raise MemoryError("the arbiter's engine is out of memory")
        return bool(result == 0)

    def token(self, connection: int, request_id: int, used_ns: int) -> None:
        if self._engine:
            self._lib.fgs_engine_token(self._engine, connection, request_id, used_ns)

    def set_share(self, gpu: str, pod: str, share: TimeShare) -> bool:
        """Whether the share differs from what the GPU's scheduler had for the connected pod."""
        if not self._engine:
            return False
        return bool(self._lib.fgs_engine_set_share(self._engine, self._gpu_index[gpu], pod.encode(),
                                                   _share(share)) == 1)

    def usage(self) -> UsageSnapshot:
        if not self._engine:
            return _snapshot([], [-1] * len(self.gpu_names), self.gpu_names, self._meter_window_ns)
        pods = ctypes.POINTER(_PodUsage)()
        now = ctypes.c_int64()
        count = self._lib.fgs_engine_snapshot(self._engine, ctypes.byref(pods), self._busy, ctypes.byref(now))
        if count < 0:
            raise MemoryError("the arbiter's engine is out of memory")
        return _snapshot(_pod_usages(pods, count, self.gpu_names, self._meter_window_ns), list(self._busy),
                         self.gpu_names, self._meter_window_ns)


def token_charge(granted_at_ns: int, token_ns: int, now_ns: int, reported_ns: int) -> int:
    """What the engine charges a returned token (``fgs_token_charge``; for the tests)."""
    return int(_library().fgs_token_charge(granted_at_ns, token_ns, now_ns, reported_ns))


class NativePolicy:
    """The engine's scheduler with :class:`~fastgshare.arbitration.GpuArbiter`'s interface (for the tests)."""

    def __init__(self, *, window_ns: int, min_token_ns: int, mps_enabled: bool = True) -> None:
        self._lib = _library()
        self._policy = self._lib.fgs_policy_new(window_ns, min_token_ns, mps_enabled)
        if not self._policy:
            raise ArbitrationError(f"need window_ns > 0 and 0 < min_token_ns <= window_ns, "
                                   f"got {window_ns} and {min_token_ns}")
        self.window_ns, self.min_token_ns, self.mps_enabled = window_ns, min_token_ns, mps_enabled
        self._ids: dict[Hashable, int] = {}
        self._clients: dict[int, Hashable] = {}
        self._free: list[int] = []

    def __del__(self) -> None:
        policy, self._policy = getattr(self, "_policy", None), None
        if policy:
            self._lib.fgs_policy_free(policy)

    def _id(self, client: Hashable) -> int:
        try:
            return self._ids[client]
        except KeyError:
            raise ArbitrationError(f"client {client!r} is not registered") from None

    def add_client(self, client: Hashable, share: TimeShare) -> None:
        if client in self._ids:
            raise ArbitrationError(f"client {client!r} is already registered")
        number = self._free.pop() if self._free else len(self._ids)
        if self._lib.fgs_policy_add(self._policy, number, _share(share)) != 0:
            raise MemoryError("fgs_policy_add failed")
        self._ids[client], self._clients[number] = number, client

    def update_share(self, client: Hashable, share: TimeShare) -> None:
        self._lib.fgs_policy_set_share(self._policy, self._id(client), _share(share))

    def remove_client(self, client: Hashable) -> None:
        number = self._ids.pop(client, None)
        if number is not None:
            self._lib.fgs_policy_remove(self._policy, number)
            del self._clients[number]
            self._free.append(number)

    @property
    def clients(self) -> tuple[Hashable, ...]:
        return tuple(self._ids)

    def share(self, client: Hashable) -> TimeShare:
        raw = _Share()
        self._lib.fgs_policy_get_share(self._policy, self._id(client), ctypes.byref(raw))
        return TimeShare(raw.request_permille, raw.limit_permille, raw.sm_percent)

    def request(self, client: Hashable, now_ns: int, used_ns: int) -> None:
        self._lib.fgs_policy_request(self._policy, self._id(client), now_ns, used_ns)

    def release(self, client: Hashable, now_ns: int, used_ns: int) -> None:
        self._lib.fgs_policy_release(self._policy, self._id(client), now_ns, used_ns)

    def is_waiting(self, client: Hashable) -> bool:
        return bool(self._lib.fgs_policy_is_waiting(self._policy, self._id(client)) == 1)

    @property
    def anyone_waiting(self) -> bool:
        return bool(self._lib.fgs_policy_anyone_waiting(self._policy))

    def holding_until(self, client: Hashable) -> int | None:
        until = int(self._lib.fgs_policy_holding_until(self._policy, self._id(client)))
        return None if until == NO_TIME else until

    def usage_ns(self, client: Hashable, now_ns: int) -> int:
        return int(self._lib.fgs_policy_usage(self._policy, self._id(client), now_ns))

    def schedule(self, now_ns: int) -> Decision:
        grants = ctypes.POINTER(_Grant)()
        wake = ctypes.c_int64()
        count = self._lib.fgs_policy_schedule(self._policy, now_ns, ctypes.byref(grants), ctypes.byref(wake))
        if count < 0:
            raise MemoryError("fgs_policy_schedule failed")
        return Decision(tuple(Grant(self._clients[grants[i].client], int(grants[i].token_ns)) for i in range(count)),
                        None if wake.value == NO_TIME else int(wake.value))


class NativeMeter:
    """The engine's usage meter with :class:`~fastgshare.usage.UsageMeter`'s interface (for the tests)."""

    def __init__(self, gpus: Sequence[str], window_ns: int) -> None:
        self._lib = _library()
        self.window_ns = window_ns
        self._gpus = list(gpus)
        self._meter = self._lib.fgs_meter_new(window_ns, _bounds(), len(WAIT_BOUNDS_NS), len(self._gpus))
        self._pods: dict[tuple[str, str], int] = {}

    def __del__(self) -> None:
        meter, self._meter = getattr(self, "_meter", None), None
        if meter:
            self._lib.fgs_meter_free(meter)

    def join(self, gpu: str, pod: str) -> None:
        self._pods[(gpu, pod)] = self._lib.fgs_meter_join(self._meter, self._gpus.index(gpu), pod.encode())

    def leave(self, gpu: str, pod: str) -> None:
        self._lib.fgs_meter_leave(self._pods[(gpu, pod)])

    def asked(self, gpu: str, pod: str, now_ns: int, *, at_limit: bool) -> None:
        self._lib.fgs_meter_asked(self._pods[(gpu, pod)], now_ns, at_limit)

    def granted(self, gpu: str, pod: str, now_ns: int) -> None:
        self._lib.fgs_meter_granted(self._meter, self._pods[(gpu, pod)], now_ns)

    def used(self, gpu: str, pod: str, start_ns: int, used_ns: int) -> None:
        self._lib.fgs_meter_used(self._meter, self._pods[(gpu, pod)], start_ns, used_ns)

    def snapshot(self, now_ns: int) -> UsageSnapshot:
        pods = ctypes.POINTER(_PodUsage)()
        busy = (ctypes.c_int64 * max(1, len(self._gpus)))()
        count = self._lib.fgs_meter_snapshot(self._meter, now_ns, ctypes.byref(pods), busy)
        return _snapshot(_pod_usages(pods, count, self._gpus, self.window_ns), list(busy), self._gpus, self.window_ns)
