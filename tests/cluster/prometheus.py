"""A real Prometheus (Debian's ``prometheus`` package) for the tests: started on loopback with its
own storage in a temporary directory, scraping static targets every second, with our alert rules
loaded; queried through its HTTP API. Stopped (and its files removed) when the block ends, also on
failure.

Debian builds Prometheus without Kubernetes service discovery, so the targets are the addresses the
relabelling of deploy/monitoring/prometheus-scrape-configs.yaml would produce: the node's address
and the port of its ``fastgshare/metrics_port`` annotation, and the components' own addresses.
"""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from fastgshare_cluster.processes import ManagedProcess, free_ports, http_ok, wait_until

ALERT_RULES = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "alert-rules.yaml"


class Prometheus:
    def __init__(self, url: str, process: ManagedProcess) -> None:
        self.url = url
        self.process = process

    def _get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query, now or at unix time ``at``: (labels, value) of each series."""
        data = self._get("/api/v1/query", query=expr, **({"time": f"{at:.3f}"} if at is not None else {}))
        return [(item["metric"], float(item["value"][1])) for item in data["result"]]

    def targets_up(self) -> dict[str, str]:
        """job -> health of each active target."""
        return {target["labels"]["job"]: target["health"] for target in self._get("/api/v1/targets")["activeTargets"]}

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self._get("/api/v1/rules")["groups"] for rule in group["rules"]]


@contextmanager
def running_prometheus(jobs: Mapping[str, Sequence[str]], directory: Path, *,
                       bearer_token: str | None = None) -> Iterator[Prometheus]:
    """Prometheus scraping ``jobs`` (job name -> host:port targets) every second, each scrape with
    ``bearer_token`` from a file, as deploy/monitoring/prometheus-scrape-configs.yaml sends the
    ServiceAccount's token (authorization.credentials_file)."""
    binary = shutil.which("prometheus")
    assert binary, "no prometheus binary: apt-get install prometheus (.ci/run does)"
    directory.mkdir(parents=True, exist_ok=True)
    authorization = {}
    if bearer_token is not None:
        token_file = directory / "token"
        token_file.write_text(bearer_token)
        token_file.chmod(0o600)
        authorization = {"authorization": {"credentials_file": str(token_file)}}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERT_RULES)],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}], **authorization}
                           for job, targets in jobs.items()],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    process = ManagedProcess("prometheus", [
        binary, f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
        directory / "prometheus.log")
    try:
        wait_until(lambda: http_ok(f"{url}/-/ready"), what="prometheus /-/ready", timeout_s=60, watched=process)
        yield Prometheus(url, process)
    finally:
        process.stop()
        shutil.rmtree(directory / "data", ignore_errors=True)
