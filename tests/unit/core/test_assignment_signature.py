"""The assignment signature: bound to every field, the pod uid and the node; keys checked."""

from __future__ import annotations

import attrs
import pytest

from fastgshare.assignment_signature import (
    MIN_KEY_BYTES,
    AssignmentKeyError,
    AssignmentTrust,
    beyond_own_share,
    check_key,
    problem,
    sign,
    verify,
)
from fastgshare.codec import PodAssignment
from tests.builders import TEST_ASSIGNMENT_KEY, make_share

ASSIGNMENT = PodAssignment(node_name="node-a", gpu_uuid="GPU-0000", gpu_index=0,
                           share=make_share(request=300, limit=600, sm=50), assigned_at_ms=1_000)
UID = "uid-1"


def test_a_signed_assignment_verifies() -> None:
    signature = sign(TEST_ASSIGNMENT_KEY, UID, ASSIGNMENT)
    assert verify(TEST_ASSIGNMENT_KEY, signature, pod_uid=UID, node_name="node-a", assignment=ASSIGNMENT)
    assert problem(TEST_ASSIGNMENT_KEY, signature, pod_uid=UID, node_name="node-a", assignment=ASSIGNMENT) is None


@pytest.mark.parametrize("tampered", [
    attrs.evolve(ASSIGNMENT, gpu_uuid="GPU-0001"),
    attrs.evolve(ASSIGNMENT, gpu_index=1),
    attrs.evolve(ASSIGNMENT, assigned_at_ms=1_001),
    attrs.evolve(ASSIGNMENT, share=make_share(request=301, limit=600, sm=50)),
    attrs.evolve(ASSIGNMENT, share=make_share(request=300, limit=1000, sm=50)),
    attrs.evolve(ASSIGNMENT, share=make_share(request=300, limit=600, sm=100)),
    attrs.evolve(ASSIGNMENT, share=make_share(request=300, limit=600, sm=50, mem=16 * 2**30)),
], ids=["gpu", "index", "time", "request", "limit", "sm", "memory"])
def test_each_field_is_covered(tampered: PodAssignment) -> None:
    signature = sign(TEST_ASSIGNMENT_KEY, UID, ASSIGNMENT)
    assert not verify(TEST_ASSIGNMENT_KEY, signature, pod_uid=UID, node_name="node-a", assignment=tampered)


def test_another_pod_node_or_key_is_refused() -> None:
    signature = sign(TEST_ASSIGNMENT_KEY, UID, ASSIGNMENT)
    moved = attrs.evolve(ASSIGNMENT, node_name="node-b")
    assert not verify(TEST_ASSIGNMENT_KEY, signature, pod_uid="uid-2", node_name="node-a", assignment=ASSIGNMENT)
    assert not verify(TEST_ASSIGNMENT_KEY, signature, pod_uid=UID, node_name="node-b", assignment=ASSIGNMENT)
    assert not verify(TEST_ASSIGNMENT_KEY, signature, pod_uid=UID, node_name="node-b", assignment=moved)
    assert not verify(b"k" * MIN_KEY_BYTES, signature, pod_uid=UID, node_name="node-a", assignment=ASSIGNMENT)
    assert not verify(TEST_ASSIGNMENT_KEY, None, pod_uid=UID, node_name="node-a", assignment=ASSIGNMENT)
    assert not verify(TEST_ASSIGNMENT_KEY, "garbage\u00e9", pod_uid=UID, node_name="node-a", assignment=ASSIGNMENT)
    assert "no signature" in (problem(TEST_ASSIGNMENT_KEY, None, pod_uid=UID, node_name="node-a",
                                      assignment=ASSIGNMENT) or "")


def test_keys_shorter_than_the_minimum_are_refused() -> None:
    assert check_key(b"x" * MIN_KEY_BYTES + b"\n", "f") == b"x" * MIN_KEY_BYTES
    with pytest.raises(AssignmentKeyError, match=r"^/k: the assignment key has 31 bytes; at least 32"):
        check_key(b"x" * 31, "/k")


def test_unsigned_trust_writes_none_and_checks_only_the_node() -> None:
    trust = AssignmentTrust(None)
    assert trust.sign(UID, ASSIGNMENT) is None
    assert trust.problem(None, pod_uid=UID, node_name="node-a", assignment=ASSIGNMENT) is None
    assert trust.problem(None, pod_uid=UID, node_name="node-b", assignment=ASSIGNMENT) is not None
    signing = AssignmentTrust(TEST_ASSIGNMENT_KEY)
    assert signing.problem(signing.sign(UID, ASSIGNMENT), pod_uid=UID, node_name="node-a",
                           assignment=ASSIGNMENT) is None


def test_beyond_own_share_names_each_field_above() -> None:
    own = make_share(request=300, limit=600, sm=50)
    assert beyond_own_share(own, own) is None
    assert beyond_own_share(make_share(request=100, limit=200, sm=10, mem=1), own) is None
    message = beyond_own_share(make_share(request=1000, limit=1000, sm=100, mem=16 * 2**30), own) or ""
    assert all(name in message for name in ("requestPermille", "limitPermille", "smPercent", "memoryBytes"))
