"""The tenant image of an older Debian, for the real-node tier: bullseye's own root file system
(glibc 2.31, as in Ubuntu 20.04 images), made with ``mmdebstrap`` from the Debian mirror this
machine's apt uses, with the tenant compiled inside it by bullseye's gcc against bullseye's C
library and the compiler removed again. A user's image carries programs built for its own glibc
in the same way; Allocate mounts our hook and the simulated driver into it as into any image, and
bullseye's loader must load them (issue 36, item 1).

Older releases: the Debian mirror reached here serves bullseye and newer only (buster and
stretch have moved to Debian's archive, which these machines do not reach).

The archive is cached under ``~/.cache/fastgshare`` by a digest of what goes into it, so a
second run on the same machine skips the download (about 40 s and 60 MiB).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from fastgshare_cluster.image_build import debian_mirror
from fastgshare_cluster.oci import ImageSpec, write_rootfs_archive

SUITE = "bullseye"
GLIBC_VERSION = "2.31"  # bullseye's libc6
IMAGE = f"docker.io/fastgshare/tenant-{SUITE}:local"
IMAGE_SHORT = f"fastgshare/tenant-{SUITE}:local"
REPOSITORY = Path(__file__).resolve().parents[2]
TENANT_SOURCE = REPOSITORY / "simgpu" / "workloads" / "tenant.c"
ENTRYPOINT = REPOSITORY / "fastgshare_cluster" / "tenant-entrypoint.sh"
CACHE = Path.home() / ".cache" / "fastgshare"


class DebianImageError(RuntimeError):
    """The image could not be made; the message names the step and its output."""


def cuda_include() -> Path:
    """The folder holding cuda.h that the simulated GPU's build uses (``make print-cuda-include``)."""
    result = subprocess.run(["make", "-s", "-C", str(REPOSITORY / "simgpu"), f"PYTHON={sys.executable}",
                             "print-cuda-include"], capture_output=True, text=True, check=False, timeout=60)
    folder = Path(result.stdout.strip())
    if result.returncode != 0 or not (folder / "cuda.h").exists():
        raise DebianImageError(f"no cuda.h for the {SUITE} tenant ({result.stdout}{result.stderr})")
    return folder


def _digest(*parts: Path) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.read_bytes())
    return digest.hexdigest()[:16]


def build_tenant_image(libcuda: Path, workdir: Path) -> Path:
    """The OCI archive of the bullseye tenant image (cached); ``libcuda`` is the simulated driver
    the tenant links against (it is mounted into the pod by Allocate, not put in the image)."""
    if shutil.which("mmdebstrap") is None:
        raise DebianImageError("the older-Debian tenant needs mmdebstrap (apt-get install mmdebstrap)")
    archive = CACHE / f"tenant-{SUITE}-{_digest(TENANT_SOURCE, ENTRYPOINT, Path(__file__))}.tar"
    if archive.exists():
        return archive
    include = cuda_include()
    sources = workdir / "tenant-src"
    shutil.rmtree(sources, ignore_errors=True)
    (sources / "include").mkdir(parents=True)
    for header in ("cuda.h", "cudaTypedefs.h"):
        shutil.copy(include / header, sources / "include" / header)
    shutil.copy(TENANT_SOURCE, sources / "tenant.c")
    shutil.copy(ENTRYPOINT, sources / "tenant-entrypoint")
    shutil.copy(libcuda, sources / "libcuda.so")
    rootfs = workdir / f"{SUITE}.tar"
    mirror = debian_mirror()
    command = [
        "mmdebstrap", "--variant=minbase", "--mode=root", "--include=gcc,libc6-dev",
        "--aptopt=Acquire::Languages \"none\"", "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--customize-hook=mkdir -p \"$1/opt/fastgshare/bin\" \"$1/usr/local/bin\"",
        f"--customize-hook=copy-in {sources} /tmp",
        "--customize-hook=chroot \"$1\" gcc -std=gnu11 -O2 -Wall -isystem /tmp/tenant-src/include "
        "-o /opt/fastgshare/bin/tenant /tmp/tenant-src/tenant.c -L/tmp/tenant-src -lcuda -ldl -lpthread",
        "--customize-hook=install -m 0755 \"$1/tmp/tenant-src/tenant-entrypoint\" \"$1/usr/local/bin/\"",
        "--customize-hook=chroot \"$1\" apt-get -y -q purge --autoremove gcc libc6-dev",
        "--customize-hook=rm -rf \"$1/tmp/tenant-src\" \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/* "
        "\"$1/etc/resolv.conf\" \"$1/etc/hostname\"",
        SUITE, str(rootfs), f"deb {mirror} {SUITE} main"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)
        if result.returncode != 0:
            raise DebianImageError(f"mmdebstrap {SUITE} failed (exit {result.returncode}):\n"
                                   f"{result.stdout[-2000:]}{result.stderr[-3000:]}")
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(".partial")
        write_rootfs_archive(ImageSpec(name=IMAGE, entrypoint=["/usr/local/bin/tenant-entrypoint"]), rootfs, partial)
        partial.rename(archive)
    finally:
        rootfs.unlink(missing_ok=True)
        shutil.rmtree(sources, ignore_errors=True)
    return archive
