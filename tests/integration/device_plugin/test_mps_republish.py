"""The running agent republishes the inventory when a GPU's MPS changes (issue 36, item 4)."""

from __future__ import annotations

import time

from fastgshare.codec import decode_node_inventory
from tests.integration.device_plugin.conftest import RunningAgent


def _latest_mps(running_agent: RunningAgent, wanted: list[bool]) -> list[bool]:
    deadline = time.monotonic() + 10
    while True:
        mps = [gpu.mps_enabled for gpu in decode_node_inventory(running_agent.publisher.payloads[-1]).gpus]
        if mps == wanted or time.monotonic() > deadline:
            return mps
        time.sleep(0.05)


def test_a_gpus_mps_change_is_published(running_agent: RunningAgent) -> None:
    assert running_agent.publisher.published.wait(10)
    gpus = running_agent.agent.devices.inventory().gpus
    assert [gpu.mps_enabled for gpu in gpus] == [True, True]
    assert running_agent.agent.devices.set_mps(gpus[1].uuid, False)
    assert _latest_mps(running_agent, [True, False]) == [True, False]
    assert running_agent.agent.devices.set_mps(gpus[1].uuid, True)
    assert _latest_mps(running_agent, [True, True]) == [True, True]
