"""A second team on the real node (issue 37): what a user with ``edit`` in their own namespace only
can and cannot do to the first team through our components.

Team B is a ServiceAccount bound to the standard ``edit`` ClusterRole in its namespace, with the
token the token controller gave it, on the one-machine cluster where every one of our components
runs as its own ServiceAccount and the admission webhook is registered as deploy/ registers it.
Each test is one row of docs/security.md's threat table.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import attrs
import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from device_plugin.gpu_usage import REASON_GPU_TIME_UNACCOUNTED
from fastgshare import keys
from fastgshare.codec import decode_assignment, encode_assignment
from fastgshare.share import ShareSpec
from fastgshare_cluster import cluster as local_cluster
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.images import FAKE_FN_IMAGE_SHORT
from fastgshare_kube.client import load_api_client
from tests.cluster.controlplane import wait_until
from tests.cluster.real_node import (  # noqa: F401 - the fixture core
    apply,
    assignment_of,
    describe_pod,
    fastpod,
    gateway_credentials,
    gpu_pod,
    http,
    kubectl,
    measure_shares,
    node_metrics,
    node_metrics_address,
    real_node_core,
    real_node_namespace,
    running_pods,
    second_team,
    share_annotations,
    tenant_container,
)

pytestmark = pytest.mark.realnode

SMALL = share_annotations(0.1, 0.2, 10, "256Mi")


@pytest.fixture(scope="module")
def team_a(real_cluster: Cluster) -> Iterator[str]:
    """Team A's namespace, with one running FaSTPod pod (a share of 0.3..0.5)."""
    core = kubernetes.client.CoreV1Api(real_cluster.api_client())
    with real_node_namespace(real_cluster, core, "team-a") as namespace:
        apply(real_cluster, namespace, fastpod("steady", share_annotations(0.3, 0.5, 30, "1Gi"),
                                               {"TENANT_KERNEL_US": "2000"}))
        running_pods(core, namespace, 1)
        yield namespace


@pytest.fixture(scope="module")
def team_b(real_cluster: Cluster) -> Iterator[tuple[str, Path]]:
    """Team B: ``edit`` in its own namespace only."""
    with second_team(real_cluster, kubernetes.client.CoreV1Api(real_cluster.api_client()), "team-b") as team:
        yield team


def team_api(team: tuple[str, Path]) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(load_api_client(str(team[1])))


def denial(call: Any) -> tuple[int, str]:
    """(HTTP status, the API server's message) of a refused call; (0, '') when it succeeds."""
    try:
        call()
    except ApiException as error:
        return error.status, str(json.loads(error.body or "{}").get("message", ""))
    return 0, ""


def assert_refused(call: Any, annotation: str) -> str:
    """The call is refused by admission, with a message naming ``annotation``; returns the message."""
    status, message = denial(call)
    assert status in {400, 403}, (status, message)
    assert annotation in message, message
    return message


def forged_assignment(core: kubernetes.client.CoreV1Api, team_a: str) -> str:
    """Team A's pod's assignment, raised to the whole GPU: what team B would like to have."""
    assignment = assignment_of(core.list_namespaced_pod(team_a).items[0])
    whole = ShareSpec(request_permille=1000, limit_permille=1000, sm_percent=100, memory_bytes=16 << 30)
    return encode_assignment(attrs.evolve(assignment, share=whole))


def test_the_gateway_deploys_nothing_without_credentials(real_cluster: Cluster,
                                                        core: kubernetes.client.CoreV1Api) -> None:
    gateway = real_cluster.gateway_url
    deployment = {"service": "intruder", "image": FAKE_FN_IMAGE_SHORT, "namespace": keys.DEFAULT_FUNCTION_NAMESPACE,
                  "labels": {keys.OPENFAAS_SCALE_MIN_LABEL: "10000"},
                  "annotations": share_annotations(1.0, 1.0, 100, "16Gi")}
    body = json.dumps(deployment).encode()
    assert http(f"{gateway}/system/functions")[0] == 401
    assert http(f"{gateway}/system/functions", method="POST", body=body)[0] == 401
    assert http(f"{gateway}/system/functions", method="POST", body=body, auth=("admin", "guess"))[0] == 401
    user, password = gateway_credentials(core)
    status, answer = http(f"{gateway}/system/functions", method="POST", body=body, auth=(user, password))
    assert status == 400, answer
    assert b"replicas" in answer, answer
    status, _ = http(f"{gateway}/system/functions", auth=(user, password))
    assert status == 200


