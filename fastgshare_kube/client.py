"""Loading an API client: ``--kubeconfig``, else the in-cluster config, else ``~/.kube/config``,
with one clear line when none of them can be used."""

from __future__ import annotations

import os

from kubernetes import client, config

from fastgshare_kube.errors import KubeConfigError

ApiClient = client.ApiClient  # for annotations in modules that do not import kubernetes


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
    return client.ApiClient(configuration)


def token_api_client(host: str, ca_cert: str, token: str) -> ApiClient:
    """A client for ``host`` with a bearer ``token``, verifying the server against ``ca_cert``."""
    configuration = client.Configuration()
    configuration.host = host
    configuration.ssl_ca_cert = ca_cert
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)
