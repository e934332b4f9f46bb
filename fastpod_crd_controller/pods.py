"""What reconcile knows about a pod: :class:`PodInfo`, read from the pod as the API serves it.

Pure and frozen, so the planner and the status use it without locks, and the cache keeps a few
fields per pod instead of whole objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fastgshare import keys

FINISHED_PHASES = ("Succeeded", "Failed")


@attrs.frozen(kw_only=True)
class PodInfo:
    """What reconcile needs to know about one pod."""

    namespace: str
    name: str
    uid: str
    owner_uid: str = ""  # the controlling FaSTPod's uid, "" if none
    owner_name: str = ""
    revision: str = ""
    node_name: str = ""
    phase: str = "Pending"
    ready: bool = False
    created: str = ""  # RFC 3339, so it sorts as text
    deleting: bool = False
    assignment: str | None = None  # the extender's raw assignment annotation
    time_quota: tuple[str | None, str | None] = (None, None)  # its gpu_quota_request and gpu_quota_limit annotations

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def owner_key(self) -> str | None:
        return f"{self.namespace}/{self.owner_name}" if self.owner_uid else None

    @property
    def active(self) -> bool:
        """Counts toward the replicas: neither terminating nor finished (as a ReplicaSet counts)."""
        return not self.deleting and self.phase not in FINISHED_PHASES

    @property
    def scheduled(self) -> bool:
        return bool(self.node_name)


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """The :class:`PodInfo` of a pod as the API returns it (a dict)."""
    metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    owner: Mapping[str, Any] = next((ref for ref in metadata.get("ownerReferences") or ()
                  if ref.get("controller") and ref.get("kind") == keys.FASTPOD_KIND
                  and str(ref.get("apiVersion", "")).startswith(f"{keys.FASTPOD_GROUP}/")), {})
    conditions = status.get("conditions") or ()
    annotations = metadata.get("annotations") or {}
    return PodInfo(
        namespace=metadata.get("namespace", ""), name=metadata.get("name", ""), uid=metadata.get("uid", ""),
        owner_uid=owner.get("uid", ""), owner_name=owner.get("name", ""),
        revision=(metadata.get("labels") or {}).get(keys.REVISION_LABEL, ""),
        node_name=spec.get("nodeName") or "", phase=status.get("phase") or "Pending",
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        created=metadata.get("creationTimestamp") or "",
        deleting=metadata.get("deletionTimestamp") is not None,
        assignment=annotations.get(keys.POD_ASSIGNMENT_ANNOTATION),
        time_quota=(annotations.get(keys.GPU_QUOTA_REQUEST), annotations.get(keys.GPU_QUOTA_LIMIT)),
    )
