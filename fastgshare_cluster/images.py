"""The images a local cluster runs, built from host files and imported into containerd:

- ``registry.k8s.io/pause:3.2-fastgshare``: our static pause (``pause.c``), the sandbox image;
- ``docker.io/fastgshare/tenant:local``: busybox, the tenant program from ``simgpu/build``,
  ``memcheck`` and ``arbiter-flood`` (a hostile tenant for the second-team tests) from
  ``vgpu_hook/build``, and the C library they need, with ``tenant-entrypoint.sh``. No CUDA driver inside: as the
  NVIDIA container toolkit does for a real GPU, the node agent's Allocate mounts the
  (simulated) driver into the container.
- ``docker.io/fastgshare/fake-fn:local``: busybox and the ``fake-fn`` function from
  ``simgpu/build`` (``simgpu/workloads/fake_fn.c``), an HTTP server on port 8080 (OpenFaaS
  of-watchdog contract, ``GET /_/health``) whose every request runs ``FAKE_FN_GPU_MS`` (default 5)
  of kernels through the hook. The driver is mounted the same way as for the tenant.
- ``registry.k8s.io/kube-scheduler:v<version>`` (``cluster up --from-manifests``): the control
  plane's own kube-scheduler binary, under the name ``deploy/install.sh`` runs.
"""

from __future__ import annotations

import subprocess
from importlib import resources
from pathlib import Path

from fastgshare_cluster.oci import ImageSpec, write_archive

PAUSE_IMAGE = "registry.k8s.io/pause:3.2-fastgshare"
TENANT_IMAGE = "docker.io/fastgshare/tenant:local"
TENANT_IMAGE_SHORT = "fastgshare/tenant:local"
FAKE_FN_IMAGE = "docker.io/fastgshare/fake-fn:local"
FAKE_FN_IMAGE_SHORT = "fastgshare/fake-fn:local"
FAKE_FN_PORT = 8080
BUSYBOX = Path("/bin/busybox")
BUSYBOX_APPLETS = ("sh", "cat", "echo", "env", "grep", "head", "ls", "mkdir", "ps", "sed", "sleep", "tail",
                   "test", "wc", "id", "kill", "printf", "stat", "true", "false", "date", "awk", "cut", "tr")


class ImageError(Exception):
    """An image could not be built or imported; the message says what is missing."""


def _package_file(name: str) -> bytes:
    return resources.files("fastgshare_cluster").joinpath(name).read_bytes()


