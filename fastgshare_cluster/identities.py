"""Who each of our components is on the one-machine cluster, and the secrets they share.

On a user's cluster every component runs as its own ServiceAccount with the RBAC that
``deploy/*/rbac.yaml`` ships, the gateway reads its credentials from the Secret ``basic-auth``,
and the extender and node agents share the assignment key of the Secret
``fastgshare-assignment-key``. ``fastgshare cluster up`` does the same for its host processes, so
that the shipped RBAC is what they really run with and the admission webhook sees the same
usernames as on a user's cluster:

- :func:`apply_shipped_rbac` applies the namespaces and every ``rbac.yaml`` (and the aggregated
  roles for FaSTPods and FaSTFuncs) as ``kubectl apply`` would;
- :func:`service_account_kubeconfig` waits for the token controller to give a ServiceAccount its
  token and writes a kubeconfig that authenticates with it;
- :func:`ensure_secret_files` creates the Secrets (random values, never printed) and writes their
  keys as files, as the kubelet would mount them, for ``--basic-auth-dir`` and
  ``--assignment-key-file``.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastgshare import keys
from fastgshare_cluster import manifests
from fastgshare_cluster.controlplane import ControlPlane, write_kubeconfig
from fastgshare_cluster.processes import wait_until
from fastgshare_kube import rest
from fastgshare_kube.errors import ApiError

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
# What the shipped manifests grant, applied in this order (namespaces first), and the function
# namespace's vGPU quota.
RBAC_FILES = ("namespace.yaml", "crd/roles.yaml", "scheduler/rbac.yaml", "node-agent/rbac.yaml",
              "controller/rbac.yaml", "function-controller/rbac.yaml", "gateway/rbac.yaml", "function-quota.yaml",
              "monitoring/metrics-reader.yaml")
# The ServiceAccount each host process runs as (all in keys.SYSTEM_NAMESPACE).
COMPONENT_ACCOUNTS: Mapping[str, str] = {
    "fastgshare-extender": keys.SCHEDULER_SERVICE_ACCOUNT,
    "fastgshare-node-agent": keys.NODE_AGENT_SERVICE_ACCOUNT,
    "fastgshare-controller": "fastgshare-controller",
    "fastgshare-function-controller": "fastgshare-function-controller",
    "fastgshare-gateway": "fastgshare-gateway",
}
TOKEN_WAIT_S = 60


class IdentityError(Exception):
    """A component's identity or secret could not be set up; the message says which and why."""


def apply_shipped_rbac(kubeconfig: Path) -> None:
    """``kubectl apply`` the namespaces and every role the manifests ship (files that do not exist
    in this checkout are skipped: the list names what a complete install has)."""
    for name in RBAC_FILES:
        path = DEPLOY / name
        if path.exists():
            try:
                manifests.kubectl(kubeconfig, "apply", "-f", str(path))
            except manifests.InstallError as error:
                raise IdentityError(f"cannot apply deploy/{name}: {error}") from None


def service_account_token(core: Any, namespace: str, account: str, timeout_s: float = TOKEN_WAIT_S) -> str:
    """The token the token controller made for ServiceAccount ``namespace/account`` (the account is
    created if missing); waits up to ``timeout_s`` for it."""
    try:
        rest.call(core.create_namespaced_service_account, namespace,
                  {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}})
    except ApiError as error:
        if not error.conflict:
            raise IdentityError(f"cannot create ServiceAccount {namespace}/{account}: {error}") from None
    found: dict[str, str] = {}

    def token_ready() -> bool:
        listed = rest.call(core.list_namespaced_secret, namespace,
                           field_selector="type=kubernetes.io/service-account-token")
        for secret in listed.get("items") or []:
            annotations = (secret.get("metadata") or {}).get("annotations") or {}
            token = (secret.get("data") or {}).get("token")
            if annotations.get("kubernetes.io/service-account.name") == account and token:
                found["token"] = base64.b64decode(token).decode()
                return True
        return False

    wait_until(token_ready, what=f"a token for ServiceAccount {namespace}/{account} (the token controller)",
               timeout_s=timeout_s)
    return found["token"]


def service_account_kubeconfig(core: Any, plane: ControlPlane, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig at ``path`` that authenticates as ServiceAccount ``namespace/account``."""
    write_kubeconfig(path, host=plane.host, token=service_account_token(core, namespace, account),
                     ca_cert=plane.ca_cert)
    return path


def ensure_secret_files(core: Any, name: str, generate: Mapping[str, bytes], directory: Path) -> Path:
    """Secret ``name`` in the system namespace (created with ``generate`` when absent; an existing
    one is kept) with each of its keys written to ``directory/<key>`` (mode 0600)."""
    body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "namespace": keys.SYSTEM_NAMESPACE,
                         "labels": {"app.kubernetes.io/part-of": "fastgshare"}},
            "data": {key: base64.b64encode(value).decode() for key, value in generate.items()}}
    try:
        rest.call(core.create_namespaced_secret, keys.SYSTEM_NAMESPACE, body)
    except ApiError as error:
        if not error.conflict:
            raise IdentityError(f"cannot create Secret {keys.SYSTEM_NAMESPACE}/{name}: {error}") from None
    stored = rest.call(core.read_namespaced_secret, name, keys.SYSTEM_NAMESPACE)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for key, value in (stored.get("data") or {}).items():
        path = directory / key
        path.touch(mode=0o600)
        path.write_bytes(base64.b64decode(value))
    return directory


def gateway_credentials() -> dict[str, bytes]:
    """What install.sh puts in Secret ``basic-auth``: user admin and a random password."""
    return {keys.BASIC_AUTH_USER_KEY: b"admin", keys.BASIC_AUTH_PASSWORD_KEY: secrets.token_urlsafe(24).encode()}


def assignment_key() -> dict[str, bytes]:
    """What install.sh puts in Secret ``fastgshare-assignment-key``: 32 random bytes as 64 hex characters
    (raw bytes could begin or end with whitespace, which the key's reader trims as a file's newline)."""
    return {keys.ASSIGNMENT_KEY_SECRET_KEY: secrets.token_hex(32).encode()}
