"""The computed status: transition times that move only on a flip, per-pod GPUs, the /scale selector."""

from __future__ import annotations

from fastpod_crd_controller.pods import PodInfo, pod_info
from fastpod_crd_controller.spec import parse_fastpod
from fastpod_crd_controller.status import Outcome, compute_status, pod_status
from tests.unit.fastpod_crd_controller.objects import fastpod, pod

EARLIER, NOW = "2026-11-29T11:00:00Z", "2026-11-29T12:00:00Z"


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def test_transition_time_moves_only_when_the_status_flips() -> None:
    obj = fastpod(replicas=1)
    first = compute_status(obj, parse_fastpod(obj), [], Outcome(progress="ScalingUp", progress_message="m"), EARLIER)
    obj["status"] = first
    ready = [pod_info(pod("web-a", obj, node="n", ready=True))]
    second = compute_status(obj, parse_fastpod(obj), ready, Outcome(), NOW)
    assert conditions(second)["Available"]["lastTransitionTime"] == NOW  # False -> True
    assert conditions(second)["Progressing"] == {"type": "Progressing", "status": "True", "reason": "ReplicasUpToDate",
                                                 "message": "the pods match the spec", "lastTransitionTime": EARLIER}
    assert conditions(second)["InvalidSpec"] == {"type": "InvalidSpec", "status": "False", "reason": "Valid",
                                                 "lastTransitionTime": EARLIER}


def test_no_value_is_an_empty_string() -> None:
    """The v1.20 API server turns "" into null on a status update and rejects it."""
    obj = fastpod()
    status = compute_status(obj, parse_fastpod(obj), [], Outcome(), NOW)

    def strings(value: object) -> list[str]:
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    assert "" not in strings(status)


def test_an_invalid_fastpod_keeps_its_last_selector_or_gets_the_default() -> None:
    obj = fastpod()
    invalid = Outcome(invalid_reason="InvalidShareAnnotations", invalid_message="bad")
    assert compute_status(obj, None, [], invalid, NOW)["selector"] == "fastgshare.caps.in.tum/fastpod=web"
    obj["status"] = {"selector": "app=web"}
    status = compute_status(obj, None, [], invalid, NOW)
    assert status["selector"] == "app=web"
    assert "updatedReplicas" not in status


def test_an_unreadable_assignment_still_shows_the_node() -> None:
    info = PodInfo(namespace="ns", name="p", uid="u", node_name="n1", assignment="{broken")
    assert pod_status(info) == {"name": "p", "phase": "Pending", "ready": False, "node": "n1"}
