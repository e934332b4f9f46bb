"""The controller's own names: condition types, event reasons, label and annotation keys.

Names that another component must agree on are in :mod:`fastgshare.keys`.
"""

from __future__ import annotations

from typing import Final

# --- the controller's identity -------------------------------------------------------------
COMPONENT: Final = "fastgshare-controller"
LEASE_NAME: Final = "fastgshare-controller"

# --- status conditions ---------------------------------------------------------------------
CONDITION_AVAILABLE: Final = "Available"
CONDITION_PROGRESSING: Final = "Progressing"
CONDITION_INVALID_SPEC: Final = "InvalidSpec"

# --- event reasons -------------------------------------------------------------------------
REASON_INVALID_SPEC: Final = "InvalidSpec"
REASON_CREATED: Final = "SuccessfulCreate"
REASON_DELETED: Final = "SuccessfulDelete"
REASON_FAILED_CREATE: Final = "FailedCreate"
REASON_FAILED_DELETE: Final = "FailedDelete"
REASON_UPDATED_IN_PLACE: Final = "UpdatedInPlace"  # a time-quota-only change patched onto the running pods
REASON_FAILED_UPDATE: Final = "FailedUpdate"