def test_our_annotations_are_written_by_our_components_only(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_a: str,
        team_b: tuple[str, Path]) -> None:
    namespace, _ = team_b
    b_core = team_api(team_b)
    forged = forged_assignment(core, team_a)
    # on create: a pod carrying a copied, raised assignment
    pod = gpu_pod("forged", {**SMALL, keys.POD_ASSIGNMENT_ANNOTATION: forged}, tenant_container())
    assert_refused(lambda: b_core.create_namespaced_pod(namespace, pod), keys.POD_ASSIGNMENT_ANNOTATION)
    # on a running pod of its own, correctly scheduled
    b_core.create_namespaced_pod(namespace, gpu_pod("honest", SMALL, tenant_container()))
    running_pods(core, namespace, 1)
    patch = {"metadata": {"annotations": {keys.POD_ASSIGNMENT_ANNOTATION: forged}}}
    assert_refused(lambda: b_core.patch_namespaced_pod("honest", namespace, patch), keys.POD_ASSIGNMENT_ANNOTATION)
    # cluster admins included (DESIGN.md: only the extender's and node agent's service accounts)
    assert_refused(lambda: core.patch_namespaced_pod("honest", namespace, patch), keys.POD_ASSIGNMENT_ANNOTATION)
    # the node's inventory too
    node_patch = {"metadata": {"annotations": {keys.NODE_GPU_INFO_ANNOTATION: "{}"}}}
    assert_refused(lambda: core.patch_node(real_cluster.node_name, node_patch), keys.NODE_GPU_INFO_ANNOTATION)
    # the node agent's own token (as if stolen) may write our annotations and nothing else
    agent = kubernetes.client.CoreV1Api(load_api_client(str(real_cluster.state_dir / "accounts" /
                                                            "fastgshare-node-agent.kubeconfig")))
    relabel = {"metadata": {"labels": {"stolen": "yes"}}}
    message = assert_refused(lambda: agent.patch_namespaced_pod("honest", namespace, relabel), "metadata.labels")
    assert keys.NODE_AGENT_SERVICE_ACCOUNT in message, message
    taint = {"spec": {"taints": [{"key": "stolen", "effect": "NoSchedule"}]}}
    assert_refused(lambda: agent.patch_node(real_cluster.node_name, taint), "spec")
    # what a user may still do: change its own pod's share annotations (the live share path re-checks)
    b_core.patch_namespaced_pod("honest", namespace, {"metadata": {"annotations": {keys.GPU_QUOTA_LIMIT: "0.3"}}})
    # and team B manages FaSTPods in its own namespace (edit aggregates our roles), not in team A's
    custom = kubernetes.client.CustomObjectsApi(b_core.api_client)
    mine = fastpod("mine", SMALL, {}, replicas=0)
    custom.create_namespaced_custom_object(keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, namespace,
                                           keys.FASTPOD_PLURAL, mine)
    status, _ = denial(lambda: custom.create_namespaced_custom_object(
        keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, team_a, keys.FASTPOD_PLURAL, mine))
    assert status == 403


def webhook_address(core: kubernetes.client.CoreV1Api) -> tuple[str, int]:
    registrations = kubernetes.client.AdmissionregistrationV1Api(core.api_client)
    config = registrations.read_validating_webhook_configuration("fastgshare-validate")
    url = urllib.parse.urlsplit(config.webhooks[0].client_config.url)
    assert url.hostname, url
    assert url.port, url
    return url.hostname, url.port


