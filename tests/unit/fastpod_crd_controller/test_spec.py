"""Validating a FaSTPod: every problem named with the field, the bad value and what is allowed."""

from __future__ import annotations

import pytest

from fastgshare import keys
from fastpod_crd_controller.errors import InvalidFaSTPod
from fastpod_crd_controller.spec import parse_fastpod, revision
from tests.builders import share_annotations
from tests.unit.fastpod_crd_controller.objects import CONTAINER, fastpod


def problems_of(obj: dict) -> tuple[str, tuple[str, ...]]:
    with pytest.raises(InvalidFaSTPod) as caught:
        parse_fastpod(obj)
    return caught.value.reason, caught.value.problems


def test_a_valid_fastpod() -> None:
    spec = parse_fastpod(fastpod(replicas=4))
    assert (spec.key, spec.replicas, spec.gpu_containers) == ("team-a/web", 4, ("server",))
    assert (spec.share.request_permille, spec.share.limit_permille, spec.share.sm_percent) == (400, 800, 50)
    assert str(spec.selector) == "fastgshare.caps.in.tum/fastpod=web"
    assert len(spec.revision) == 10


def test_replicas_default_to_one() -> None:
    assert parse_fastpod(fastpod(replicas=None)).replicas == 1


@pytest.mark.parametrize(("annotations", "expected"), [
    (share_annotations(request="1.5"),
     'fastgshare/gpu_quota_request: "1.5" is out of range; allowed: a decimal fraction of GPU time, '
     '0 <= request <= 1 (e.g. "0.4")'),
    (share_annotations(request="0.9", limit="0.5"),
     'fastgshare/gpu_quota_request: request "0.9" is greater than fastgshare/gpu_quota_limit "0.5"; '
     "allowed: request <= limit"),
    (share_annotations(sm="0"),
     'fastgshare/gpu_sm_partition: "0" is out of range; allowed: an integer percent of the SMs, 1..100 (e.g. "50")'),
    (share_annotations(mem=None),
     'fastgshare/gpu_mem: is required; allowed: a positive whole number of bytes, e.g. "2700000000", '
     '"1536Mi" or "1.5Gi"'),
], ids=["request-above-one", "request-above-limit", "sm-zero", "memory-missing"])
def test_share_problems_name_the_annotation_value_and_range(annotations: dict, expected: str) -> None:
    reason, problems = problems_of(fastpod(annotations=annotations))
    assert reason == "InvalidShareAnnotations"
    assert problems == (expected,)


def test_no_share_at_all_is_invalid() -> None:
    reason, problems = problems_of(fastpod(annotations={}))
    assert reason == "InvalidShareAnnotations"
    assert [p.split(":")[0] for p in problems] == [keys.GPU_QUOTA_REQUEST, keys.GPU_QUOTA_LIMIT, keys.GPU_MEM]


def test_every_problem_is_reported_at_once() -> None:
    obj = fastpod(annotations={**share_annotations(limit="2"), keys.GPU_CONTAINERS_ANNOTATION: "gpu"},
                  selector={"matchExpressions": [{"key": "app", "operator": "Exists"}]})
    reason, problems = problems_of(obj)
    assert reason == "InvalidShareAnnotations"
    assert [p.split(":")[0] for p in problems] == [keys.GPU_QUOTA_LIMIT, "spec.selector",
                                                    keys.GPU_CONTAINERS_ANNOTATION]


def test_gpu_containers_must_name_containers() -> None:
    pod_spec = {"containers": [dict(CONTAINER), {"name": "sidecar", "image": "s:1"}]}
    reason, problems = problems_of(fastpod(pod_spec=pod_spec, annotations={
        **share_annotations(), keys.GPU_CONTAINERS_ANNOTATION: "server,gpu-worker"}))
    assert reason == "InvalidPodSpec"
    assert problems == ('fastgshare/gpu_containers: "server,gpu-worker" names no container: gpu-worker; '
                        "allowed: comma-separated names of spec.podSpec.containers (server, sidecar)",)


def test_a_selector_that_does_not_select_the_pods_is_invalid() -> None:
    reason, problems = problems_of(fastpod(selector={"matchExpressions": [
        {"key": "tier", "operator": "In", "values": ["gpu"]}]}))
    assert reason == "InvalidSelector"
    assert problems[0].startswith('spec.selector: "tier in (gpu)" does not select the labels the pods get '
                                  "(fastgshare.caps.in.tum/fastpod=web)")


def test_the_selector_may_use_the_fastpods_labels_and_expressions() -> None:
    spec = parse_fastpod(fastpod(labels={"tier": "gpu"}, selector={
        "matchLabels": {"app": "web"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]},
                             {"key": "canary", "operator": "DoesNotExist"}]}))
    assert str(spec.selector) == "app=web,!canary,tier in (cpu,gpu)"
    assert dict(spec.pod_labels) == {"tier": "gpu", "app": "web", keys.FASTPOD_NAME_LABEL: "web"}


@pytest.mark.parametrize(("pod_spec", "expected"), [
    (None, "spec.podSpec: is required: a Pod spec (containers, volumes, ...)"),
    ({"containers": []}, "spec.podSpec.containers: must list at least one container"),
    ({"containers": [{"image": "x"}]}, "spec.podSpec.containers: every container needs a name"),
    ({"containers": [CONTAINER], "nodeName": "gpu-1"},
     "spec.podSpec.nodeName: must not be set: pods are placed by the fastgshare-scheduler scheduler "
     "(use nodeSelector or affinity to restrict the nodes)"),
], ids=["missing", "no-containers", "unnamed", "node-name"])
def test_pod_spec_problems(pod_spec: dict | None, expected: str) -> None:
    obj = fastpod()
    if pod_spec is None:
        del obj["spec"]["podSpec"]
    else:
        obj["spec"]["podSpec"] = pod_spec
    reason, problems = problems_of(obj)
    assert (reason, problems) == ("InvalidPodSpec", (expected,))


def test_a_name_longer_than_a_label_value_is_invalid() -> None:
    reason, problems = problems_of(fastpod(name="x" * 64))
    assert reason == "InvalidSelector"
    assert problems[0].startswith("metadata.name: must be at most 63 characters")


def test_the_revision_follows_pod_spec_labels_and_annotations_but_not_key_order() -> None:
    base = revision({"containers": [{"name": "a", "image": "b"}]}, {"l": "1"}, {"k": "v"})
    assert base == revision({"containers": [{"image": "b", "name": "a"}]}, {"l": "1"}, {"k": "v"})
    others = {revision({"containers": [{"name": "a", "image": "c"}]}, {"l": "1"}, {"k": "v"}),
              revision({"containers": [{"name": "a", "image": "b"}]}, {"l": "2"}, {"k": "v"}),
              revision({"containers": [{"name": "a", "image": "b"}]}, {"l": "1"}, {"k": "w"})}
    assert base not in others
    assert len(others) == 3
    changed_share = fastpod(annotations=share_annotations(request="0.5"))
    assert parse_fastpod(changed_share).revision != parse_fastpod(fastpod()).revision
