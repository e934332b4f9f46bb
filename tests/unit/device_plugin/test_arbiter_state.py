"""The arbiter's state file (issue 37, item 7): written atomically and durably (a temporary file
written whole, fsynced, renamed, the directory fsynced) with a checksum; a short, corrupt or
unchecked file is discarded with one log line."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from device_plugin.arbiter.state import SavedPod, StateFile
from fastgshare.arbitration import TimeShare

PODS = [SavedPod("GPU-0", "ns/a", 1 << 30, {111: 5 << 20, 222: 7 << 20}, TimeShare(300, 500, 50), "uid-a"),
        SavedPod("GPU-1", "ns/b", 1 << 28, {}, None, "")]


def test_what_is_saved_is_loaded(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "state.json")
    state.save(PODS)
    assert state.load() == PODS
    assert [path.name for path in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_save_fsyncs_the_file_before_the_rename_and_the_directory_after(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    def replace(source: os.PathLike[str], target: os.PathLike[str]) -> None:
        synced.append("rename")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    StateFile(tmp_path / "state.json").save(PODS)
    assert len(synced) == 3, synced
    assert synced[0].startswith(str(tmp_path / ".state.json."))
    assert synced[0].endswith(".tmp")
    assert synced[1:] == ["rename", str(tmp_path)]


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda descriptor, data: real_write(descriptor, bytes(data[:7])))
    state = StateFile(tmp_path / "state.json")
    state.save(PODS)
    monkeypatch.undo()
    assert state.load() == PODS


def _damaged(path: Path, how: str) -> None:
    raw = path.read_bytes()
    if how == "short":
        path.write_bytes(raw[:len(raw) // 2])
    elif how == "flipped":  # a digit of a held size changed: still valid JSON
        path.write_bytes(raw.replace(str(5 << 20).encode(), str(6 << 20).encode()))
    elif how == "unchecked":  # the version before the checksum
        data = json.loads(raw)
        del data["sha256"]
        data["version"] = 1
        path.write_text(json.dumps(data))
    elif how == "binary":
        path.write_bytes(b"\xff\xfe" + raw)
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["short", "flipped", "unchecked", "binary", "empty"])
def test_a_damaged_file_is_discarded_with_one_log_line(tmp_path: Path, how: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    state = StateFile(tmp_path / "state.json")
    state.save(PODS)
    _damaged(state.path, how)
    damaged = state.path.read_bytes()
    caplog.set_level(logging.DEBUG, logger="device_plugin.arbiter")
    assert state.load() == []
    lines = [record for record in caplog.records if record.name.startswith("device_plugin.arbiter")]
    assert len(lines) == 1, [record.getMessage() for record in lines]
    assert lines[0].levelno == logging.ERROR
    assert "unreadable" in lines[0].getMessage()
    assert not state.path.exists()
    assert (tmp_path / "state.unreadable").read_bytes() == damaged  # set aside for a look, not used