def test_idle_and_slow_connections_do_not_stall_the_webhook(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_a: str,
        team_b: tuple[str, Path]) -> None:
    namespace, _ = team_b
    b_core = team_api(team_b)
    host, port = webhook_address(core)
    forged = forged_assignment(core, team_a)
    with ExitStack() as held:
        for _ in range(50):  # idle: connected, nothing sent (the TLS handshake never starts)
            held.enter_context(socket.create_connection((host, port), timeout=5))
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        for _ in range(10):  # slow: a TLS session that sends half a request's headers
            tls = held.enter_context(context.wrap_socket(socket.create_connection((host, port), timeout=5)))
            tls.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
        for attempt in range(3):
            pod = gpu_pod(f"forged-{attempt}", {**SMALL, keys.POD_ASSIGNMENT_ANNOTATION: forged}, tenant_container())
            started = time.monotonic()
            # still validated (with the webhook stalled, failurePolicy Ignore would have admitted it)
            assert_refused(lambda: b_core.create_namespaced_pod(namespace, pod),  # noqa: B023
                           keys.POD_ASSIGNMENT_ANNOTATION)
            print(f"refused in {time.monotonic() - started:.3f} s with 60 connections held open")


FLOOD_CONNECTIONS = 256


class HealthProbe:
    """GET /healthz of the node agent every second on a thread of its own (as the kubelet's liveness
    probe would); the answers, a status or the error."""

    def __init__(self, address: str) -> None:
        self.url = f"http://{address}/healthz"
        self.answers: list[int | str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.answers.append(http(self.url, timeout_s=5)[0])
            except OSError as error:
                self.answers.append(repr(error))
            if self._stop.wait(1.0):
                return

    def stop(self) -> list[int | str]:
        self._stop.set()
        self._thread.join(15)
        return self.answers


def test_a_ping_flood_from_team_bs_pod_leaves_team_a_its_share(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_a: str,
        team_b: tuple[str, Path]) -> None:
    namespace, _ = team_b
    b_core = team_api(team_b)
    (steady,) = core.list_namespaced_pod(team_a).items
    gpu = assignment_of(steady).gpu_uuid
    # team B's own pod, placed by our scheduler, runs the hostile tenant: PINGs over 256 connections
    command = ["/opt/fastgshare/bin/arbiter-flood", "--connections", str(FLOOD_CONNECTIONS)]
    b_core.create_namespaced_pod(namespace, gpu_pod("flood", SMALL, tenant_container(command=command)))
    try:
        started = logged_line(core, namespace, "flood", "flooding")
        print(started)
        assert f"flooding {FLOOD_CONNECTIONS} connections" in started, started
        time.sleep(1)  # the flood at full strength
        probe = HealthProbe(node_metrics_address(real_cluster, core))
        try:
            achieved = measure_shares(real_cluster, {gpu}, 10)
        finally:
            answers = probe.stop()
        share = achieved.get(steady.metadata.uid, 0.0)
        print(f"team A's pod got {share:.3f} of {gpu} over 10 s under the flood; the agent's /healthz: {answers}")
        assert share >= 0.3 - 0.03, f"team A's pod (request 0.3) got {share:.3f} under team B's flood: {achieved}"
        assert len(answers) >= 5, answers
        assert all(answer == 200 for answer in answers), f"the node agent's /healthz under the flood: {answers}"
        exited = [c.name for c in local_cluster.status(real_cluster.state_dir) if not c.running]
        assert not exited, f"components exited under the flood: {exited}"
        flood = core.read_namespaced_pod("flood", namespace)
        assert flood.status.phase == "Running", describe_pod(flood)  # the flood lasted the whole measurement
    finally:
        b_core.delete_namespaced_pod("flood", namespace)


def test_the_kubelet_and_the_api_server_authenticate_as_a_users_cluster_does(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_b: tuple[str, Path]) -> None:
    """The kubelet asks the API server who a caller is (TokenReview) and what it may do
    (SubjectAccessReview); the API server verifies client certificates of the cluster's CA."""
    node = core.read_node(real_cluster.node_name)
    address = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    kubelet = f"https://{address}:{node.status.daemon_endpoints.kubelet_endpoint.port}/pods"
    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE

    def kubelet_status(token: str | None) -> int:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(kubelet, headers=headers), context=insecure,
                                        timeout=30) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return error.code

    def token_of(kubeconfig: Path) -> str:
        return str(json.loads(kubeconfig.read_text())["users"][0]["user"]["token"])

    assert kubelet_status(None) == 401
    assert kubelet_status(token_of(team_b[1])) == 403  # `edit` in a namespace grants no nodes/proxy
    assert kubelet_status(token_of(Path(real_cluster.kubeconfig))) == 200  # the cluster admin
    # a client certificate of the cluster's CA (the one the API server presents to the kubelet)
    pki = real_cluster.state_dir / "pki"
    context = ssl.create_default_context(cafile=str(json.loads(Path(real_cluster.kubeconfig).read_text())
                                                    ["clusters"][0]["cluster"]["certificate-authority"]))
    context.load_cert_chain(str(pki / "apiserver-kubelet-client.crt"), str(pki / "apiserver-kubelet-client.key"))
    server = json.loads(Path(real_cluster.kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    with urllib.request.urlopen(f"{server}/api/v1/nodes", context=context, timeout=30) as answer:
        assert real_cluster.node_name in answer.read().decode()


# --- issue 42: with the webhook down, the node does not trust what a tenant writes --------------

WEBHOOK = "fastgshare-validate"


@contextmanager
def webhook_down(core: kubernetes.client.CoreV1Api, probe: Callable[[], bool]) -> Iterator[None]:
    """The webhook gone, as while its pod is down (failurePolicy Ignore admits everything), then back.
    ``probe`` says whether a forged write is refused now: it is waited on in both directions."""
    registrations = kubernetes.client.AdmissionregistrationV1Api(core.api_client)
    saved = core.api_client.sanitize_for_serialization(registrations.read_validating_webhook_configuration(WEBHOOK))
    saved["metadata"] = {key: saved["metadata"][key] for key in ("name", "labels") if key in saved["metadata"]}
    registrations.delete_validating_webhook_configuration(WEBHOOK)
    try:
        wait_until(lambda: not probe(), what="the API server admitting forged writes (webhook gone)", timeout_s=30)
        yield
    finally:
        registrations.create_validating_webhook_configuration(saved)
        wait_until(probe, what="the API server refusing forged writes again (webhook back)", timeout_s=30)


def forged_pod_refused(b_core: kubernetes.client.CoreV1Api, namespace: str, forged: str) -> bool:
    """Whether a dry-run create of a pod carrying ``forged`` is refused by admission now."""
    pod = gpu_pod("probe", {**SMALL, keys.POD_ASSIGNMENT_ANNOTATION: forged}, tenant_container())
    return denial(lambda: b_core.create_namespaced_pod(namespace, pod, dry_run="All"))[0] in {400, 403}


def team_a_pod(core: kubernetes.client.CoreV1Api, team_a: str) -> kubernetes.client.V1Pod:
    """Team A's running pod that is not being deleted."""
    return next(p for p in running_pods(core, team_a, 1) if p.metadata.deletion_timestamp is None)


def events_of(core: kubernetes.client.CoreV1Api, namespace: str, name: str) -> list[str]:
    return [f"{e.reason}: {e.message}" for e in core.list_namespaced_event(namespace).items
            if e.involved_object.name == name]


def test_with_the_webhook_down_forged_assignments_get_nothing_on_the_node(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_a: str,
        team_b: tuple[str, Path]) -> None:
    """Issue 42 rows 1-4: a pod placed past the scheduler with a copied, raised assignment; the same
    written onto a running pod; a never-scheduled ghost counted by the extender; pods without a vGPU
    request taken for pods waiting for Allocate. Team A keeps its request throughout."""
    namespace = team_b[0]
    b_core = team_api(team_b)
    a_pod = team_a_pod(core, team_a)
    a_uid, gpu = a_pod.metadata.uid, assignment_of(a_pod).gpu_uuid
    forged = forged_assignment(core, team_a)
    honest = b_core.create_namespaced_pod(namespace, gpu_pod("honest-42", SMALL, tenant_container()))
    wait_until(lambda: core.read_namespaced_pod("honest-42", namespace).status.phase == "Running",
               what="team B's pod honest-42 running", timeout_s=90)
    honest_gpu = assignment_of(core.read_namespaced_pod("honest-42", namespace)).gpu_uuid
    dated_2100 = encode_assignment(attrs.evolve(decode_assignment(forged), assigned_at_ms=4_102_444_800_000))

    with webhook_down(core, lambda: forged_pod_refused(b_core, namespace, forged)):
        # row 1: placed by spec.nodeName, past our scheduler
        placed = gpu_pod("placed", {**SMALL, keys.POD_ASSIGNMENT_ANNOTATION: forged}, tenant_container())
        placed["spec"]["nodeName"] = real_cluster.node_name
        b_core.create_namespaced_pod(namespace, placed)
        # row 2: the raised assignment written onto team B's running, correctly scheduled pod
        b_core.patch_namespaced_pod("honest-42", namespace,
                                    {"metadata": {"annotations": {keys.POD_ASSIGNMENT_ANNOTATION: forged}}})
        # row 3: a ghost no scheduler will place, "holding" team A's GPU
        ghost = gpu_pod("ghost", {**SMALL, keys.POD_ASSIGNMENT_ANNOTATION: forged}, tenant_container())
        ghost["spec"]["schedulerName"] = "nobody"
        b_core.create_namespaced_pod(namespace, ghost)
        # row 4: pods with no vGPU request on the node, dated in 2100, as if waiting for Allocate
        for index in range(4):
            b_core.create_namespaced_pod(namespace, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"bystander-{index}", "annotations": {keys.POD_ASSIGNMENT_ANNOTATION: dated_2100}},
                "spec": {"nodeName": real_cluster.node_name, "terminationGracePeriodSeconds": 1,
                         "containers": [tenant_container(command=["sleep", "3600"])]}})

    # row 1: the placed pod gets no GPU: the kubelet's admission fails on Allocate
    wait_until(lambda: core.read_namespaced_pod("placed", namespace).status.phase == "Failed",
               what="the pod placed past the scheduler refused at Allocate", timeout_s=60)
    # row 2: the agent keeps what it served the running pod, and says why
    wait_until(lambda: any("AssignmentRefused" in e for e in events_of(core, namespace, "honest-42")),
               what="an AssignmentRefused event on the rewritten pod", timeout_s=30)
    # row 3: the extender does not count the ghost
    status, body = http(f"{real_cluster.extender_url}/inspect")
    assert status == 200
    assert a_pod.metadata.name.encode() in body, body[:2000]
    assert b'"ghost"' not in body, body[:2000]
    # row 4: team A's next replica starts, and none of its pods is deleted
    custom = kubernetes.client.CustomObjectsApi(core.api_client)
    custom.patch_namespaced_custom_object(keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, team_a, keys.FASTPOD_PLURAL,
                                          "steady", {"spec": {"replicas": 2}})
    started = time.monotonic()
    pods = running_pods(core, team_a, 2, timeout_s=60)
    print(f"team A's second replica ran {time.monotonic() - started:.1f} s after it was asked for")
    assert a_uid in {p.metadata.uid for p in pods}
    # team A's first pod kept its request; the rewritten pod kept its own limit (0.2 at most)
    shares = measure_shares(real_cluster, {gpu, honest_gpu}, 10)
    print(f"under rows 1-4: team A's pod {shares.get(a_uid, 0):.3f}, team B's rewritten pod "
          f"{shares.get(honest.metadata.uid, 0):.3f}")
    assert shares.get(a_uid, 0.0) >= 0.27, shares
    assert shares.get(honest.metadata.uid, 0.0) <= 0.23, shares
    custom.patch_namespaced_custom_object(keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, team_a, keys.FASTPOD_PLURAL,
                                          "steady", {"spec": {"replicas": 1}})
    running_pods(core, team_a, 1)  # the other replica gone: later tests find team A's one pod


