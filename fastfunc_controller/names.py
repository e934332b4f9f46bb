"""The function controller's own names: identity, condition types, event reasons.

Names that another component must agree on (labels, the CRD) are in :mod:`fastgshare.keys`.
"""

from __future__ import annotations

from typing import Final

COMPONENT: Final = "fastgshare-function-controller"
LEASE_NAME: Final = "fastgshare-function-controller"

# --- scaling policies (spec.scaling.policy) ------------------------------------------------
POLICY_FIXED: Final = "fixed"
POLICY_RPR: Final = "rpr"
POLICY_HPA: Final = "hpa"
POLICIES: Final = (POLICY_FIXED, POLICY_RPR, POLICY_HPA)

# --- status conditions ---------------------------------------------------------------------
CONDITION_READY: Final = "Ready"
CONDITION_INVALID_SPEC: Final = "InvalidSpec"
CONDITION_PROFILE_MISSING: Final = "ProfileMissing"
CONDITION_UNSCHEDULABLE: Final = "Unschedulable"
CONDITION_METRICS_UNAVAILABLE: Final = "MetricsUnavailable"  # an autoscaled function reads no request rate

# --- condition and event reasons -----------------------------------------------------------
REASON_INVALID_SPEC: Final = "InvalidSpec"
REASON_VALID: Final = "Valid"
REASON_PROFILE_MISSING: Final = "ProfileMissing"
REASON_PROFILE_GIVEN: Final = "ProfileGiven"
REASON_PROFILE_NOT_FOUND: Final = "ProfileNotFound"  # no such ConfigMap, or no profile.json in it
REASON_PROFILE_INVALID: Final = "ProfileInvalid"  # a bad document, no SLO, nothing SLO-feasible
REASON_RATES_READ: Final = "RatesRead"
REASON_NO_RATES: Final = "NoRates"
REASON_SCALED: Final = "Scaled"  # the autoscaler changed the plan
REASON_WOKEN: Final = "Woken"  # the gateway woke the function's parked pods
REASON_NOT_NEEDED: Final = "NotNeeded"  # policy fixed needs no profile
REASON_ALL_READY: Final = "AllReplicasReady"
REASON_REPLICAS_UNAVAILABLE: Final = "ReplicasUnavailable"
REASON_SERVICE_CONFLICT: Final = "ServiceConflict"
REASON_PODS_UNSCHEDULABLE: Final = "PodsUnschedulable"  # a pod the scheduler cannot place
REASON_PODS_SCHEDULABLE: Final = "PodsSchedulable"  # none such (or no pods)
REASON_CREATED: Final = "SuccessfulCreate"
REASON_DELETED: Final = "SuccessfulDelete"
REASON_UPDATED: Final = "SuccessfulUpdate"
REASON_FAILED: Final = "FailedSync"
