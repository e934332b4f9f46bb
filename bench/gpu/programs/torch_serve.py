"""Batch-1 inference serving with a ResNet-50-shaped network built from ``torch.nn`` (random
weights: nothing is downloaded), the program that ``fastgshare run`` runs under the hook on the GPU
day (part b of ``bench/gpu/run.py``). It imports nothing of fastgshare: it is any user's program.

    python3 torch_serve.py [--seconds S] [--warmup-s W] [--dtype float16|float32] [--out FILE]
                           [--barrier DIR --parties N]
    python3 torch_serve.py --check [...]

A run warms up (cuDNN picks its algorithms) for ``--warmup-s``, waits at the barrier until
``--parties`` processes are ready (a file each in DIR, so that two tenants measure the same
seconds), then serves one image at a time for ``--seconds``: each request is a forward pass and a
``torch.cuda.synchronize()``, timed on the host. Prints (and writes to ``--out``) one JSON object:
images_per_s, p50_ms, p95_ms, requests, ...

``--check`` runs what a CPU can: the arguments, the network's layer plan and its parameter count
(pure Python: 25,557,032, torchvision's resnet50), and, if torch is importable, building the
network on the ``meta`` device and a forward pass of a 1x3x224x224 input there (shape only): a
wrong count or shape fails the check; an exception there is reported (``meta_error``) but does not
fail it (it may be this torch's meta device, not the network: the GPU run will tell).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

RESNET50_PARAMS = 25_557_032
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (planes, blocks, stride of the first)
EXPANSION = 4
CLASSES = 1000
IMAGE = (1, 3, 224, 224)


class Block(NamedTuple):
    """One bottleneck block: 1x1 (inplanes -> planes), 3x3 (stride), 1x1 (-> 4 x planes), and a
    1x1 projection of the shortcut where the shape changes."""

    inplanes: int
    planes: int
    stride: int
    project: bool


def plan() -> list[Block]:
    blocks, inplanes = [], 64
    for planes, count, stride in STAGES:
        for index in range(count):
            first = index == 0
            blocks.append(Block(inplanes, planes, stride if first else 1,
                                first and (stride != 1 or inplanes != planes * EXPANSION)))
            inplanes = planes * EXPANSION
    return blocks


def parameter_count(blocks: Sequence[Block]) -> int:
    """Weights of the convolutions, the batch norms' scale and shift, and the classifier."""
    total = 7 * 7 * 3 * 64 + 2 * 64  # stem
    for b in blocks:
        out = b.planes * EXPANSION
        total += b.inplanes * b.planes + 2 * b.planes + 9 * b.planes * b.planes + 2 * b.planes
        total += b.planes * out + 2 * out
        if b.project:
            total += b.inplanes * out + 2 * out
    return total + blocks[-1].planes * EXPANSION * CLASSES + CLASSES


def build_model(torch: Any) -> Any:
    """The network as torch.nn modules (on the current default device)."""
    nn = torch.nn

    class Bottleneck(nn.Module):  # type: ignore[name-defined]  # nn is torch.nn, typed Any here
        def __init__(self, block: Block) -> None:
            super().__init__()
            out = block.planes * EXPANSION
            self.body = nn.Sequential(
                nn.Conv2d(block.inplanes, block.planes, 1, bias=False), nn.BatchNorm2d(block.planes),
                nn.ReLU(inplace=True),
                nn.Conv2d(block.planes, block.planes, 3, stride=block.stride, padding=1, bias=False),
                nn.BatchNorm2d(block.planes), nn.ReLU(inplace=True),
                nn.Conv2d(block.planes, out, 1, bias=False), nn.BatchNorm2d(out))
            self.shortcut = (nn.Sequential(nn.Conv2d(block.inplanes, out, 1, stride=block.stride, bias=False),
                                           nn.BatchNorm2d(out)) if block.project else nn.Identity())
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x: Any) -> Any:
            return self.relu(self.body(x) + self.shortcut(x))

    blocks = plan()
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, stride=2, padding=1), *(Bottleneck(b) for b in blocks),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(blocks[-1].planes * EXPANSION, CLASSES))


def import_torch() -> tuple[Any, str]:
    try:
        return importlib.import_module("torch"), ""
    except Exception as error:  # any import failure is "torch is not importable"
        return None, f"{type(error).__name__}: {error}"


