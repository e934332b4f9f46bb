"""What PyTorch sees of a pod's GPU memory limit, the program that ``fastgshare run --memory``
runs under the hook on the GPU day (part c of ``bench/gpu/run.py``). It imports nothing of
fastgshare: it is any user's program.

    python3 torch_memory.py --limit-bytes N [--chunk-mib M] [--out FILE]
    python3 torch_memory.py --check --limit-bytes N

It reads ``torch.cuda.mem_get_info()`` and asks ``nvidia-smi`` (a child process: it inherits the
hook through ``LD_PRELOAD``) for the memory total, then allocates ``--chunk-mib`` tensors until an
allocation fails (or it holds the limit plus two chunks: then the limit was not enforced), and
records the error's type (``torch.cuda.OutOfMemoryError`` expected) and how much it held. Prints (and
writes to ``--out``) one JSON object. ``--check`` checks the arguments and whether torch imports.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MIB = 1 << 20


def nvidia_smi_memory() -> dict[str, object]:
    """nvidia-smi's memory.total/used/free of GPU 0, MiB."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.used,memory.free",
                               "--format=csv,noheader,nounits", "--id=0"], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return {"error": str(error)}
    try:
        total, used, free = (int(field.strip()) for field in done.stdout.strip().splitlines()[0].split(","))
    except (ValueError, IndexError):
        return {"error": f"exit {done.returncode}: {(done.stdout + done.stderr).strip()[-300:]}"}
    return {"total_mib": total, "used_mib": used, "free_mib": free}


def mem_get_info(torch: Any) -> dict[str, int]:
    free, total = torch.cuda.mem_get_info()
    return {"free": int(free), "total": int(total)}


def allocate_until_refused(torch: Any, limit_bytes: int, chunk_bytes: int) -> tuple[dict[str, object], list[Any]]:
    held: list[Any] = []
    allocated = 0
    while allocated <= limit_bytes + 2 * chunk_bytes:
        try:
            held.append(torch.empty(chunk_bytes, dtype=torch.uint8, device="cuda"))
        except Exception as error:  # which exception it is, is the finding
            return {"raised": True, "allocated_before_bytes": allocated,
                    "error_type": f"{type(error).__module__}.{type(error).__qualname__}",
                    "is_torch_oom": isinstance(error, torch.cuda.OutOfMemoryError),
                    "message": str(error).strip().splitlines()[0][:300] if str(error).strip() else ""}, held
        allocated += chunk_bytes
    return {"raised": False, "allocated_before_bytes": allocated,
            "error_type": None, "is_torch_oom": False, "message": "no allocation was refused"}, held


def measure(args: argparse.Namespace) -> dict[str, object]:
    torch = importlib.import_module("torch")
    result: dict[str, object] = {"torch": torch.__version__, "limit_bytes": args.limit_bytes,
                                 "mem_get_info": mem_get_info(torch), "nvidia_smi": nvidia_smi_memory()}
    oom, held = allocate_until_refused(torch, args.limit_bytes, args.chunk_mib * MIB)
    result["oom"] = oom
    result["mem_get_info_holding"] = mem_get_info(torch)
    result["memory_reserved_bytes"] = int(torch.cuda.memory_reserved())
    held.clear()
    torch.cuda.empty_cache()
    result["mem_get_info_after_release"] = mem_get_info(torch)
    return result


def check(args: argparse.Namespace) -> dict[str, object]:
    verdict: dict[str, object] = {"check": "ok", "limit_bytes": args.limit_bytes, "chunk_mib": args.chunk_mib}
    try:
        verdict["torch"] = importlib.import_module("torch").__version__
    except Exception as error:  # any import failure is "torch is not importable"
        verdict["torch"] = f"not importable here ({type(error).__name__}: {error})"
    return verdict


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit-bytes", type=int, default=4 << 30, help="the pod's limit (default: 4 GiB)")
    parser.add_argument("--chunk-mib", type=int, default=256)
    parser.add_argument("--out", type=Path, help="also write the JSON object here")
    parser.add_argument("--check", action="store_true", help="check the arguments and torch, then exit")
    args = parser.parse_args(argv)
    if args.limit_bytes <= 0 or args.chunk_mib <= 0:
        parser.error(f"--limit-bytes and --chunk-mib must be > 0 (got {args.limit_bytes}, {args.chunk_mib})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = check(args) if args.check else measure(args)
    text = json.dumps(result)
    if args.out is not None:
        args.out.write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
