"""The shipped scheduler configurations: the profile and extender stanza our contracts require.

The v1beta1 form is run by the cluster tier's real v1.20 scheduler; the v1 (>= 1.25) and v1beta2
(1.22-1.24) forms cannot be run here, so they are checked to carry the same extender stanza.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fastgshare import keys

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "scheduler"
FILES = {"v1": "kube-scheduler-config.yaml", "v1beta2": "kube-scheduler-config.v1beta2.yaml",
         "v1beta1": "kube-scheduler-config.v1beta1.yaml"}


def load(version: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / FILES[version]).read_text())
    return document


@pytest.mark.parametrize("version", list(FILES))
def test_profile_and_extender(version: str) -> None:
    document = load(version)
    assert document["apiVersion"] == f"kubescheduler.config.k8s.io/{version}"
    assert document["kind"] == "KubeSchedulerConfiguration"
    assert [profile["schedulerName"] for profile in document["profiles"]] == [keys.SCHEDULER_NAME]
    (extender,) = document["extenders"]
    assert extender["nodeCacheCapable"] is True
    assert extender["ignorable"] is False
    assert (extender["filterVerb"], extender["prioritizeVerb"], extender["bindVerb"]) == (
        "filter", "prioritize", "bind")
    assert extender["managedResources"] == [{"name": keys.VGPU_RESOURCE, "ignoredByScheduler": False}]
    assert extender["weight"] > 0
    assert "preemptVerb" not in extender


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_every_form_carries_the_same_extender(version: str) -> None:
    assert load("v1")["extenders"] == load(version)["extenders"]
    assert load("v1")["leaderElection"] == load(version)["leaderElection"]


def test_v1beta2_differs_from_v1_only_in_its_version() -> None:
    assert {**load("v1beta2"), "apiVersion": "kubescheduler.config.k8s.io/v1"} == load("v1")