def check(args: argparse.Namespace) -> dict[str, object]:
    blocks = plan()
    params = parameter_count(blocks)
    verdict: dict[str, object] = {"check": "ok", "blocks": len(blocks), "params": params,
                                  "seconds": args.seconds, "dtype": args.dtype}
    if params != RESNET50_PARAMS:
        return {**verdict, "check": "failed", "error": f"the plan has {params} parameters, ResNet-50 {RESNET50_PARAMS}"}
    torch, why = import_torch()
    if torch is None:
        return {**verdict, "torch": f"not importable here ({why}): the network was not built"}
    verdict["torch"] = torch.__version__
    try:
        with torch.device("meta"):
            model = build_model(torch).eval()
            built = sum(p.numel() for p in model.parameters())
            shape = tuple(model(torch.empty(*IMAGE)).shape)
    except Exception as error:  # a meta-device limit of this torch, not the network's: the GPU run will tell
        return {**verdict, "meta_error": f"{type(error).__name__}: {error}"[:300]}
    verdict.update({"meta_params": built, "meta_output": list(shape)})
    if built != RESNET50_PARAMS or shape != (1, CLASSES):
        return {**verdict, "check": "failed", "error": f"built {built} parameters, output {shape}"}
    return verdict


def wait_at_barrier(barrier: Path | None, parties: int, timeout_s: float = 120) -> float:
    """Say this process is ready and wait for ``parties`` in all; the seconds waited."""
    if barrier is None or parties <= 1:
        return 0.0
    (barrier / f"ready-{os.getpid()}").touch()
    started = time.monotonic()
    while len(list(barrier.glob("ready-*"))) < parties and time.monotonic() - started < timeout_s:
        time.sleep(0.01)
    return round(time.monotonic() - started, 3)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of sorted values."""
    index = min(len(sorted_values) - 1, max(0, int(fraction * len(sorted_values) + 0.999999) - 1))
    return sorted_values[index]


def serve(args: argparse.Namespace) -> dict[str, object]:
    torch, why = import_torch()
    if torch is None:
        raise SystemExit(f"torch_serve.py: torch is not importable: {why}")
    torch.backends.cudnn.benchmark = True
    dtype = getattr(torch, args.dtype)
    model = build_model(torch).to(device="cuda", dtype=dtype).eval()
    image = torch.randn(*IMAGE, device="cuda", dtype=dtype)
    latencies: list[float] = []
    with torch.inference_mode():
        warm_until, warm = time.monotonic() + args.warmup_s, 0
        while time.monotonic() < warm_until or warm < 5:
            model(image)
            torch.cuda.synchronize()
            warm += 1
        waited = wait_at_barrier(args.barrier, args.parties)
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            begin = time.perf_counter()
            model(image)
            torch.cuda.synchronize()
            latencies.append(time.perf_counter() - begin)
        elapsed = time.monotonic() - started
    ordered = sorted(latencies)
    return {"images_per_s": round(len(latencies) / elapsed, 1), "p50_ms": round(percentile(ordered, 0.5) * 1e3, 3),
            "p95_ms": round(percentile(ordered, 0.95) * 1e3, 3), "requests": len(latencies),
            "seconds": round(elapsed, 3), "warmup_requests": warm, "waited_at_barrier_s": waited,
            "dtype": args.dtype, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
            "params": parameter_count(plan())}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured serving time (default: %(default)s)")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--dtype", choices=("float16", "float32"), default="float16")
    parser.add_argument("--out", type=Path, help="also write the JSON object here")
    parser.add_argument("--barrier", type=Path, help="a directory where --parties processes meet before measuring")
    parser.add_argument("--parties", type=int, default=1)
    parser.add_argument("--check", action="store_true", help="check what a CPU can, then exit")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.warmup_s < 0 or args.parties < 1:
        parser.error(f"--seconds must be > 0, --warmup-s >= 0, --parties >= 1 "
                     f"(got {args.seconds}, {args.warmup_s}, {args.parties})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = check(args) if args.check else serve(args)
    text = json.dumps(result)
    if args.out is not None:
        args.out.write_text(text)
    print(text, flush=True)
    return 0 if result.get("check", "ok") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
