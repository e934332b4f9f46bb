"""Listening ports picked for a local cluster's processes (fastgshare_cluster.processes.free_ports)."""

from __future__ import annotations

import itertools
import socket

import pytest

from fastgshare_cluster import processes


def test_a_port_handed_out_is_not_handed_out_again_before_its_process_binds_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process started without waiting (kube-controller-manager) binds its port a second or so
    later; a port picked for the next process in that second must not be the same one (a CI run
    failed with "bind: address already in use")."""
    picks = itertools.chain([21_001, 21_001, 21_001], itertools.count(21_002))
    monkeypatch.setattr(processes.random, "randrange", lambda *_: next(picks))
    monkeypatch.setattr(processes, "_handed_out", {})
    (first,) = processes.free_ports(1)
    second, third = processes.free_ports(2)
    assert first == 21_001
    assert {second, third}.isdisjoint({first})
    assert second != third


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind((processes.LOOPBACK, 0))
        busy.listen()
        taken = busy.getsockname()[1]
        picks = iter([taken, 21_500])
        monkeypatch.setattr(processes.random, "randrange", lambda *_: next(picks))
        monkeypatch.setattr(processes, "_handed_out", {})
        assert processes.free_ports(1) == [21_500]


def test_the_memory_of_handed_out_ports_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long test session forgets the oldest ports rather than running out of the range."""
    monkeypatch.setattr(processes, "_handed_out", {})
    monkeypatch.setattr(processes, "REMEMBERED_PORTS", 8)
    picks = itertools.count(22_000)
    monkeypatch.setattr(processes.random, "randrange", lambda *_: next(picks))
    chosen = processes.free_ports(20)  # a port in use on this machine is skipped: compare with what was chosen
    assert len(chosen) == 20
    assert list(processes._handed_out) == chosen[-8:]
