"""Single-layer OCI image archives from host files, for ``ctr images import``: no registry, no
container engine. Deterministic (mtimes 0, owner root), so the same inputs give the same digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_BASE_DIRS = {"tmp": 0o1777, "etc": 0o755, "dev": 0o755, "proc": 0o755, "sys": 0o755, "run": 0o755}


@dataclass
class ImageSpec:
    """What goes into one image: files copied from the host (symlinks resolved), files given as
    bytes, symlinks, and the runtime config."""

    name: str  # fully qualified, e.g. docker.io/fastgshare/tenant:local
    files: dict[str, Path] = field(default_factory=dict)  # image path -> host file
    contents: dict[str, tuple[bytes, int]] = field(default_factory=dict)  # image path -> (data, mode)
    links: dict[str, str] = field(default_factory=dict)  # image path -> link target
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: list[str] = field(default_factory=list)


def _entry(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, size
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "root", "root"
    return info


def layer_tar(spec: ImageSpec) -> bytes:
    """The image's one layer: every directory on the way, then the entries in path order."""
    items: dict[str, tuple[bytes, str | bytes, int]] = {}
    for path, host in spec.files.items():
        data = Path(host).resolve().read_bytes()
        items[path.strip("/")] = (tarfile.REGTYPE, data, stat.S_IMODE(os.stat(host).st_mode))
    for path, (data, mode) in spec.contents.items():
        items[path.strip("/")] = (tarfile.REGTYPE, data, mode)
    for path, target in spec.links.items():
        items[path.strip("/")] = (tarfile.SYMTYPE, target, 0o777)
    directories = dict(_BASE_DIRS)
    for path in items:
        for parent in PurePosixPath(path).parents:
            if str(parent) != ".":
                directories.setdefault(str(parent), 0o755)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in sorted(directories):
            tar.addfile(_entry(directory, tarfile.DIRTYPE, directories[directory]))
        for path in sorted(items):
            kind, payload, mode = items[path]
            if kind == tarfile.SYMTYPE:
                info = _entry(path, kind, mode)
                info.linkname = str(payload)
                tar.addfile(info)
            else:
                data = payload if isinstance(payload, bytes) else payload.encode()
                tar.addfile(_entry(path, kind, mode, len(data)), io.BytesIO(data))
    return buffer.getvalue()


def _descriptor(media_type: str, data: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}


def write_archive(spec: ImageSpec, out: Path) -> str:
    """Write the OCI image layout archive to ``out``; returns the manifest digest."""
    return _write_layout(spec, layer_tar(spec), out)


def write_rootfs_archive(spec: ImageSpec, rootfs: Path, out: Path) -> str:
    """Write an archive whose one layer is ``rootfs``, a root file system as a tar file (what
    ``mmdebstrap`` writes), with ``spec``'s name and runtime config (its files are not used);
    returns the manifest digest."""
    if spec.files or spec.contents or spec.links:
        raise ValueError(f"{spec.name}: a root file system image takes no extra files")
    return _write_layout(spec, rootfs.read_bytes(), out)


def _write_layout(spec: ImageSpec, layer: bytes, out: Path) -> str:
    layer_desc = _descriptor("application/vnd.oci.image.layer.v1.tar", layer)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": [DEFAULT_PATH, *spec.env], "WorkingDir": "/",
                   **({"Entrypoint": spec.entrypoint} if spec.entrypoint else {}),
                   **({"Cmd": spec.cmd} if spec.cmd else {})},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        "history": [{"created_by": "fastgshare cluster"}],
    }, sort_keys=True).encode()
    config_desc = _descriptor("application/vnd.oci.image.config.v1+json", config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": config_desc, "layers": [layer_desc]}, sort_keys=True).encode()
    manifest_desc = _descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
    tag = spec.name.rsplit(":", 1)[1] if ":" in spec.name.rsplit("/", 1)[-1] else "latest"
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": [{**manifest_desc, "platform": {"architecture": "amd64", "os": "linux"},
                                       "annotations": {"io.containerd.image.name": spec.name,
                                                       "org.opencontainers.image.ref.name": tag}}]},
                       sort_keys=True).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w") as tar:
        def put(name: str, data: bytes) -> None:
            tar.addfile(_entry(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))

        put("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        put("index.json", index)
        for data in (layer, config, manifest):
            put("blobs/sha256/" + hashlib.sha256(data).hexdigest(), data)
    return str(manifest_desc["digest"])
