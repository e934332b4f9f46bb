"""Build the project's image from its ``Dockerfile`` with no container registry, as CI and a
machine without Docker must: the base image the Dockerfile names (``FROM python:...-slim-bookworm``)
is made locally from Debian's packages with ``mmdebstrap`` (a minimal bookworm with Python and a
virtualenv at ``/opt/venv`` first on ``PATH``, which stands in for ``/usr/local`` of the official
image), then the Dockerfile is built unchanged with ``buildah`` and the image exported as an OCI
archive that ``ctr images import`` (or ``podman load``) takes.

The build reaches the Python and Debian package registries the way this machine is configured
(its apt sources; pip trusts the machine's CA bundle through a ``pip.conf`` mounted into ``RUN``
steps only, so nothing of it lands in a layer) and nothing else. It runs with ``--network host``
(no bridge, no NAT rules left behind) and with the limits this machine allows (runc; ``nofile``
and ``nproc`` under the hard limits, as root has no ``CAP_SYS_RESOURCE`` here). Podman's store
(``/var/lib/containers/storage``) keeps the base and the layers as a cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

IMAGE = "ghcr.io/fastgshare/fastgshare:0.1.0"
TOOLS = {"mmdebstrap": "mmdebstrap", "buildah": "buildah", "podman": "podman"}
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
ULIMITS = ("nofile=20000:20000", "nproc=32768:32768")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"

Say = Callable[[str], None]


class ImageBuildError(Exception):
    """A step of the build failed; the message names the step, the command and its output."""


@attrs.frozen(kw_only=True)
class BuiltImage:
    tag: str
    size_bytes: int  # unpacked, as podman reports it
    base_seconds: float  # 0 when the base was already in podman's store
    build_seconds: float


def base_image_of(dockerfile: Path) -> str:
    """The fully qualified reference of the Dockerfile's first ``FROM`` (``python:x`` is
    ``docker.io/library/python:x``, as buildah resolves short names)."""
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"\s*FROM\s+(\S+)", line, re.IGNORECASE)
        if match:
            reference = match.group(1)
            first = reference.split("/")[0]
            if "/" not in reference:
                return f"docker.io/library/{reference}"
            if "." not in first and ":" not in first and first != "localhost":
                return f"docker.io/{reference}"
            return reference
    raise ImageBuildError(f"{dockerfile}: no FROM line")


def debian_mirror(sources_dir: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt uses here: the first ``URIs:`` of a deb822 ``.sources`` file with
    ``Types: deb``, else the first ``deb`` line of a ``.list`` file."""
    for path in sorted((sources_dir / "sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            lines = [line for line in stanza.splitlines() if ":" in line and not line.startswith("#")]
            fields = dict(line.split(":", 1) for line in lines)
            if "deb" in fields.get("Types", "").split() and fields.get("URIs", "").strip():
                return fields["URIs"].split()[0]
    for path in [sources_dir / "sources.list", *sorted((sources_dir / "sources.list.d").glob("*.list"))]:
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if parts[:1] == ["deb"]:
                    return next(part for part in parts[1:] if not part.startswith("["))
    return DEFAULT_MIRROR


def missing_tools() -> list[str]:
    return sorted(package for command, package in TOOLS.items() if shutil.which(command) is None)


class ImageBuilder:
    """Builds ``tag`` from ``source``'s Dockerfile, working in ``work`` (config files, the base's
    root file system while it is made, the exported archive)."""

    def __init__(self, source: Path, work: Path, *, tag: str = IMAGE, say: Say = print) -> None:
        self.source, self.work, self.tag, self.say = source, work, tag, say
        self.work.mkdir(parents=True, exist_ok=True)
        containers_conf = self.work / "containers.conf"
        limits = ", ".join(f'"{limit}"' for limit in ULIMITS)
        containers_conf.write_text(f'[containers]\ndefault_ulimits = [{limits}]\n[engine]\nruntime = "runc"\n')
        (self.work / "pip.conf").write_text("[global]\ncert = /etc/pip-host-ca.crt\ndefault-timeout = 180\n"
                                            "disable-pip-version-check = 1\n")
        self._env = {**os.environ, "CONTAINERS_CONF": str(containers_conf)}

    def build(self) -> BuiltImage:
        if missing := missing_tools():
            raise ImageBuildError(f"missing Debian packages: {' '.join(missing)} (apt-get install {' '.join(missing)})")
        base = base_image_of(self.source / "Dockerfile")
        started = time.monotonic()
        had_base = self._exists(base)
        if not had_base:
            self.make_base(base)
        base_seconds = 0.0 if had_base else time.monotonic() - started
        started = time.monotonic()
        self.say(f"building {self.tag} from {self.source / 'Dockerfile'} with buildah")
        self._run("buildah bud", [
            "buildah", "bud", "--layers", "--pull=never", "--network", "host", "--runtime", "runc",
            *(flag for limit in ULIMITS for flag in ("--ulimit", limit)),
            "-v", f"{self.work / 'pip.conf'}:/etc/pip.conf:ro", "-v", f"{CA_BUNDLE}:/etc/pip-host-ca.crt:ro",
            "-t", self.tag, "-f", "Dockerfile", "."], cwd=self.source, timeout_s=1200)
        build_seconds = time.monotonic() - started
        size = int(self._run("podman image inspect", ["podman", "image", "inspect", "--format", "{{.Size}}",
                                                      self.tag]).strip())
        return BuiltImage(tag=self.tag, size_bytes=size, base_seconds=round(base_seconds, 1),
                          build_seconds=round(build_seconds, 1))

    def make_base(self, reference: str) -> None:
        """A minimal Debian bookworm with Python and ``/opt/venv``, tagged ``reference``."""
        mirror = debian_mirror()
        rootfs = self.work / "rootfs.tar"
        self.say(f"making the base image {reference} from Debian {SUITE} ({mirror}) with mmdebstrap")
        try:
            self._run("mmdebstrap", [
                "mmdebstrap", "--variant=minbase", "--mode=root", "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
                "--include=ca-certificates,python3,python3-venv,netbase", "--aptopt=Acquire::Languages \"none\"",
                "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-include=/usr/share/doc/*/copyright", "--dpkgopt=path-exclude=/usr/share/locale/*",
                "--customize-hook=chroot \"$1\" python3 -m venv /opt/venv",
                "--customize-hook=rm -f \"$1\"/etc/resolv.conf \"$1\"/etc/hostname",
                SUITE, str(rootfs), f"deb {mirror} {SUITE} main", f"deb {mirror} {SUITE}-updates main",
                f"deb {mirror}-security {SUITE}-security main"], timeout_s=900)
            self._run("podman import", [
                "podman", "import", "--change",
                "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]', str(rootfs), reference])
        finally:
            rootfs.unlink(missing_ok=True)

    def export(self, path: Path) -> Path:
        """The image as an OCI archive (what ``ctr images import`` takes)."""
        path.unlink(missing_ok=True)
        self._run("podman save", ["podman", "save", "--format", "oci-archive", "-o", str(path), self.tag])
        return path

    def _exists(self, reference: str) -> bool:
        return subprocess.run(["podman", "image", "exists", reference], env=self._env, check=False).returncode == 0

    def _run(self, step: str, args: Sequence[str], *, cwd: Path | None = None, timeout_s: float = 300) -> str:
        try:
            result = subprocess.run(list(args), cwd=cwd, env=self._env, capture_output=True, text=True,
                                    timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ImageBuildError(f"{step} did not finish within {timeout_s:.0f} s") from None
        if result.returncode != 0:
            output = (result.stdout[-2500:] + result.stderr[-2500:]).strip()
            raise ImageBuildError(f"{step} failed (exit {result.returncode}):\n{output}")
        return result.stdout