def test_an_older_signed_assignment_written_back_is_refused_on_the_node(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_a: str,
        team_b: tuple[str, Path]) -> None:
    """Issue 42 item 2, a replay: team B's pod had its limit lowered through the share path (the
    extender signs the new assignment, stamped later); with the webhook down team B writes back the
    first assignment the extender signed, valid signature and all, with the share annotations of
    then. The node agent refuses it as older than what it serves, with an event."""
    namespace = team_b[0]
    b_core = team_api(team_b)
    b_core.create_namespaced_pod(namespace, gpu_pod("replayer", SMALL, tenant_container()))
    wait_until(lambda: core.read_namespaced_pod("replayer", namespace).status.phase == "Running",
               what="team B's pod replayer running", timeout_s=90)
    first = core.read_namespaced_pod("replayer", namespace).metadata.annotations
    first_assignment = decode_assignment(first[keys.POD_ASSIGNMENT_ANNOTATION])
    b_core.patch_namespaced_pod("replayer", namespace, {"metadata": {"annotations": {keys.GPU_QUOTA_LIMIT: "0.15"}}})
    wait_until(lambda: assignment_of(core.read_namespaced_pod("replayer", namespace)).share.limit_permille == 150,
               what="the extender's signed change to limit 0.15", timeout_s=30)
    changed = assignment_of(core.read_namespaced_pod("replayer", namespace))
    assert changed.assigned_at_ms > first_assignment.assigned_at_ms
    replay = {keys.POD_ASSIGNMENT_ANNOTATION: first[keys.POD_ASSIGNMENT_ANNOTATION],
              keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION: first[keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION],
              keys.GPU_QUOTA_LIMIT: first[keys.GPU_QUOTA_LIMIT]}
    forged = forged_assignment(core, team_a)
    try:
        with webhook_down(core, lambda: forged_pod_refused(b_core, namespace, forged)):
            b_core.patch_namespaced_pod("replayer", namespace, {"metadata": {"annotations": replay}})
        wait_until(lambda: any("an older assignment written back" in e for e in events_of(core, namespace, "replayer")),
                   what="the node agent refusing the replayed assignment", timeout_s=30)
    finally:
        b_core.delete_namespaced_pod("replayer", namespace)


