"""The certificates a local cluster needs beyond the API server's own: a CA the kubelet trusts,
and the client certificate the API server presents to the kubelet (``kubectl logs`` and
``exec``). Made with the ``openssl`` command; valid for a year, private to the state directory.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KubeletPki:
    ca_cert: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_kubelet_pki(directory: Path) -> KubeletPki:
    """A CA and an API-server client certificate (``O=system:masters``) signed by it."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = (directory / f"apiserver-kubelet-client.{suffix}" for suffix in ("key", "csr", "crt"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca_cert),
             "-days", "365", "-subj", "/CN=fastgshare-local-ca")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
             "-days", "365", "-out", str(cert))
    return KubeletPki(ca_cert=ca_cert, client_cert=cert, client_key=key)


def apiserver_kubelet_flags(pki: KubeletPki) -> list[str]:
    """kube-apiserver flags to reach the kubelet by its InternalIP with that client certificate, and
    to verify client certificates of the same CA (as a kubeadm cluster's API server does)."""
    return ["--kubelet-preferred-address-types=InternalIP", f"--client-ca-file={pki.ca_cert}",
            f"--kubelet-client-certificate={pki.client_cert}", f"--kubelet-client-key={pki.client_key}"]
