"""The gateway's HTTP basic auth, as OpenFaaS's gateway does it: who may call which route.

Credentials are the files ``basic-auth-user`` and ``basic-auth-password`` (:data:`keys.BASIC_AUTH_USER_KEY`,
:data:`keys.BASIC_AUTH_PASSWORD_KEY`) in one directory, the Secret ``basic-auth`` mounted there
(``--basic-auth-dir``). They are read at start (missing or empty: :class:`AuthConfigError`, the gateway
does not start) and again whenever either file changes (inode, size or mtime: a rotated Secret applies
without a restart; a file missing or empty mid-rotation keeps the last credentials, with one warning).
Compared in constant time; never logged.

Which routes need them (:func:`needs_auth`, applied by the HTTP edge's middleware in
:mod:`fastgshare_gateway.http`): everything but ``/healthz`` and ``/metrics`` (probes and Prometheus), and
``/function/*`` / ``/async-function/*`` unless ``auth_functions``: default-deny, so a route added later is
protected. Without credentials: 401 with ``WWW-Authenticate: Basic realm="fastgshare"``. Pure but for reading
the two files (no server, no aiohttp).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import os
import threading
from pathlib import Path

from fastgshare import keys

log = logging.getLogger(__name__)

REALM = "fastgshare"
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
FUNCTION_PREFIXES = ("/function/", "/async-function/")


class AuthConfigError(Exception):
    """The credentials directory cannot be used; the message is one line naming the file."""


def _read(path: Path) -> bytes:
    """A credential file's content, trimmed of surrounding white space (as OpenFaaS trims it)."""
    try:
        value = path.read_bytes().strip()
    except OSError as error:
        raise AuthConfigError(f"--basic-auth-dir: cannot read {path}: {error.strerror or error}") from None
    if not value:
        raise AuthConfigError(f"--basic-auth-dir: {path} is empty; it must hold the credential "
                              f"(the Secret {keys.BASIC_AUTH_SECRET}'s key {path.name})")
    return value


class BasicAuth:
    """The credentials in ``directory``, re-read when the files change."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._user_path = self.directory / keys.BASIC_AUTH_USER_KEY
        self._password_path = self.directory / keys.BASIC_AUTH_PASSWORD_KEY
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._user, self._password = _read(self._user_path), _read(self._password_path)
        self._warned = False

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in (self._user_path, self._password_path):
            try:
                info = os.stat(path)
            except OSError:
                stamps.append((-1, -1, -1))
                continue
            stamps.append((info.st_ino, info.st_size, info.st_mtime_ns))
        return tuple(stamps)

    def _refresh(self) -> None:
        stamp = self._stat()
        if stamp == self._stamp:
            return
        with self._lock:
            try:
                user, password = _read(self._user_path), _read(self._password_path)
            except AuthConfigError as error:
                if not self._warned:
                    log.warning("keeping the last gateway credentials: %s", error)
                    self._warned = True
                return
            self._user, self._password, self._stamp, self._warned = user, password, stamp, False
            log.info("gateway credentials re-read from %s", self.directory)

    def check(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries the credentials (constant-time comparison)."""
        self._refresh()
        scheme, _, encoded = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, colon, password = decoded.partition(b":")
        if not colon:
            return False
        user_ok = hmac.compare_digest(user, self._user)
        password_ok = hmac.compare_digest(password, self._password)
        return user_ok & password_ok  # both compared, whichever is wrong


def needs_auth(path: str, *, auth_functions: bool) -> bool:
    """Whether a route (its canonical path) requires credentials: all but the probes, and functions unless
    asked."""
    if path in OPEN_PATHS:
        return False
    if path.startswith(FUNCTION_PREFIXES):
        return auth_functions
    return True