def test_a_pod_cannot_write_what_another_pod_of_its_gpu_reads(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_a: str,
        team_b: tuple[str, Path]) -> None:
    """Issue 42 row 8: of the simulated GPU's state only its two device files are mounted, one by
    one: what team B writes beside them stays in its own container."""
    namespace = team_b[0]
    a_pod = team_a_pod(core, team_a)
    b_core = team_api(team_b)
    b_core.create_namespaced_pod(namespace, gpu_pod("planter", SMALL, tenant_container()))
    wait_until(lambda: core.read_namespaced_pod("planter", namespace).status.phase == "Running",
               what="team B's pod planter running", timeout_s=90)
    view = keys.CONTAINER_FAKE_GPU_DIR
    tried = kubectl(real_cluster, "exec", "-n", namespace, "planter", "--", "sh", "-c",
                    f"echo x > {view}/planted; busybox rm -f {view}/fake_gpu.lock; echo rm=$?; "
                    f"busybox mv {view}/planted {view}/fake_gpu.state; echo mv=$?")
    assert "rm=0" not in tried, tried  # the device files are mount points: neither removed
    assert "mv=0" not in tried, tried  # nor replaced
    seen = kubectl(real_cluster, "exec", "-n", team_a, a_pod.metadata.name, "--", "ls", "-A", view).split()
    assert sorted(seen) == ["fake_gpu.lock", "fake_gpu.state"], seen
    gpu_dir = real_cluster.fake_gpu_dir(assignment_of(a_pod).gpu_uuid)
    assert sorted(path.name for path in Path(gpu_dir).iterdir()) == ["fake_gpu.lock", "fake_gpu.state"]


