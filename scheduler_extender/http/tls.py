"""The webhook's TLS: a server context whose certificate follows its files.

The certificate lives in a Secret that ``deploy/install.sh`` creates and renews; the kubelet
updates the mounted files in place. Each new connection (the SNI callback runs for every
handshake, with or without a server name) checks the files' modification times and loads the
new pair when they changed, so a renewed certificate is served without a restart. A pair that
does not load (say, half written) keeps the previous one and says so in the log.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading

log = logging.getLogger(__name__)


class TlsConfigError(ValueError):
    """The certificate or key cannot be used; the message names the file."""


class ReloadingContext:
    """``context`` serves ``cert_file`` and ``key_file``, reloading them when they change."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self._cert_file, self._key_file = cert_file, key_file
        self._lock = threading.Lock()
        self._stamp = self._mtimes()
        self._current = self._load()
        self.context = self._load()
        self.context.sni_callback = self._on_hello

    def _mtimes(self) -> tuple[int, int]:
        try:
            return os.stat(self._cert_file).st_mtime_ns, os.stat(self._key_file).st_mtime_ns
        except OSError as error:
            raise TlsConfigError(f"cannot read the webhook certificate: {error}") from None

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self._cert_file, self._key_file)
        except (OSError, ssl.SSLError) as error:
            raise TlsConfigError(f"--webhook-cert {self._cert_file} / --webhook-key {self._key_file} cannot be "
                                 f"loaded: {error}") from None
        return context

    def current(self) -> ssl.SSLContext:
        """The context for a new connection, reloaded if the files changed."""
        with self._lock:
            try:
                stamp = self._mtimes()
                if stamp != self._stamp:
                    self._current, self._stamp = self._load(), stamp
                    log.info("webhook certificate reloaded from %s", self._cert_file)
            except TlsConfigError as error:
                log.warning("%s; serving the previous certificate", error)
            return self._current

    def _on_hello(self, sock: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext) -> None:
        sock.context = self.current()
