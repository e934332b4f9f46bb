"""Events on FaSTPods, as ``kubectl describe fastpod`` shows them: the shared recorder
(:mod:`fastgshare_kube.events`) set to report on FaSTPods as the controller."""

from __future__ import annotations

from typing import Any

from fastgshare import keys
from fastgshare_kube import events
from fastgshare_kube.events import NORMAL, WARNING, EventSink, rfc3339  # noqa: F401 - re-exported
from fastpod_crd_controller import names


class EventRecorder(events.EventRecorder):
    """Writes events about FaSTPods, from the controller."""

    def __init__(self, kube: EventSink, *, instance: str, **options: Any) -> None:
        super().__init__(kube, component=names.COMPONENT, instance=instance, api_version=keys.FASTPOD_API_VERSION,
                         kind=keys.FASTPOD_KIND, **options)