def test_a_tenant_pod_cannot_read_the_node_agents_metrics(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_a: str,
        team_b: tuple[str, Path]) -> None:
    """Issue 42 row 7 (item 5): from team B's pod, the agent's /metrics (team A's pod names and
    shares) without a token is a 401 and with team B's own token (its ``edit`` account) a 403;
    the metrics reader (Prometheus's role) reads them, team A's pod among them."""
    namespace = team_b[0]
    a_pod = team_a_pod(core, team_a)
    b_core = team_api(team_b)
    b_core.create_namespaced_pod(namespace, gpu_pod("reader", SMALL, tenant_container(
        command=["sh", "-c", "sleep 600"])))
    try:
        wait_until(lambda: core.read_namespaced_pod("reader", namespace).status.phase == "Running",
                   what="team B's pod reader running", timeout_s=90)
        url = f"http://{node_metrics_address(real_cluster, core)}/metrics"
        token = json.loads(team_b[1].read_text())["users"][0]["user"]["token"]
        tried = kubectl(real_cluster, "exec", "-n", namespace, "reader", "--", "sh", "-c",
                        f"busybox wget -q -S -O - {url} 2>&1; echo; echo ===; "
                        f"busybox wget -q -S -O - --header 'Authorization: Bearer {token}' {url} 2>&1; true")
        anonymous, with_token = tried.split("===")
        print(f"without a token: {anonymous.strip()[:200]}\nwith team B's token: {with_token.strip()[:200]}")
        assert "401" in anonymous, anonymous
        assert "403" in with_token, with_token
        assert a_pod.metadata.name not in tried, tried  # nothing of team A's pods leaked
        seen = node_metrics(real_cluster, core)  # as the metrics reader: allowed
        assert pod_metric(seen, "fastgshare_pod_gpu_time_request", team_a, a_pod.metadata.name,
                          assignment_of(a_pod).gpu_uuid) == pytest.approx(0.3)
    finally:
        b_core.delete_namespaced_pod("reader", namespace)