def build_pause(workdir: Path) -> Path:
    """Compile ``pause.c`` statically (gcc, libc6-dev) and package it; returns the archive."""
    source, binary = workdir / "pause.c", workdir / "pause"
    workdir.mkdir(parents=True, exist_ok=True)
    source.write_bytes(_package_file("pause.c"))
    result = subprocess.run(["gcc", "-static", "-O2", "-o", str(binary), str(source)],
                            check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise ImageError(f"cannot build the pause image: gcc -static failed (apt-get install gcc libc6-dev):\n"
                         f"{result.stderr.strip()}")
    archive = workdir / "pause.tar"
    write_archive(ImageSpec(name=PAUSE_IMAGE, files={"/pause": binary}, entrypoint=["/pause"]), archive)
    return archive


def shared_libraries(*binaries: Path) -> dict[str, Path]:
    """The dynamic loader and the libraries ``ldd`` lists for ``binaries`` (host paths, which
    are also their paths in the image), except those the pod gets mounted (libcuda, NVML)."""
    found: dict[str, Path] = {}
    for binary in binaries:
        output = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
        for line in output.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
            if path.startswith("/") and "libcuda" not in path and "libnvidia-ml" not in path:
                found[path] = Path(path)
    return found


def build_tenant(workdir: Path, hook_build: Path, simgpu_build: Path) -> Path:
    """The tenant image from ``simgpu_build`` (the tenant) and ``hook_build`` (memcheck, and arbiter-flood: a
    hostile tenant for tests; ``make -C vgpu_hook`` builds all three); returns the archive."""
    tenant, memcheck, flood = simgpu_build / "tenant", hook_build / "memcheck", hook_build / "arbiter-flood"
    missing = [str(path) for path in (tenant, memcheck, flood, hook_build / "libfastgshare-hook.so", BUSYBOX)
               if not path.exists()]
    if missing:
        raise ImageError(f"cannot build the tenant image: missing {', '.join(missing)} "
                         "(make -C vgpu_hook PYTHON=.venv/bin/python; apt-get install busybox-static)")
    spec = ImageSpec(
        name=TENANT_IMAGE,
        files={"/bin/busybox": BUSYBOX, "/opt/fastgshare/bin/tenant": tenant,
               "/opt/fastgshare/bin/memcheck": memcheck, "/opt/fastgshare/bin/arbiter-flood": flood,
               **shared_libraries(tenant, memcheck, flood, hook_build / "libfastgshare-hook.so")},
        contents={"/usr/local/bin/tenant-entrypoint": (_package_file("tenant-entrypoint.sh"), 0o755)},
        links={f"/bin/{applet}": "busybox" for applet in BUSYBOX_APPLETS},
        entrypoint=["/usr/local/bin/tenant-entrypoint"],
    )
    archive = workdir / "tenant.tar"
    write_archive(spec, archive)
    return archive


def build_fake_fn(workdir: Path, hook_build: Path, simgpu_build: Path) -> Path:
    """The fake-fn image from ``simgpu_build`` (the function; ``make -C vgpu_hook`` builds it too); returns the
    archive."""
    fake_fn, hook = simgpu_build / "fake-fn", hook_build / "libfastgshare-hook.so"
    missing = [str(path) for path in (fake_fn, hook, BUSYBOX) if not path.exists()]
    if missing:
        raise ImageError(f"cannot build the fake-fn image: missing {', '.join(missing)} "
                         "(make -C vgpu_hook PYTHON=.venv/bin/python; apt-get install busybox-static)")
    spec = ImageSpec(
        name=FAKE_FN_IMAGE,
        # The hook is mounted by Allocate; the libraries it needs must be in the image.
        files={"/bin/busybox": BUSYBOX, "/opt/fastgshare/bin/fake-fn": fake_fn, **shared_libraries(fake_fn, hook)},
        links={f"/bin/{applet}": "busybox" for applet in BUSYBOX_APPLETS},
        entrypoint=["/opt/fastgshare/bin/fake-fn"],
        env=[f"FAKE_FN_PORT={FAKE_FN_PORT}"],
    )
    archive = workdir / "fake-fn.tar"
    write_archive(spec, archive)
    return archive


def kube_scheduler_image(version: str) -> str:
    """The name deploy/install.sh gives the scheduler's image on a cluster of ``version`` (e.g. 1.20.2)."""
    return f"registry.k8s.io/kube-scheduler:v{version}"


def build_kube_scheduler(workdir: Path, kube_scheduler: Path, version: str) -> Path:
    """The kube-scheduler image made from the (static) binary the local control plane runs, under
    the name install.sh asks for, since no registry is reachable; returns the archive."""
    workdir.mkdir(parents=True, exist_ok=True)
    archive = workdir / "kube-scheduler.tar"
    write_archive(ImageSpec(name=kube_scheduler_image(version), files={"/usr/local/bin/kube-scheduler": kube_scheduler},
                            entrypoint=["/usr/local/bin/kube-scheduler"]), archive)
    return archive


def import_images(ctr: str, containerd_socket: Path, archives: list[Path]) -> None:
    """``ctr images import`` into the namespace the CRI plugin uses (``k8s.io``)."""
    for archive in archives:
        result = subprocess.run([ctr, "--address", str(containerd_socket), "--namespace", "k8s.io", "images",
                                 "import", str(archive)],
                                check=False, capture_output=True, text=True)
        if result.returncode != 0:
            raise ImageError(f"ctr images import {archive} failed: {result.stderr.strip()}")
