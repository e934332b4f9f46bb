"""The autoscaler in the function controller, with a fake API (whose writes land in the caches, as
the watches would bring them) and a fake rate source, on an injected clock: a rising rate scales
the child FaSTPods up within one interval, a falling one scales them down only after the delay."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from fastfunc_controller.controller import Controller
from fastfunc_controller.rates import Rates
from fastgshare import keys
from fastgshare.codec import PodAssignment
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.profile import Profile, ProfilePoint, Slo, encode_profile
from fastgshare.scaling_fit import FreeSpace
from fastgshare.share import ShareSpec, parse_share
from fastgshare_kube.errors import ApiError
from fastgshare_kube.events import EventRecorder

PROFILE = (Path(__file__).resolve().parents[3] / "examples" / "profile-resnet50.json").read_text()


def fastfunc(**scaling: Any) -> dict[str, Any]:
    return {"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND,
            "metadata": {"name": "resnet", "namespace": "fn", "uid": "u1", "generation": 1},
            "spec": {"podSpec": {"containers": [{"name": "fn", "image": "x"}]}, "memory": "2Gi",
                     "slo": {"latencyMs": 69}, "profile": {"configMapRef": {"name": "resnet-profile"}},
                     "scaling": {"policy": "rpr", "minReplicas": 1, "intervalSeconds": 2,
                                 "scaleDownDelaySeconds": 60, "headroom": 0.5, **scaling}}}


class FakeKube:
    """The API: FaSTPod writes go to the controller's cache (the watch), the rest is recorded."""

    def __init__(self, profile: str | None = PROFILE) -> None:
        self.made: Controller | None = None
        self.profile = profile
        self.events: list[Mapping[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self._uids = 0

    def create_fastpod(self, namespace: str, body: Mapping[str, Any]) -> None:
        assert self.made is not None
        self._uids += 1
        child = copy.deepcopy(dict(body))
        child["metadata"]["uid"] = f"fp{self._uids}"
        self.made.fastpods.upsert(child)

    def patch_fastpod(self, namespace: str, name: str, operations: Any) -> None:
        assert self.made is not None
        child = self.made.fastpods.get(f"{namespace}/{name}")
        assert child is not None
        for op in operations:
            if op["op"] == "add" and op["path"] == "/spec/replicas":
                child["spec"]["replicas"] = op["value"]
            elif op["op"] in ("add", "remove") and op["path"].startswith("/metadata/annotations/"):
                key = op["path"].removeprefix("/metadata/annotations/").replace("~1", "/").replace("~0", "~")
                if op["op"] == "add":
                    child["metadata"]["annotations"][key] = op["value"]
                else:
                    del child["metadata"]["annotations"][key]
        self.made.fastpods.upsert(child)

    def delete_fastpod(self, namespace: str, name: str, uid: str) -> None:
        assert self.made is not None
        child = self.made.fastpods.get(f"{namespace}/{name}")
        assert child is not None
        self.made.fastpods.delete(child)

    def create_service(self, namespace: str, body: Mapping[str, Any]) -> None:
        assert self.made is not None
        self.made.services.upsert(dict(body))

    def patch_service(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        pass

    def patch_fastfunc_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        assert self.made is not None
        self.statuses.append(copy.deepcopy(dict(status)))
        stored = self.made.fastfuncs.get(f"{namespace}/{name}")
        assert stored is not None
        stored["status"] = {**(stored.get("status") or {}), **copy.deepcopy(dict(status))}
        self.made.fastfuncs.upsert(stored)

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.profile is None or name != "resnet-profile":
            return None
        return {"metadata": {"name": name, "namespace": namespace}, "data": {"profile.json": self.profile}}

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.events.append(body)

    def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        pass


class FakeRates:
    def __init__(self) -> None:
        self.rates: Rates | str = "the gateways' counters have not been read twice yet; the current plan is kept"
        self.asked: list[str] = []

    def scrape(self) -> None:
        pass

    def read(self, function_name: str, long_s: float, short_s: float) -> Rates | str:
        self.asked.append(function_name)
        return self.rates


class Harness:
    def __init__(self, obj: dict[str, Any], profile: str | None = PROFILE,
                 free_space: Callable[[], FreeSpace] | None = None) -> None:
        self.kube = FakeKube(profile)
        self.rates = FakeRates()
        self.clock = [1000.0]
        recorder = EventRecorder(self.kube, component="test", instance="t", api_version=keys.FASTFUNC_API_VERSION,
                                 kind=keys.FASTFUNC_KIND)
        self.made = Controller(self.kube, recorder, now=lambda: "2026-01-01T00:00:00Z", metrics=self.rates,
                               clock=lambda: self.clock[0], free_space=free_space)
        self.kube.made = self.made
        self.made.fastfuncs.upsert(obj)

    def at(self, seconds: float, rates: Rates | str | None = None) -> dict[str, int]:
        """Reconcile at ``seconds`` after the start with ``rates``; the children's replicas by name."""
        self.clock[0] = 1000.0 + seconds
        if rates is not None:
            self.rates.rates = rates
        self.made.reconcile("fn/resnet")
        return {child["metadata"]["name"]: child["spec"]["replicas"]
                for child in self.made.fastpods.select(namespace="fn")}

    @property
    def status(self) -> dict[str, Any]:
        stored = self.made.fastfuncs.get("fn/resnet")
        assert stored is not None
        return dict(stored["status"])

    def capacity(self) -> float:
        """The SLO capacity of the children's replicas (each row's sloRps)."""
        rows = {row["fastPod"]: row for row in self.status["configs"]}
        return sum(replicas * rows[name]["sloRps"] for name, replicas in self.at_now().items())

    def at_now(self) -> dict[str, int]:
        return {child["metadata"]["name"]: child["spec"]["replicas"]
                for child in self.made.fastpods.select(namespace="fn")}


def condition(status: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_a_rising_rate_scales_up_within_one_interval_and_a_falling_one_only_after_the_delay() -> None:
    run = Harness(fastfunc())
    first = run.at(0)  # no rate yet: minReplicas of the most efficient configuration
    assert sum(first.values()) == 1
    assert condition(run.status, "MetricsUnavailable")["status"] == "True"
    assert condition(run.status, "ProfileMissing")["status"] == "False"
    assert run.rates.asked == ["resnet.fn"]

    assert run.at(1, Rates(long=50, short=50)) == first  # within the interval: nothing read, nothing changed
    up = run.at(2)
    assert sum(up.values()) > 1
    assert run.capacity() >= 50 * 1.5
    status = run.status
    assert (status["rps"], status["plannedRps"]) == (50, 75)
    assert status["lastScaleTime"] == "2026-01-01T00:00:00Z"
    assert condition(status, "MetricsUnavailable")["status"] == "False"
    scaled = [e["message"] for e in run.kube.events if e["reason"] == "Scaled"]
    assert scaled[-1].startswith("Policy rpr: 50 req/s observed, planned for 75 req/s: ")

    assert run.at(4, Rates(long=5, short=5)) == up  # the rate fell, the delay holds the pods
    assert run.at(60) == up
    down = run.at(62)  # 60 s after the scale-up
    assert sum(down.values()) < sum(up.values())
    assert 5 * 1.5 <= run.capacity() < 50
    assert set(down) <= set(up)  # configurations at 0 are deleted, none is added


def test_a_burst_in_the_short_window_panics_and_the_max_replicas_clamp() -> None:
    run = Harness(fastfunc(maxReplicas=2))
    run.at(0, Rates(long=0, short=0))
    assert sum(run.at(2, Rates(long=10, short=400)).values()) == 2  # the burst wants far more; clamped to 2
    assert run.status["plannedRps"] == 600


def test_without_a_rate_the_plan_is_kept_and_the_condition_says_why() -> None:
    run = Harness(fastfunc())
    run.at(0, Rates(long=50, short=50))
    before = run.at_now()
    assert run.at(2, "no gateway answers: http://gw/metrics: refused; the current plan is kept") == before
    metrics = condition(run.status, "MetricsUnavailable")
    assert (metrics["status"], metrics["reason"]) == ("True", "NoRates")
    assert metrics["message"].startswith("no gateway answers")


@pytest.mark.parametrize(("profile", "reason", "says"), [
    (None, "ProfileNotFound", "ConfigMap fn/resnet-profile (spec.profile.configMapRef) does not exist"),
    ("{", "ProfileInvalid", "ConfigMap fn/resnet-profile (spec.profile.configMapRef), key profile.json: profile"),
])
def test_a_missing_or_bad_profile_runs_the_fixed_fallback_and_says_so(profile: str | None, reason: str,
                                                                      says: str) -> None:
    run = Harness(fastfunc(), profile=profile)
    assert run.at(0, Rates(long=50, short=50)) == {"resnet-q100-s100": 1}
    missing = condition(run.status, "ProfileMissing")
    assert (missing["status"], missing["reason"]) == ("True", reason)
    assert missing["message"].startswith(says)
    assert missing["message"].endswith("running the whole-GPU configuration (quota 1, SM 100) with 1 replicas")
    assert condition(run.status, "MetricsUnavailable")["reason"] == "NotNeeded"
    assert [e["reason"] for e in run.kube.events if e["type"] == "Warning"] == [reason]
    run.at(1)
    assert [e["reason"] for e in run.kube.events if e["type"] == "Warning"] == [reason]  # once per message


def test_hpa_runs_whole_gpus_with_the_hpa_rules() -> None:
    run = Harness(fastfunc(policy="hpa", intervalSeconds=15, scaleDownDelaySeconds=300))
    assert run.at(0, Rates(long=0, short=0)) == {"resnet-q100-s100": 1}
    # The whole GPU's maxRps is 74.9: 200 req/s want ceil(200 / (0.7 x 74.9)) = 4 pods, up at most to n + 4.
    assert run.at(15, Rates(long=200, short=200)) == {"resnet-q100-s100": 4}
    assert run.at(30, Rates(long=20, short=20)) == {"resnet-q100-s100": 4}  # stabilisation window
    assert run.at(316) == {"resnet-q100-s100": 1}


def whole_gpu_child(replicas: int) -> dict[str, Any]:
    return {"apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
            "metadata": {"name": "resnet-q100-s100", "namespace": "fn", "uid": "old",
                         "labels": {keys.FUNCTION_LABEL: "resnet", keys.FUNCTION_CONFIG_LABEL: "q100-s100"},
                         "annotations": {keys.GPU_QUOTA_REQUEST: "1", keys.GPU_QUOTA_LIMIT: "1",
                                         keys.GPU_SM_PARTITION: "100", keys.GPU_MEM: "2Gi"},
                         "ownerReferences": [{"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND,
                                              "name": "resnet", "uid": "u1", "controller": True}]},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas, "readyReplicas": replicas}}


def test_a_re_plan_whose_new_pods_do_not_fit_is_not_made() -> None:
    full = ShareSpec(request_permille=1000, limit_permille=1000, sm_percent=100, memory_bytes=2**30)
    run = Harness(fastfunc(intervalSeconds=2, scaleDownDelaySeconds=60), free_space=lambda: gpu(mps=False,
                                                                                                  taken=full))
    run.made.fastpods.upsert(whole_gpu_child(2))
    assert run.at(0, Rates(long=60, short=60)) == {"resnet-q100-s100": 2}
    assert run.at(62) == {"resnet-q100-s100": 2}  # three q40-s24 pods would be cheaper, but fit no GPU
    assert run.at(64) == {"resnet-q100-s100": 2}  # and it is not tried again every tick
    assert not [e for e in run.kube.events if "re-plan" in e["message"]]


def test_a_costly_plan_is_re_planned_make_before_break() -> None:
    run = Harness(fastfunc(intervalSeconds=2, scaleDownDelaySeconds=60))
    whole = whole_gpu_child(2)
    run.made.fastpods.upsert(whole)  # two whole GPUs run (e.g. from policy fixed): 134 req/s for 2 GPUs
    assert run.at(0, Rates(long=60, short=60)) == {"resnet-q100-s100": 2}
    assert run.at(58) == {"resnet-q100-s100": 2}  # not within the delay of the start
    replanned = run.at(62)  # 60 x 1.5 = 90 req/s: three q40-s24 pods (92 req/s for 3 x 0.125 of a GPU)
    assert replanned == {"resnet-q100-s100": 2, "resnet-q40-s24": 3}  # the old pods run on meanwhile
    assert any("re-plan" in e["message"] for e in run.kube.events if e["reason"] == "Scaled")
    assert run.at(64) == replanned  # the new pods are not ready yet
    new = run.made.fastpods.get("fn/resnet-q40-s24")
    assert new is not None
    new["status"] = {"replicas": 3, "readyReplicas": 3}
    run.made.fastpods.upsert(new)
    assert run.at(66) == {"resnet-q40-s24": 3}  # ready: the whole GPUs go
    assert run.capacity() >= 90


def gpu(*, mps: bool, taken: ShareSpec | None = None) -> FreeSpace:
    """One V100's free space, with another tenant's pod taking ``taken``."""
    inventory = NodeInventory(node_name="n", gpus=(GpuDevice(uuid="g0", index=0, model="V100-16GB",
                                                             memory_bytes=16 * 2**30, sm_count=80, mps_enabled=mps),))
    pods = [] if taken is None else [("other/p", PodAssignment(node_name="n", gpu_uuid="g0", gpu_index=0, share=taken,
                                                               assigned_at_ms=0))]
    return FreeSpace.of([inventory], pods)


def test_a_configuration_that_does_not_fit_gives_way_to_the_next_that_does() -> None:
    # Another pod holds 80 % of the SMs all the time: a 24 % slice no longer fits, two 12 % ones do.
    taken = ShareSpec(request_permille=1000, limit_permille=1000, sm_percent=80, memory_bytes=2**30)
    unchecked = Harness(fastfunc())
    unchecked.at(0, Rates(long=0, short=0))
    assert unchecked.at(2, Rates(long=30, short=30)) == {"resnet-q40-s24": 2}  # 45 req/s: one more q40-s24
    space = [gpu(mps=True)]
    run = Harness(fastfunc(), free_space=lambda: space[0])
    assert run.at(0, Rates(long=0, short=0)) == {"resnet-q40-s24": 1}
    space[0] = gpu(mps=True, taken=taken)
    assert run.at(2, Rates(long=30, short=30)) == {"resnet-q40-s24": 1, "resnet-q40-s12": 2}
    run.at(3)  # the status's rows follow the children it saw
    assert run.capacity() >= 45


def test_what_fits_nowhere_is_created_anyway_and_a_failed_read_adds_pods_unchecked() -> None:
    # One idle V100 without MPS: two q40 pods fill 80 % of its time; nothing covers the other two,
    # so the planned pods are made and stay Pending with the scheduler's reason (Unschedulable).
    run = Harness(fastfunc(), free_space=lambda: gpu(mps=False))
    run.at(0, Rates(long=0, short=0))
    assert run.at(2, Rates(long=100, short=100)) == {"resnet-q40-s24": 5}

    def refuse() -> FreeSpace:
        raise ApiError(403, "Forbidden", "nodes is forbidden")

    failing = Harness(fastfunc(), free_space=refuse)
    failing.at(0, Rates(long=0, short=0))
    assert failing.at(2, Rates(long=30, short=30)) == {"resnet-q40-s24": 2}


# Two quotas of one SM slice: at 2 GiB of 16 a pod costs at least 1/8 of a GPU, so raising a q20-s50
# pod (15 req/s) to q40-s50 (22 req/s, 0.2 of a GPU) adds 7 req/s for less than a new pod costs.
LADDER = encode_profile(Profile(function="resnet", gpu_model="V100-16GB", slo=Slo(percentile=95, latency_ms=69),
                                points=(ProfilePoint(quota_request=0.2, quota_limit=0.2, sm_partition=50,
                                                     memory_bytes=2 * 2**30, max_rps=15, p95_ms=40),
                                        ProfilePoint(quota_request=0.4, quota_limit=0.4, sm_partition=50,
                                                     memory_bytes=2 * 2**30, max_rps=22, p95_ms=40))))


def bound_pods(run: Harness, child: str, count: int) -> list[tuple[str, PodAssignment]]:
    """``count`` pods of ``child`` in the pod cache, each bound to GPU g0 with the child's share."""
    fastpod = run.made.fastpods.get(f"fn/{child}")
    assert fastpod is not None
    share = parse_share(fastpod["metadata"]["annotations"])
    bound = []
    for i in range(count):
        name = f"{child}-{i}"
        run.made.pods.upsert({"metadata": {"name": name, "namespace": "fn", "labels": {keys.FUNCTION_LABEL: "resnet"},
                                           "ownerReferences": [{"kind": keys.FASTPOD_KIND, "controller": True,
                                                                "uid": fastpod["metadata"]["uid"], "name": child}]},
                              "status": {"phase": "Running"}})
        bound.append((f"fn/{name}", PodAssignment(node_name="n", gpu_uuid="g0", gpu_index=0, share=share,
                                                  assigned_at_ms=0)))
    return bound


@pytest.mark.parametrize(("other", "raised"), [(None, True), (800, False)])
def test_a_vertical_step_raises_the_running_pods_quota_in_place_where_their_gpu_has_room(other: int | None,
                                                                                          raised: bool) -> None:
    pods: list[tuple[str, PodAssignment]] = []
    taken = ShareSpec(request_permille=other or 1, limit_permille=other or 1, sm_percent=100, memory_bytes=2**30)

    def free_space() -> FreeSpace:
        others = [] if other is None else [("x/other", PodAssignment(node_name="n", gpu_uuid="g0", gpu_index=0,
                                                                    share=taken, assigned_at_ms=0))]
        inventory = NodeInventory(node_name="n", gpus=(GpuDevice(uuid="g0", index=0, model="V100-16GB",
                                                                 memory_bytes=16 * 2**30, sm_count=80,
                                                                 mps_enabled=True),))
        return FreeSpace.of([inventory], [*pods, *others])

    run = Harness(fastfunc(), profile=LADDER, free_space=free_space)
    assert run.at(0, Rates(long=0, short=0)) == {"resnet-q20-s50": 1}
    pods.extend(bound_pods(run, "resnet-q20-s50", 1))
    after = run.at(2, Rates(long=12, short=12))  # 18 req/s wanted, 15 run: raising the pod's quota covers it
    if raised:
        assert after == {"resnet-q20-s50": 1}  # the same child, its time quota raised in place
        child = run.made.fastpods.get("fn/resnet-q20-s50")
        assert child is not None
        assert child["metadata"]["annotations"][keys.GPU_QUOTA_REQUEST] == "0.4"
        assert run.made.fastpods.get("fn/resnet-q40-s50") is None
        run.at(3)
        assert [row["config"] for row in run.status["configs"]] == ["q40-s50"]
        assert run.capacity() >= 18
        assert any("q20-s50x1 -> q40-s50x1" in e["message"] for e in run.kube.events if e["reason"] == "Scaled")
    else:  # 80 % of the GPU's time on all SMs is another's: no room to raise; a pod is added instead
        assert sum(after.values()) == 2
        child = run.made.fastpods.get("fn/resnet-q20-s50")
        assert child is not None
        assert child["metadata"]["annotations"][keys.GPU_QUOTA_REQUEST] == "0.2"