# --- issue 42 item 4: usage the arbiter can trust ------------------------------------------------

HOLD = ["/opt/fastgshare/bin/arbiter-flood", "--what", "hold"]
# The tenant image's own entrypoint (its TENANT_* environment), with the hook Allocate preloads unset.
BYPASS = ["sh", "-c", "exec env -u LD_PRELOAD /usr/local/bin/tenant-entrypoint"]


def logged_line(core: kubernetes.client.CoreV1Api, namespace: str, name: str, marker: str) -> str:
    """Waits until the pod runs and its log has a line with ``marker``; returns that line (fails at once,
    with its log, if the pod ended)."""
    line = ""

    def logged() -> bool:
        nonlocal line
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase in {"Succeeded", "Failed"}:
            log = core.read_namespaced_pod_log(name, namespace)
            raise AssertionError(f"pod {namespace}/{name} ended: {describe_pod(pod)}; its log:\n{log}")
        if pod.status.phase != "Running":
            return False
        line = next((text for text in core.read_namespaced_pod_log(name, namespace).splitlines()
                     if marker in text), "")
        return bool(line)

    wait_until(logged, what=f"pod {namespace}/{name} logging {marker!r}", timeout_s=90)
    return line


def pod_metric(metrics: dict[tuple[str, frozenset[Any]], float], name: str, namespace: str, pod: str,
               gpu: str) -> float | None:
    return metrics.get((name, frozenset({"namespace": namespace, "pod": pod, "gpu": gpu}.items())))


