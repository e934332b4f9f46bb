"""Single-layer OCI image archives: the layout ``ctr images import`` reads, and determinism."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from fastgshare_cluster.oci import ImageSpec, write_archive, write_rootfs_archive


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_archive_is_an_oci_layout_whose_digests_match(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_bytes(b"\x7fELF fake")
    binary.chmod(0o755)
    spec = ImageSpec(name="docker.io/fastgshare/tenant:local", files={"/opt/bin/tool": binary},
                     contents={"/etc/greeting": (b"hello\n", 0o644)}, links={"/bin/sh": "busybox"},
                     entrypoint=["/opt/bin/tool"], env=["A=1"])
    digest = write_archive(spec, tmp_path / "image.tar")
    files = _members(tmp_path / "image.tar")
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    [entry] = json.loads(files["index.json"])["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "docker.io/fastgshare/tenant:local"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "local"
    manifest = json.loads(files["blobs/sha256/" + digest.split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Entrypoint"] == ["/opt/bin/tool"]
    assert "A=1" in config["config"]["Env"]
    [layer] = manifest["layers"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]
    with tarfile.open(fileobj=io.BytesIO(files["blobs/sha256/" + layer["digest"].split(":")[1]])) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["opt/bin/tool"].mode == 0o755
    assert members["bin/sh"].issym()
    assert members["bin/sh"].linkname == "busybox"
    assert members["opt"].isdir()
    assert members["tmp"].mode == 0o1777
    assert all(m.mtime == 0 and m.uid == 0 for m in members.values())


def test_the_same_inputs_give_the_same_digest(tmp_path: Path) -> None:
    spec = ImageSpec(name="registry.k8s.io/pause:x", contents={"/pause": (b"p", 0o755)}, entrypoint=["/pause"])
    assert write_archive(spec, tmp_path / "a.tar") == write_archive(spec, tmp_path / "b.tar")
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


def test_a_root_file_system_tar_becomes_the_one_layer_unchanged(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        info = tarfile.TarInfo("usr/lib/x86_64-linux-gnu/libc-2.31.so")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"libc"))
    spec = ImageSpec(name="docker.io/fastgshare/tenant-bullseye:local", entrypoint=["/bin/run"], env=["B=2"])
    digest = write_rootfs_archive(spec, rootfs, tmp_path / "image.tar")
    files = _members(tmp_path / "image.tar")
    manifest = json.loads(files["blobs/sha256/" + digest.split(":")[1]])
    [layer] = manifest["layers"]
    assert files["blobs/sha256/" + layer["digest"].split(":")[1]] == rootfs.read_bytes()
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert (config["config"]["Entrypoint"], config["rootfs"]["diff_ids"]) == (["/bin/run"], [layer["digest"]])
    assert "B=2" in config["config"]["Env"]


def test_a_root_file_system_image_takes_no_extra_files(tmp_path: Path) -> None:
    spec = ImageSpec(name="x/y:z", contents={"/a": (b"a", 0o644)})
    with pytest.raises(ValueError, match="takes no extra files"):
        write_rootfs_archive(spec, tmp_path / "rootfs.tar", tmp_path / "image.tar")
