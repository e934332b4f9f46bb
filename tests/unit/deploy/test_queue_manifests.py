"""deploy/queue: NATS with JetStream and the queue workers, wired to the gateway and the function
controller by the names and ports the manifests really give each other; NATS from Debian's package in
our image, with its store where --store_dir points; no API rights; only the gateway and the workers
may reach NATS's client port."""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from fastgshare import keys
from tests.deploy_manifests import DEPLOY, objects, pod_specs

OBJECTS = objects()


def _one(kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in OBJECTS if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _container(deployment: str) -> dict[str, Any]:
    [container] = _one("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return container


def _flag(container: dict[str, Any], name: str) -> str:
    [value] = [arg.split("=", 1)[1] for arg in container.get("args", []) if arg.startswith(f"{name}=")]
    return value


def _service_address(url: str) -> tuple[dict[str, Any], int]:
    """The Service a ``scheme://<name>.<namespace>.svc:<port>`` URL names, and the port."""
    parts = urllib.parse.urlsplit(url)
    name, namespace, svc = (parts.hostname or "").split(".")
    assert (namespace, svc) == (keys.SYSTEM_NAMESPACE, "svc"), url
    return _one("Service", name), int(parts.port or 0)


def _target(service: dict[str, Any], port: int) -> tuple[dict[str, Any], int]:
    """The container behind ``service``'s ``port`` (by the selector) and its container port."""
    [entry] = [p for p in service["spec"]["ports"] if p["port"] == port]
    selector = service["spec"]["selector"]
    [workload] = [o for o in OBJECTS if pod_specs(o)
                  and selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
    [container] = pod_specs(workload)[0]["containers"]
    [container_port] = [p["containerPort"] for p in container["ports"] if p["name"] == entry["targetPort"]]
    return workload, container_port


def test_the_gateway_and_the_workers_reach_nats_on_its_client_port() -> None:
    gateway, worker = _container("fastgshare-gateway"), _container("fastgshare-queue-worker")
    assert _flag(gateway, "--nats-url") == _flag(worker, "--nats-url")
    service, port = _service_address(_flag(worker, "--nats-url"))
    assert urllib.parse.urlsplit(_flag(worker, "--nats-url")).scheme == "nats"
    workload, container_port = _target(service, port)
    assert workload["metadata"]["name"] == "fastgshare-nats"
    assert _flag(_container("fastgshare-nats"), "--port") == str(container_port)


def test_the_workers_call_the_gateway_and_the_function_controller_reads_every_worker() -> None:
    worker = _container("fastgshare-queue-worker")
    service, port = _service_address(_flag(worker, "--gateway-url"))
    workload, container_port = _target(service, port)
    assert workload["metadata"]["name"] == "fastgshare-gateway"
    assert _flag(_container("fastgshare-gateway"), "--listen").endswith(f":{container_port}")
    assert _flag(worker, "--basic-auth-dir") == "/var/secrets/gateway"  # Secret basic-auth, as the gateway has it

    service, port = _service_address(_flag(_container("fastgshare-function-controller"), "--queue-worker-url"))
    assert service["spec"]["clusterIP"] == "None"  # each replica on its own: their counts are not summed
    workload, container_port = _target(service, port)
    assert workload["metadata"]["name"] == "fastgshare-queue-worker"
    assert _flag(worker, "--listen") == f"0.0.0.0:{container_port}"
    assert worker["readinessProbe"]["httpGet"]["path"] == "/healthz"  # ready once bound to the stream


def test_nats_is_one_jetstream_server_whose_store_is_the_volume() -> None:
    deployment = _one("Deployment", "fastgshare-nats")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # never two stores behind the Service
    nats = _container("fastgshare-nats")
    assert nats["command"] == ["nats-server"]
    assert "-js" in nats["args"]
    [mount] = nats["volumeMounts"]
    assert mount["mountPath"] == _flag(nats, "--store_dir")
    [volume] = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["name"] == mount["name"]
    assert "emptyDir" in volume  # what a new pod loses is said in deploy/queue/nats.yaml and docs/install.md
    assert nats["securityContext"]["readOnlyRootFilesystem"] is True
    assert nats["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "monitor"}


def test_nats_runs_from_our_image_which_installs_debians_package() -> None:
    assert _container("fastgshare-nats")["image"] == _container("fastgshare-gateway")["image"]
    runtime = (DEPLOY.parent / "Dockerfile").read_text().rsplit("\nFROM ", 1)[1]  # the last stage
    assert re.search(r"apt-get install -y --no-install-recommends nats-server", runtime)


def test_nats_and_the_workers_hold_no_api_rights_and_mount_no_token() -> None:
    for account in ("fastgshare-nats", "fastgshare-queue-worker"):
        assert _one("ServiceAccount", account)["automountServiceAccountToken"] is False
        spec = _one("Deployment", account)["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == account
        assert spec["automountServiceAccountToken"] is False
        bound = [o for o in OBJECTS if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
                 and any(s.get("name") == account for s in o.get("subjects") or [])]
        assert not bound, account


def test_only_the_gateway_and_the_workers_may_reach_the_client_port() -> None:
    policy = _one("NetworkPolicy", "fastgshare-nats")["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "fastgshare-nats"}
    [client] = [rule for rule in policy["ingress"] if {"port": 4222, "protocol": "TCP"} in rule["ports"]]
    allowed = [peer["podSelector"]["matchLabels"] for peer in client["from"]]
    for deployment in ("fastgshare-gateway", "fastgshare-queue-worker"):
        labels = _one("Deployment", deployment)["spec"]["template"]["metadata"]["labels"]
        assert any(selector.items() <= labels.items() for selector in allowed), deployment
    assert len(allowed) == 2
    assert all("podSelector" not in peer or peer["podSelector"]["matchLabels"] in allowed
               for rule in policy["ingress"] for peer in rule["from"])


def test_install_waits_for_nats() -> None:
    install = (DEPLOY / "install.sh").read_text()
    assert "wait_ready deployment/fastgshare-nats" in install
