"""deploy/monitoring: the alert rules and every dashboard query parse (Prometheus's own promtool),
name only metrics our components export, and the scrape configs, PodMonitors and Services point
at ports the workloads have. (The real-node tier runs a real Prometheus with the rules.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fastgshare import keys
from fastpod_crd_controller.metrics import ControllerMetrics
from scheduler_extender.metrics import Metrics as ExtenderMetrics
from tests.deploy_manifests import DEPLOY, objects, pod_specs
from tests.node_metrics_samples import node_agent_exposition

MONITORING = DEPLOY / "monitoring"
ALERT_RULES = MONITORING / "alert-rules.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
METRIC = re.compile(r"\bfastgshare_[a-z_]+")
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*"}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("FASTGSHARE_REQUIRE_CLUSTER") == "1":
            pytest.fail("promtool is required (FASTGSHARE_REQUIRE_CLUSTER=1): apt-get install prometheus")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return found


def check_rules(promtool: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)


def dashboard_queries() -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> list[str]:
        found = []
        for panel in panels:
            found += [target["expr"] for target in panel.get("targets", [])]
            found += walk(panel.get("panels", []))
        return found

    return walk(json.loads(DASHBOARD.read_text())["panels"])


def alert_expressions() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(ALERT_RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_alert_rules(promtool: str) -> None:
    result = check_rules(promtool, ALERT_RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


def test_promtool_would_refuse_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "rate(up[5m]"}]}]}))
    assert check_rules(promtool, broken).returncode != 0


def test_every_dashboard_query_parses(promtool: str, tmp_path: Path) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 20
    rules = []
    for number, query in enumerate(queries):
        expr = query
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{number}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = check_rules(promtool, path)
    assert result.returncode == 0, result.stdout + result.stderr


def exported_metric_names() -> set[str]:
    """Every family our three components export, as Prometheus names its series' stem."""
    controller = ControllerMetrics()
    controller.follow(depth=lambda: 0, leader=lambda: True, fastpods=lambda: [{"status": {"conditions": [
        {"type": "Available", "status": "True"}]}}])
    texts = [node_agent_exposition(), controller.exposition()[0].decode(),
             generate_latest(ExtenderMetrics().registry).decode()]
    return {family.name for text in texts for family in text_string_to_metric_families(text)}


def test_dashboard_and_alerts_name_only_metrics_we_export() -> None:
    exported = exported_metric_names()
    assert "fastgshare_pod_gpu_time_share" in exported
    used = {name for text in (*dashboard_queries(), *alert_expressions()) for name in METRIC.findall(text)}
    stems = {re.sub(r"_(bucket|sum|count|total)$", "", name) for name in used}
    assert stems - exported == set()


def workload(name: str) -> dict[str, Any]:
    (obj,) = [o for o in objects() if o["metadata"]["name"] == name and pod_specs(o)]
    return obj


def container_ports(name: str) -> set[str]:
    obj = workload(name)
    return {port["name"] for spec in pod_specs(obj) for container in spec["containers"]
            for port in container.get("ports", [])}


def test_pod_monitors_and_services_name_ports_the_workloads_have() -> None:
    workload_of = {"fastgshare-node-agent": "fastgshare-node-agent", "fastgshare-controller": "fastgshare-controller",
                   "fastgshare-scheduler": "fastgshare-scheduler"}
    monitors = list(yaml.safe_load_all((MONITORING / "podmonitors.yaml").read_text()))
    assert {m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] for m in monitors} == set(workload_of)
    for monitor in monitors:
        app = monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in container_ports(workload_of[app]), (app, endpoint)
    for service in yaml.safe_load_all((MONITORING / "services.yaml").read_text()):
        app = service["spec"]["selector"]["app.kubernetes.io/name"]
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in container_ports(workload_of[app]), (app, port)


def relabel(labels: dict[str, str], rule: dict[str, Any]) -> dict[str, str] | None:
    """Prometheus's relabelling for the ``keep`` and ``replace`` actions used here (None: dropped)."""
    value = rule.get("separator", ";").join(labels.get(name, "") for name in rule.get("source_labels", []))
    match = re.fullmatch(rule.get("regex", "(.*)"), value)
    if rule.get("action", "replace") == "keep":
        return labels if match else None
    if match is None:
        return labels
    replacement = re.sub(r"\$(\d+)", r"\\\1", rule.get("replacement", "$1"))
    return {**labels, rule["target_label"]: match.expand(replacement)}