def test_a_client_that_holds_its_tokens_and_reports_nothing_gets_its_limit_only(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_a: str,
        team_b: tuple[str, Path]) -> None:
    """Issue 42 row 5: team B's pod (limit 0.2) runs a client that holds every token to its end and
    reports used_ns=0 (it got 0.79 of the GPU before the arbiter charged held time). Binpack places it
    on team A's GPU, the fullest: there team A keeps its request, and the agent's metric says the
    holder was charged no more than its limit."""
    namespace = team_b[0]
    b_core = team_api(team_b)
    a_pod = team_a_pod(core, team_a)
    a_uid, gpu = a_pod.metadata.uid, assignment_of(a_pod).gpu_uuid
    annotations = {**SMALL, keys.SCHEDULING_POLICY_ANNOTATION: "binpack"}
    b_core.create_namespaced_pod(namespace, gpu_pod("holder", annotations, tenant_container(command=HOLD)))
    try:
        print(logged_line(core, namespace, "holder", "holding tokens"))
        holder_gpu = assignment_of(core.read_namespaced_pod("holder", namespace)).gpu_uuid
        time.sleep(1)  # past the holder's first window
        shares = measure_shares(real_cluster, {gpu}, 10)
        metrics = node_metrics(real_cluster, core)
        charged = pod_metric(metrics, "fastgshare_pod_gpu_time_share", namespace, "holder", holder_gpu)
        share = shares.get(a_uid, 0.0)
        print(f"over 10 s with the holder: team A's pod {share:.3f} of {gpu}; the holder charged {charged} "
              f"on {holder_gpu}")
        assert charged is not None, f"no fastgshare_pod_gpu_time_share for team-b/holder on {holder_gpu}"
        assert charged <= 0.2 + 0.02, f"the holder (limit 0.2) was charged {charged:.3f} of the GPU's time"
        assert charged >= 0.05, f"the holder (request 0.1) was charged {charged:.3f}: did it hold any token?"
        assert holder_gpu == gpu, (
            f"binpack puts a pod on the fullest GPU it fits: team A's {gpu} (holding every pod of this module), "
            f"but the holder went to {holder_gpu}; the extender's view: "
            f"{http(f'{real_cluster.extender_url}/inspect')[1][:3000]!r}")
        assert share >= 0.3 - 0.03, f"team A's pod (request 0.3) got {share:.3f} beside the holder: {shares}"
        holder = core.read_namespaced_pod("holder", namespace)
        assert holder.status.phase == "Running", describe_pod(holder)  # it held tokens throughout
    finally:
        b_core.delete_namespaced_pod("holder", namespace)


def test_a_process_that_skips_the_hook_is_reported_unaccounted(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, team_b: tuple[str, Path]) -> None:
    """Issue 42 item 4's audit: team B's tenant runs without the hook (no token, so no charge); the
    simulated GPU's own accounting sees its GPU time, and within a few audit periods (10 s each) the
    node agent exports it as unaccounted and puts a Warning Event GPUTimeUnaccounted on the pod."""
    namespace = team_b[0]
    b_core = team_api(team_b)
    container = tenant_container({"TENANT_KERNEL_US": "2000"}, command=BYPASS)
    b_core.create_namespaced_pod(namespace, gpu_pod("bypass", SMALL, container))
    try:
        logged_line(core, namespace, "bypass", '"event": "report"')  # the tenant reports its launches each second
        gpu = assignment_of(core.read_namespaced_pod("bypass", namespace)).gpu_uuid
        seen: dict[str, Any] = {}

        def reported() -> bool:
            seen["share"] = pod_metric(node_metrics(real_cluster, core),
                                       "fastgshare_pod_gpu_time_unaccounted_share", namespace, "bypass", gpu)
            seen["events"] = [f"{e.type} {e.reason}: {e.message}" for e in core.list_namespaced_event(namespace).items
                              if e.involved_object.name == "bypass" and e.reason == REASON_GPU_TIME_UNACCOUNTED]
            return seen["share"] is not None and seen["share"] > 0.05 and any(
                event.startswith("Warning ") for event in seen["events"])

        try:
            wait_until(reported, what="the bypassing pod reported as unaccounted GPU time", timeout_s=45,
                       interval_s=2)
        except TimeoutError as error:
            raise AssertionError(f"{error}: unaccounted share {seen.get('share')}, events {seen.get('events')}; "
                                 f"the pod's events: {events_of(core, namespace, 'bypass')}") from None
        print(f"unaccounted share of team-b/bypass on {gpu}: {seen['share']:.3f}; {seen['events'][0]}")
    finally:
        b_core.delete_namespaced_pod("bypass", namespace)
