"""Pod records that declare a model, for the model store's tests."""

from __future__ import annotations

import attrs

from device_plugin.allocation import NodePod
from fastgshare import keys
from fastgshare.model import ModelSpec, model_annotation
from tests.builders_k8s import assignment, pod_record

NODE = "gpu-node-1"
GPU_A, GPU_B = "GPU-aaaa", "GPU-bbbb"
SPEC = ModelSpec(name="resnet", bytes=4096 + 17, path="resnet/weights.bin")


def model_pod(name: str, gpu: str | None = GPU_A, *, spec: ModelSpec | None = SPEC, function: str = "fn",
              node: str = NODE, namespace: str = "team-a", **changes: object) -> NodePod:
    """A pod on ``node`` assigned ``gpu`` (None: unassigned) that declares ``spec`` of ``function``."""
    record = pod_record(name, node, namespace=namespace,
                        assigned=assignment(node, gpu) if gpu is not None else None)
    annotations = dict(record.annotations)
    if spec is not None:
        annotations[keys.MODEL_ANNOTATION] = model_annotation(function, spec)
    return attrs.evolve(record, annotations=annotations, **changes)  # type: ignore[arg-type]
