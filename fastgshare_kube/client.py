"""Loading an API client: ``--kubeconfig``, else the in-cluster config, else ``~/.kube/config``,
with one clear line when none of them can be used."""

from __future__ import annotations

import os

from kubernetes import client, config

from fastgshare_kube.errors import KubeConfigError

ApiClient = client.ApiClient  # for annotations in modules that do not import kubernetes


def load_api_client(kubeconfig: str | None) -> ApiClient:
    """An API client from ``kubeconfig`` if given, else in-cluster, else the default kubeconfig; raises
    :class:`KubeConfigError` saying which of them is unusable and why."""
    if kubeconfig and not os.path.isfile(kubeconfig):
        raise KubeConfigError(f"--kubeconfig {kubeconfig}: no such file; pass the path of a kubeconfig file, or "
                              "leave the flag out to use the in-cluster config, else ~/.kube/config")
    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            return config.new_client_from_config()
    except (config.ConfigException, OSError, ValueError) as error:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "neither the in-cluster config nor ~/.kube/config"
        raise KubeConfigError(f"{where}: cannot be used: {error}; pass a working kubeconfig with --kubeconfig"
                              ) from None


def token_api_client(host: str, ca_cert: str, token: str) -> ApiClient:
    """A client for ``host`` with a bearer ``token``, verifying the server against ``ca_cert``."""
    configuration = client.Configuration()
    configuration.host = host
    configuration.ssl_ca_cert = ca_cert
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)
