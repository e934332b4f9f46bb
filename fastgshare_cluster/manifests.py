"""``fastgshare cluster up --from-manifests``: fastgshare installed on the local node the way a
platform team installs it, from ``deploy/`` with ``deploy/install.sh``, its components running
as pods of the project's image.

What stands in for what a real cluster has and this machine lacks: the project's image is built
from the ``Dockerfile`` offline (:mod:`fastgshare_cluster.image_build`) and imported into the
node's containerd, and so is a kube-scheduler image made from the control plane's own binary
under the name ``install.sh`` asks for; the node has no GPUs, so it carries the documented label
:data:`fastgshare.keys.SIMULATED_GPUS_LABEL`, with which the node agent's DaemonSet runs there on
simulated GPUs and the MPS DaemonSet does not. Everything else is ``install.sh`` unchanged.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastgshare import keys
from fastgshare_cluster import image_build, images

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
NAMESPACE = "fastgshare-system"
NODE_AGENT_STATE_DIR = "/var/lib/fastgshare"  # the node agent's --state-dir in deploy/node-agent
K8S_VERSION = "1.20.2"  # what tests/cluster/build-control-plane.sh builds
INSTALL_TIMEOUT_S = 900.0


class InstallError(Exception):
    """``install.sh`` or ``uninstall.sh`` failed; the message carries the script's output."""


Say = Callable[[str], None]


@dataclass(frozen=True)
class BuiltImages:
    archives: list[Path]
    image: image_build.BuiltImage


def build_images(workdir: Path, kube_scheduler: Path, say: Say) -> BuiltImages:
    """The project's image (from its Dockerfile) and the kube-scheduler image, as OCI archives."""
    builder = image_build.ImageBuilder(REPO, workdir / "image-build", say=say)
    built = builder.build()
    project = builder.export(workdir / "image-build" / "fastgshare-image.tar")
    scheduler = images.build_kube_scheduler(workdir, kube_scheduler, K8S_VERSION)
    return BuiltImages(archives=[project, scheduler], image=built)


def simulated_gpus_label(gpus: str) -> str:
    """The label value for the GPU spec ``gpus`` (``2x16GiB:80sm`` -> ``2x16GiB_80sm``)."""
    if "=" in gpus:
        raise ValueError(f"--gpus {gpus!r}: a node label cannot name the model (MODEL=); leave it out")
    return gpus.replace(":", "_")


def kubectl_env(kubeconfig: Path) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": str(kubeconfig)}


def kubectl(kubeconfig: Path, *args: str, timeout_s: float = 120) -> str:
    result = subprocess.run(["kubectl", *args], env=kubectl_env(kubeconfig), capture_output=True, text=True,
                            timeout=timeout_s, check=False)
    if result.returncode != 0:
        raise InstallError(f"kubectl {' '.join(args)}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def label_node(kubeconfig: Path, node_name: str, gpus: str) -> None:
    """Mark the node as one with simulated GPUs (the setting deploy/node-agent documents)."""
    kubectl(kubeconfig, "label", "node", node_name, "--overwrite",
            f"{keys.SIMULATED_GPUS_LABEL}={simulated_gpus_label(gpus)}")


def run_script(script: str, kubeconfig: Path, *args: str, say: Say, log_path: Path,
               env: dict[str, str] | None = None) -> float:
    """Run ``deploy/<script>`` as a user does, its output appended to ``log_path``; returns seconds."""
    if shutil.which("kubectl") is None:
        raise InstallError("kubectl is not on PATH; deploy/install.sh needs it (1.20 or newer)")
    started = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as log:
        log.write(f"$ {' '.join(['deploy/' + script, *args])}\n")
        log.flush()
        try:
            result = subprocess.run(["bash", str(DEPLOY / script), *args], env={**kubectl_env(kubeconfig),
                                                                                 **(env or {})},
                                    stdout=log, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise InstallError(f"deploy/{script} did not finish within {INSTALL_TIMEOUT_S:.0f} s; "
                               f"see {log_path}") from None
    seconds = time.monotonic() - started
    if result.returncode != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-40:])
        raise InstallError(f"deploy/{script} failed (exit {result.returncode}) after {seconds:.0f} s:\n{tail}")
    say(f"{' '.join(['deploy/' + script, *args])}: done in {seconds:.1f}s")
    return seconds
