"""The fastgshare/fake-fn:local image: built from vgpu_hook/build like the tenant image."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from fastgshare_cluster import images
from tests.integration.hook.tenants import BUILD, SIMGPU_BUILD, Build


def _blobs(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


@pytest.mark.skipif(not images.BUSYBOX.exists(), reason="needs busybox (apt-get install busybox-static)")
def test_the_image_runs_fake_fn_with_its_libraries(build: Build, tmp_path: Path) -> None:
    archive = images.build_fake_fn(tmp_path, BUILD, SIMGPU_BUILD)
    files = _blobs(archive)
    [entry] = json.loads(files["index.json"])["manifests"]
    assert images.FAKE_FN_IMAGE == "docker.io/fastgshare/fake-fn:local"
    assert entry["annotations"]["io.containerd.image.name"] == images.FAKE_FN_IMAGE
    manifest = json.loads(files["blobs/sha256/" + entry["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])["config"]
    assert config["Entrypoint"] == ["/opt/fastgshare/bin/fake-fn"]
    assert "FAKE_FN_PORT=8080" in config["Env"]
    [layer] = manifest["layers"]
    with tarfile.open(fileobj=io.BytesIO(files["blobs/sha256/" + layer["digest"].split(":")[1]])) as tar:
        members = {m.name: m for m in tar.getmembers()}
        binary = tar.extractfile(members["opt/fastgshare/bin/fake-fn"]).read()  # type: ignore[union-attr]
    assert binary == (SIMGPU_BUILD / "fake-fn").read_bytes()
    assert members["opt/fastgshare/bin/fake-fn"].mode & 0o111
    assert members["bin/sh"].issym()
    assert any(name.split("/")[-1].startswith("libc.so") for name in members)
    assert any(name.split("/")[-1].startswith("ld-linux") for name in members)
    assert not any("libcuda" in name or "libnvidia-ml" in name for name in members)  # mounted by Allocate


def test_a_missing_build_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(images.ImageError, match=r"fake-fn image: missing .*fake-fn.*make -C vgpu_hook"):
        images.build_fake_fn(tmp_path / "images", tmp_path / "no-build", tmp_path / "no-build")
