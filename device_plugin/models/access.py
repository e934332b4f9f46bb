"""The pod-facing side of the model store: ``model.sock`` in the agent's run directory (mounted
read-only into every GPU container at ``/var/run/fastgshare``, next to the arbiter's socket;
containers find it in ``FASTGSHARE_MODEL_SOCKET``).

Who asks is never taken on trust: the kernel names the peer's PID (``SO_PEERCRED``), its cgroup
names the pod UID (:mod:`device_plugin.arbiter.identity`), and the pod must be in the agent's pod
records, as the arbiter identifies hooks. The trusted-env mode (tests without pods only, as the
standalone arbiter's ``--trusted-env``; the node agent never uses it) believes the pod key the
request names instead. The model is the pod's own (its ``fastgshare/model`` annotation, in its
namespace), on the GPU of its assignment; a request naming another model is refused. The answer is
the pod->agent protocol (:mod:`.protocol`): the handle, or one line saying what is wrong and how to
fix it.

Edge: one request a connection; a request line of at most 4096 bytes within 5 s; at most
``max_connections_per_pod`` connections open per pod (per process outside pods) and
``max_connections`` in all; one over a cap is told so in one line (after its request, waited for
half a second; 16 such at a time, more are closed at once) and closed. An answer may wait
for the model's first load (the worker reads the file into GPU memory).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from device_plugin.allocation import NodePod
from device_plugin.arbiter.identity import peer_pid, pod_uid_of_pid
from device_plugin.models import protocol
from device_plugin.models.store import Acquired, ModelUnavailable
from device_plugin.models.worker import read_line
from fastgshare.model import ModelRef

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS_PER_POD = 8
DEFAULT_MAX_CONNECTIONS = 64
ACCEPT_TICK_S = 0.5
MAX_REFUSING = 16  # refused connections told why at once; more are closed at once
REFUSE_WAIT_S = 0.5  # how long a refused connection may take to send the request it is told why on


class PodSource(Protocol):
    def snapshot(self) -> tuple[int, list[NodePod]]: ...


class Store(Protocol):
    """What the server asks of the store (:class:`~device_plugin.models.store.ModelStore`)."""

    def model_of(self, pod: NodePod) -> ModelRef: ...

    def acquire(self, pod: NodePod) -> Acquired: ...


def open_model(pod: NodePod, request: protocol.OpenRequest, store: Store) -> dict[str, object]:
    """The answer to ``pod``'s request: its own model's handle, or one line saying why not."""
    try:
        model = store.model_of(pod)
        if request.model and request.model != model.spec.name:
            return protocol.error(f"pod {pod.key} may open only its own function's model {model.spec.name!r} "
                                  f"(annotation fastgshare/model), not {request.model!r}: ask for "
                                  f"{model.spec.name!r} or for \"\" (the pod's own)")
        acquired = store.acquire(pod)
    except ModelUnavailable as error:
        return protocol.error(str(error))
    return protocol.open_answer(acquired.handle, acquired.bytes, acquired.key)


class ModelAccessServer:
    """The threaded unix-socket server on ``model.sock``."""

    def __init__(self, socket_path: Path, pods: PodSource, store: Store, *, trusted_env: bool = False,
                 synced: Callable[[], bool] = lambda: True,
                 pod_uid: Callable[[int], str | None] = pod_uid_of_pid,
                 max_connections_per_pod: int = DEFAULT_MAX_CONNECTIONS_PER_POD,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, timeout_s: float = protocol.TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self._pods = pods
        self._store = store
        self._trusted = trusted_env
        self._synced = synced
        self._pod_uid = pod_uid
        self._max_per_pod = max_connections_per_pod
        self._max = max_connections
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._refusing = 0
        self._open: dict[str, int] = {}  # peer (pod uid, or pid outside pods) -> connections being served
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.socket_path))
            os.chmod(self.socket_path, 0o666)  # any container user may connect; who it is comes from the kernel
            listener.listen(64)
            listener.settimeout(ACCEPT_TICK_S)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self._thread = threading.Thread(target=self._accept_loop, name="model-access", daemon=True)
        self._thread.start()
        log.info("model socket listening socket=%s trusted_env=%s", self.socket_path, self._trusted)

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._listener is not None:
            self._listener.close()
        self.socket_path.unlink(missing_ok=True)

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as error:
                if self._stopping.is_set():
                    return
                log.warning("model socket accept failed: %s", error)
                continue
            try:
                self._admit(connection)
            except Exception:  # a bug must cost one connection, not the listener
                log.exception("model socket: unexpected error admitting a connection")
                connection.close()

    def _admit(self, connection: socket.socket) -> None:
        pid = peer_pid(connection)
        uid = None if self._trusted else self._pod_uid(pid)
        peer = f"pod {uid}" if uid else f"pid {pid}"
        with self._lock:
            total = sum(self._open.values())
            count = self._open.get(peer, 0)
            refusal = (f"the node agent's model socket already serves {total} connections (its cap); try again"
                       if total >= self._max else
                       f"{peer} already has {count} connections open to the model socket (its cap is "
                       f"{self._max_per_pod}); close one, or ask one at a time" if count >= self._max_per_pod
                       else None)
            if refusal is None:
                self._open[peer] = count + 1
        if refusal is not None:
            log.warning("model socket refused pid=%d: %s", pid, refusal)
            with self._lock:
                telling = self._refusing < MAX_REFUSING
                self._refusing += telling
            if not telling:  # a flood: closed at once
                connection.close()
                return
            threading.Thread(target=self._refuse, args=(connection, refusal), name="model-refusal",
                             daemon=True).start()
            return
        threading.Thread(target=self._serve, args=(connection, pid, uid, peer), name="model-request",
                         daemon=True).start()

    def _refuse(self, connection: socket.socket, refusal: str) -> None:
        """Over a cap: wait briefly for the request (so the client is not cut off while it sends),
        answer why, close."""
        try:
            with connection:
                connection.settimeout(REFUSE_WAIT_S)
                with contextlib.suppress(OSError, protocol.ProtocolError):
                    read_line(connection)
                self._answer(connection, protocol.error(refusal), REFUSE_WAIT_S)
        finally:
            with self._lock:
                self._refusing -= 1

    def _serve(self, connection: socket.socket, pid: int, uid: str | None, peer: str) -> None:
        try:
            with connection:
                answer = self._answer_for(connection, pid, uid)
                self._answer(connection, answer, self._timeout_s)
        finally:
            with self._lock:
                self._open[peer] -= 1
                if not self._open[peer]:
                    del self._open[peer]

    def _answer_for(self, connection: socket.socket, pid: int, uid: str | None) -> dict[str, object]:
        connection.settimeout(self._timeout_s)
        try:
            request = protocol.parse_open_request(protocol.decode_line(read_line(connection)))
        except protocol.ProtocolError as error:
            return protocol.error(str(error))
        except TimeoutError:
            return protocol.error(f"no request line within {self._timeout_s:g}s; send one JSON line "
                                  "{\"op\": \"open\", \"model\": \"\"}")
        except OSError as error:
            return protocol.error(f"cannot read the request: {error.strerror or error}")
        pod, problem = self._pod(pid, uid, request)
        if pod is None:
            log.info("model socket refused pid=%d: %s", pid, problem)
            return protocol.error(problem)
        answer = open_model(pod, request, self._store)
        if answer.get("ok"):
            log.info("model handed pod=%s model=%s pid=%d", pod.key, answer.get("model"), pid)
        else:
            log.info("model refused pod=%s pid=%d: %s", pod.key, pid, answer.get("error"))
        return answer

    def _pod(self, pid: int, uid: str | None, request: protocol.OpenRequest) -> tuple[NodePod | None, str]:
        if not self._synced():
            return None, "the node agent is starting and has not read this node's pods yet; try again in a few seconds"
        pods = self._pods.snapshot()[1]
        if self._trusted:
            if not request.pod:
                return None, "trusted-env mode: the request must name its pod (\"pod\": \"namespace/name\")"
            found = next((pod for pod in pods if pod.key == request.pod), None)
            return found, f"pod {request.pod} is not on this node"
        if not uid:
            return None, (f"pid {pid} belongs to no pod (its cgroup names none): the model socket serves the GPU "
                          "pods of this node")
        found = next((pod for pod in pods if pod.uid == uid), None)
        return found, f"pod {uid} (pid {pid}) is not one of this node's pods in the node agent's records"

    def _answer(self, connection: socket.socket, answer: dict[str, object], timeout_s: float) -> None:
        try:
            connection.settimeout(timeout_s)
            connection.sendall(protocol.encode_line(answer))
        except OSError as error:
            log.info("model socket: could not answer: %s", error)
