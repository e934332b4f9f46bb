"""Loading an API client: ``--kubeconfig``, else the in-cluster config, else ``~/.kube/config``,
with one clear line when none of them can be used.

The client's config loaders install a hook that the client calls before every request to refresh
the credentials: it reloads them only when they (nearly) expired, but sets every connection
setting again on each call, about 8 % of the FaSTPod controller's Python time under
``bench.controller``. :func:`load_api_client` calls it at most once a second
(:data:`REFRESH_INTERVAL_S`): the kubeconfig loader renews a token 5 minutes before it expires,
the in-cluster one rereads its token file every minute, so a second's delay lets no request
carry an expired token."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client, config

from fastgshare_kube.errors import KubeConfigError

ApiClient = client.ApiClient  # for annotations in modules that do not import kubernetes
REFRESH_INTERVAL_S = 1.0


def load_api_client(kubeconfig: str | None, *, connections: int | None = None) -> ApiClient:
    """An API client from ``kubeconfig`` if given, else in-cluster, else the default kubeconfig; raises
    :class:`KubeConfigError` saying which of them is unusable and why. ``connections``: how many
    connections the client keeps to the API server (default 5 a CPU). A component that calls the API
    from more threads at once than that should say: a call that finds every kept connection busy
    opens one of its own, with a TLS handshake on both sides, and closes it afterwards."""
    if kubeconfig and not os.path.isfile(kubeconfig):
        raise KubeConfigError(f"--kubeconfig {kubeconfig}: no such file; pass the path of a kubeconfig file, or "
                              "leave the flag out to use the in-cluster config, else ~/.kube/config")
    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError, ValueError) as error:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "neither the in-cluster config nor ~/.kube/config"
        raise KubeConfigError(f"{where}: cannot be used: {error}; pass a working kubeconfig with --kubeconfig"
                              ) from None
    if connections is not None:
        configuration.connection_pool_maxsize = connections
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook = throttled_refresh(configuration.refresh_api_key_hook)
    return client.ApiClient(configuration)


def throttled_refresh(hook: Callable[[Any], None], interval_s: float = REFRESH_INTERVAL_S,
                      clock: Callable[[], float] = time.monotonic) -> Callable[[Any], None]:
    """``hook`` (a credentials refresh hook), called at most once every ``interval_s``.

    The kubeconfig loader's hook installs a fresh hook of its own on each call (it sets every
    setting again); after each call the newest one is kept to call next time, and this throttle
    is put back in its place.
    """
    lock = threading.Lock()
    last = -math.inf
    current = hook

    def refresh(configuration: Any) -> None:
        nonlocal last, current
        now = clock()
        with lock:
            if now - last < interval_s:
                return
            last = now
            inner = current
        inner(configuration)
        installed = getattr(configuration, "refresh_api_key_hook", refresh)
        if installed is not refresh:
            with lock:
                current = installed
            configuration.refresh_api_key_hook = refresh

    return refresh


def token_api_client(host: str, ca_cert: str, token: str) -> ApiClient:
    """A client for ``host`` with a bearer ``token``, verifying the server against ``ca_cert``."""
    configuration = client.Configuration()
    configuration.host = host
    configuration.ssl_ca_cert = ca_cert
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)
