"""The node agent on a node without GPUs: the simulated-GPUs node label (deploy/node-agent's
documented setting) decides what it simulates; without it, no GPUs is the error it always was."""

from __future__ import annotations

from typing import Any

import pytest

import device_plugin.kube
from device_plugin import main as agent_main
from device_plugin.discovery import SimulatedGpus
from device_plugin.nvml import NvmlUnavailable
from fastgshare import keys


class NoNvml:
    def __init__(self, *_args: Any) -> None:
        raise NvmlUnavailable("libnvidia-ml.so.1: cannot open shared object file")


def args_for(monkeypatch: pytest.MonkeyPatch, label: str | None, *extra: str) -> Any:
    """Parsed agent flags on a node whose simulated-GPUs label is ``label``; NVML finds nothing."""
    monkeypatch.setattr(agent_main, "NvmlGpus", NoNvml)
    monkeypatch.setattr(device_plugin.kube, "load_api_client", lambda _kubeconfig: object())
    labels = {} if label is None else {keys.SIMULATED_GPUS_LABEL: label}
    monkeypatch.setattr(device_plugin.kube, "node_label", lambda _api, _node, key: labels.get(key))
    return agent_main.build_parser().parse_args(["--node-name", "gpu-node-1", *extra])


def test_the_label_makes_the_agent_simulate_the_gpus_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    args = args_for(monkeypatch, "2x16GiB_80sm")
    backend = agent_main.make_backend(args)
    assert isinstance(backend, SimulatedGpus)
    devices = backend.devices()
    assert [(d.memory_bytes, d.sm_count) for d in devices] == [(16 << 30, 80)] * 2
    assert args.fake_gpus == "2x16GiB:80sm"  # so the simulated driver is installed and mounted too


def test_without_the_label_no_gpus_is_still_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    args = args_for(monkeypatch, None)
    with pytest.raises(agent_main.StartupError, match=rf"no GPUs: .*label the node {keys.SIMULATED_GPUS_LABEL}=SPEC"):
        agent_main.start_arbiter(args)


def test_a_malformed_label_names_the_label_the_value_and_the_form(monkeypatch: pytest.MonkeyPatch) -> None:
    args = args_for(monkeypatch, "2x16GiB")
    with pytest.raises(agent_main.StartupError) as raised:
        agent_main.make_backend(args)
    assert str(raised.value) == (f'node label {keys.SIMULATED_GPUS_LABEL}: "2x16GiB" is not a GPU spec label value; '
                                 'allowed: COUNTxMEMORY_SMsm[_mps|_nomps] (a GPU spec with "_" for ":"), '
                                 'e.g. "2x16GiB_80sm"')
    assert raised.value.code == 2


def test_the_fake_gpus_flag_wins_and_the_api_is_not_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    args = args_for(monkeypatch, "2x16GiB_80sm", "--fake-gpus", "1x80GiB:132sm")
    monkeypatch.setattr(device_plugin.kube, "node_label", lambda *_a: pytest.fail("the API was asked"))
    backend = agent_main.make_backend(args)
    assert [(d.memory_bytes, d.sm_count) for d in backend.devices()] == [(80 << 30, 132)]