def scrape(job_name: str, labels: dict[str, str]) -> dict[str, str] | None:
    configs = yaml.safe_load((MONITORING / "prometheus-scrape-configs.yaml").read_text())["scrape_configs"]
    (job,) = [c for c in configs if c["job_name"] == job_name]
    for rule in job["relabel_configs"]:
        relabelled = relabel(labels, rule)
        if relabelled is None:
            return None
        labels = relabelled
    return labels


def test_the_node_job_scrapes_each_agent_pod_on_its_own_address_and_metrics_port() -> None:
    """Issue 37 item 5: the agent's metrics left the node's address (no hostPort)."""
    pod = {"__address__": "10.244.0.7:9401", "__meta_kubernetes_pod_ip": "10.244.0.7",
           "__meta_kubernetes_pod_node_name": "gpu-1",
           "__meta_kubernetes_pod_label_app_kubernetes_io_name": "fastgshare-node-agent",
           "__meta_kubernetes_pod_container_port_name": "metrics",
           "__meta_kubernetes_pod_container_port_number": "9401"}
    target = scrape("fastgshare-node-agents", pod)
    assert target is not None
    assert (target["__address__"], target["node"]) == ("10.244.0.7:9401", "gpu-1")
    assert scrape("fastgshare-node-agents", {**pod, "__meta_kubernetes_pod_container_port_name": "grpc"}) is None
    other = {**pod, "__meta_kubernetes_pod_label_app_kubernetes_io_name": "someone-else"}
    assert scrape("fastgshare-node-agents", other) is None  # not our agent


def test_the_node_agent_publishes_no_host_port() -> None:
    """Issue 37 item 5: tenant pods reached the agent's metrics on the node's address (hostPort 9401)."""
    agent = workload("fastgshare-node-agent")["spec"]["template"]["spec"]
    ports = [port for container in agent["containers"] for port in container.get("ports", [])]
    assert ports
    assert all("hostPort" not in port for port in ports)
    assert not agent.get("hostNetwork", False)


def test_the_pod_job_scrapes_only_our_annotated_pods_on_their_port_and_path() -> None:
    annotations = workload("fastgshare-controller")["spec"]["template"]["metadata"]["annotations"]
    pod = {"__address__": "10.1.2.3", "__meta_kubernetes_pod_ip": "10.1.2.3",
           "__meta_kubernetes_pod_label_app_kubernetes_io_part_of": "fastgshare",
           "__meta_kubernetes_pod_label_app_kubernetes_io_name": "fastgshare-controller",
           **{f"__meta_kubernetes_pod_annotation_{re.sub(r'[^a-z0-9]', '_', key)}": value
              for key, value in annotations.items()}}
    target = scrape("fastgshare-pods", pod)
    assert target is not None
    assert (target["__address__"], target["__metrics_path__"]) == ("10.1.2.3:8081", "/metrics")
    other = {**pod, "__meta_kubernetes_pod_label_app_kubernetes_io_part_of": "someone-else"}
    assert scrape("fastgshare-pods", other) is None


def test_every_scrape_sends_a_token_of_an_account_allowed_metrics() -> None:
    """Issue 42, item 5: the components serve /metrics only to a token allowed get on it, so every
    shipped scrape sends one: the plain jobs Prometheus's own ServiceAccount token, the PodMonitors
    the token Secret of the metrics reader, whose ClusterRole holds exactly that rule."""
    reader = {(obj["kind"], obj["metadata"]["name"]): obj
              for obj in yaml.safe_load_all((MONITORING / "metrics-reader.yaml").read_text())}
    role = reader[("ClusterRole", "fastgshare-metrics-reader")]
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = reader[("ClusterRoleBinding", "fastgshare-metrics-reader")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": keys.METRICS_READER_SERVICE_ACCOUNT,
                                    "namespace": keys.SYSTEM_NAMESPACE}]
    secret = reader[("Secret", "fastgshare-metrics-reader-token")]
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == \
        keys.METRICS_READER_SERVICE_ACCOUNT
    configs = yaml.safe_load((MONITORING / "prometheus-scrape-configs.yaml").read_text())["scrape_configs"]
    for job in configs:
        assert job["authorization"]["credentials_file"] == "/var/run/secrets/kubernetes.io/serviceaccount/token", job
    for monitor in yaml.safe_load_all((MONITORING / "podmonitors.yaml").read_text()):
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["authorization"] == {"type": "Bearer", "credentials": {
                "name": "fastgshare-metrics-reader-token", "key": "token"}}, monitor["metadata"]["name"]
    kustomization = yaml.safe_load((MONITORING.parent / "kustomization.yaml").read_text())
    assert "monitoring/metrics-reader.yaml" in kustomization["resources"]
