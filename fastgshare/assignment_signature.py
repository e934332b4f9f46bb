"""Signing the extender's pod assignments, so a node agent can tell them from forgeries.

Anyone who may patch a pod can write its ``fastgshare/assignment`` annotation; the admission
webhook refuses them, but it is registered with ``failurePolicy: Ignore``. So the extender signs
each assignment it writes with a key only it and the node agents can read (HMAC-SHA256, in
``keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION``), bound to the pod's uid and node: an assignment
copied to another pod, raised, moved to another GPU or node, or made up fails to verify.

The signed text is a canonical encoding of its own (not the annotation's JSON, whose format is a
contract and may gain fields): a domain tag, then the pod uid, the node, and every field of the
assignment, in a fixed order. Pure: the key arrives as bytes; reading its file is the caller's.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Final

from fastgshare import keys
from fastgshare.codec import ASSIGNMENT_VERSION, PodAssignment
from fastgshare.share import ShareSpec

MIN_KEY_BYTES: Final = 32
SIGNATURE_SCHEME: Final = "hmac-sha256-v1"
_DOMAIN: Final = "fastgshare/assignment-signature"


class AssignmentKeyError(ValueError):
    """The assignment key is unusable; the message names where it came from and what is allowed."""


def check_key(raw: bytes, source: str) -> bytes:
    """The key from ``raw`` (a file's bytes; surrounding whitespace, such as a trailing newline,
    is not part of it); :class:`AssignmentKeyError` if it is shorter than ``MIN_KEY_BYTES``."""
    key = raw.strip()
    if len(key) < MIN_KEY_BYTES:
        raise AssignmentKeyError(f"{source}: the assignment key has {len(key)} bytes; at least {MIN_KEY_BYTES} "
                                 "are needed (e.g. `openssl rand -hex 32`)")
    return key


def signed_text(pod_uid: str, assignment: PodAssignment) -> bytes:
    """The canonical bytes a signature covers."""
    share = assignment.share
    fields = [_DOMAIN, SIGNATURE_SCHEME, ASSIGNMENT_VERSION, pod_uid, assignment.node_name, assignment.gpu_uuid,
              assignment.gpu_index, share.request_permille, share.limit_permille, share.sm_percent,
              share.memory_bytes, assignment.assigned_at_ms]
    return json.dumps(fields, separators=(",", ":"), ensure_ascii=True).encode()


def sign(key: bytes, pod_uid: str, assignment: PodAssignment) -> str:
    """The signature annotation's value for ``assignment`` on pod ``pod_uid``."""
    digest = hmac.new(key, signed_text(pod_uid, assignment), hashlib.sha256).hexdigest()
    return f"{SIGNATURE_SCHEME}:{digest}"


def verify(key: bytes, signature: str | None, *, pod_uid: str, node_name: str, assignment: PodAssignment) -> bool:
    """Whether ``signature`` is the extender's for ``assignment`` on pod ``pod_uid`` bound to
    ``node_name`` (the node the pod is on, as the verifier sees it); compared in constant time."""
    if signature is None or not pod_uid or assignment.node_name != node_name:
        return False
    return hmac.compare_digest(signature.encode("utf-8", "replace"), sign(key, pod_uid, assignment).encode())


def problem(key: bytes, signature: str | None, *, pod_uid: str, node_name: str,
            assignment: PodAssignment) -> str | None:
    """Why the assignment is not the extender's for this pod and node (None: it is), for logs and events."""
    if signature is None:
        return "it carries no signature of the fastgshare scheduler extender"
    if assignment.node_name != node_name:
        return f"it names node {assignment.node_name}, but the pod is on node {node_name or '(none)'}"
    if not verify(key, signature, pod_uid=pod_uid, node_name=node_name, assignment=assignment):
        return "its signature does not match (not written by the fastgshare scheduler extender for this pod)"
    return None


class AssignmentTrust:
    """What a component does with signatures: sign and verify with a key, or (``key`` None, only
    with ``--allow-unsigned-assignments``, for development) write none and accept any assignment
    that names the pod's node."""

    def __init__(self, key: bytes | None) -> None:
        self._key = key

    @property
    def signing(self) -> bool:
        return self._key is not None

    def sign(self, pod_uid: str, assignment: PodAssignment) -> str | None:
        """The signature to write with ``assignment`` (None when unsigned)."""
        return sign(self._key, pod_uid, assignment) if self._key is not None else None

    def problem(self, signature: str | None, *, pod_uid: str, node_name: str,
                assignment: PodAssignment) -> str | None:
        """Why the assignment is not to be trusted for this pod and node (None: it is)."""
        if self._key is None:
            if assignment.node_name != node_name:
                return f"it names node {assignment.node_name}, but the pod is on node {node_name or '(none)'}"
            return None
        return problem(self._key, signature, pod_uid=pod_uid, node_name=node_name, assignment=assignment)


KEY_FILE_FLAG: Final = "--assignment-key-file"
ALLOW_UNSIGNED_FLAG: Final = "--allow-unsigned-assignments"


def trust_from_flags(key_file: str | None, allow_unsigned: bool, read: Callable[[str], bytes]) -> AssignmentTrust:
    """The trust the two flags ask for (``read`` reads a file's bytes and may raise :class:`OSError`);
    :class:`AssignmentKeyError` with one line naming the flag when they are missing or unusable."""
    if key_file is None:
        if not allow_unsigned:
            raise AssignmentKeyError(f"{KEY_FILE_FLAG} PATH is required (the key in Secret "
                                     f"{keys.SYSTEM_NAMESPACE}/{keys.ASSIGNMENT_KEY_SECRET}, key "
                                     f"{keys.ASSIGNMENT_KEY_SECRET_KEY}); {ALLOW_UNSIGNED_FLAG} runs without "
                                     "signatures, for development only")
        return AssignmentTrust(None)
    try:
        raw = read(key_file)
    except OSError as error:
        raise AssignmentKeyError(f"{KEY_FILE_FLAG} {key_file}: cannot read the assignment key: "
                                 f"{error.strerror or error}") from None
    return AssignmentTrust(check_key(raw, f"{KEY_FILE_FLAG} {key_file}"))


def beyond_own_share(assigned: ShareSpec, own: ShareSpec) -> str | None:
    """Where an assignment gives a pod more than its own share annotations ask for (None: nowhere)."""
    over = [f"{name} {mine} > {theirs}" for name, mine, theirs in (
        ("requestPermille", assigned.request_permille, own.request_permille),
        ("limitPermille", assigned.limit_permille, own.limit_permille),
        ("smPercent", assigned.sm_percent, own.sm_percent),
        ("memoryBytes", assigned.memory_bytes, own.memory_bytes)) if mine > theirs]
    return ("it gives more than the pod's own share annotations: " + ", ".join(over)) if over else None
