"""``fastgshare plan``: how many pods of which (quota, SM) configuration serve a demand within the SLO,
from a function's profile (:mod:`fastgshare.autoscaling`). With ``--model-bytes`` (a FaSTFunc's
``spec.model.bytes``) the profile's ``memoryBytes`` are the pods' own memory and the weights are held
once on every GPU the plan uses, as the planner in the function controller counts them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fastgshare.autoscaling import CostModel, GpuBudget, PlanError, options, plan, plan_gpus, plan_memory_bytes
from fastgshare.context_reserve import (
    CONTEXT_RESERVE_HELP,
    InvalidContextReserve,
    parse_context_reserve,
    reserve_of_model,
)
from fastgshare.errors import InvalidInventory
from fastgshare.gpu_models import KNOWN_MODELS, gpu_model_spec
from fastgshare.profile import PERCENTILES, ProfileError, Slo, decode_profile
from fastgshare.quantity import BYTES_HELP, format_bytes, parse_bytes


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "plan", help="pods per (quota, SM) configuration for a demand, from a function's profile",
        description="From a profile (fastgshare profile document, JSON), choose how many pods of which "
                    "configuration serve RPS requests per second within the SLO at near-minimal cost: the most "
                    "efficient configuration fills the demand, the cheapest pods that suffice cover the rest. "
                    "Only configurations that meet the SLO and fit the GPU's memory, with each pod's CUDA context "
                    "reserve, are used.")
    parser.add_argument("--profile", required=True, type=Path, metavar="FILE", help="the profile document")
    parser.add_argument("--rps", required=True, type=float, help="the demand, requests per second")
    parser.add_argument("--cost", choices=[m.value for m in CostModel], default=CostModel.DOMINANT.value,
                        help="a pod's cost: dominant (largest of time x SM area, memory and slot share of the GPU) "
                             "or area (time x SM only) (default: %(default)s)")
    parser.add_argument("--gpu", metavar="MODEL", help=f"the GPU ({', '.join(KNOWN_MODELS)} or a spec like "
                        "16GiB:80sm; default: the profile's gpuModel if it is one of them)")
    parser.add_argument("--context-reserve", default="auto", metavar="QUANTITY",
                        help="GPU memory each pod's CUDA context takes next to its own, as the node agent's flag of "
                             f"that name: {CONTEXT_RESERVE_HELP}; auto plans with the GPU generation's figure, the "
                             "largest one for a GPU spec (default: %(default)s)")
    parser.add_argument("--model-bytes", metavar="QUANTITY",
                        help="model sharing: the function's weights (FaSTFunc spec.model.bytes), held once on every "
                             "GPU its pods use; the profile's memoryBytes are then each pod's own memory, the weights "
                             "not included (default: no model)")
    parser.add_argument("--slo-ms", type=float, help="the SLO latency (default: the profile's)")
    parser.add_argument("--percentile", type=int, choices=PERCENTILES, default=None,
                        help="the SLO's latency percentile (default: the profile's, else 95)")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")


def run_plan(args: argparse.Namespace, console: Console, errors: Console) -> int:
    try:
        text = args.profile.read_text()
    except OSError as error:
        errors.print(f"--profile {args.profile}: cannot be read: {error.strerror}", markup=False, highlight=False)
        return 2
    try:
        profile = decode_profile(text)
        slo = _slo(args, profile.slo)
        gpu_name = args.gpu or profile.gpu_model
        if not gpu_name:
            raise PlanError("the profile names no gpuModel; pass --gpu MODEL")
        gpu = gpu_model_spec(gpu_name)
        asked = parse_context_reserve(args.context_reserve).bytes
        reserve = reserve_of_model(gpu.model) if asked is None else asked
        if reserve >= gpu.memory_bytes:
            raise PlanError(f"--context-reserve {format_bytes(reserve)} is not allowed for {gpu.model} "
                            f"({format_bytes(gpu.memory_bytes)}): the reserve must be less than the GPU's memory")
        weights = _model_bytes(args.model_bytes)
        if weights >= gpu.memory_bytes:
            raise PlanError(f"--model-bytes {format_bytes(weights)} is not allowed for {gpu.model} "
                            f"({format_bytes(gpu.memory_bytes)}): the weights must be less than the GPU's memory")
        budget = GpuBudget(memory_bytes=gpu.memory_bytes, context_reserve_bytes=reserve, model_bytes=weights)
        model = CostModel(args.cost)
        usable = options(profile.points, slo, budget, model)
        if not usable and weights and any(budget.memory_of(p) <= gpu.memory_bytes for p in profile.points):
            raise PlanError(f"no configuration of the profile meets the SLO at any load and fits the GPU's memory "
                            f"next to the model's {format_bytes(weights)} (--model-bytes)")
        if not usable and reserve and any(p.memory_bytes <= gpu.memory_bytes for p in profile.points):
            raise PlanError(f"no configuration of the profile meets the SLO at any load and fits the GPU's memory "
                            f"with a {format_bytes(reserve)} context reserve per pod (--context-reserve)")
        result = plan(args.rps, usable)
    except (ProfileError, PlanError, InvalidInventory, InvalidContextReserve) as error:
        errors.print(f"fastgshare plan: {error}", markup=False, highlight=False)
        return 1
    configs = [{"config": c.option.point.key, "quotaRequest": c.option.point.quota_request,
                "quotaLimit": c.option.point.quota_limit, "smPartition": c.option.point.sm_partition,
                "memoryBytes": c.option.point.memory_bytes, "replicas": c.replicas,
                "sloRps": round(c.option.capacity_rps, 3), "cost": round(c.option.cost, 6)} for c in result.configs]
    if args.output == "json":
        console.print_json(json.dumps({
            "function": profile.function, "demandRps": args.rps, "slo": {"percentile": slo.percentile,
                                                                          "latencyMs": slo.latency_ms},
            "gpu": gpu.model, "contextReserveBytes": reserve, "modelBytes": weights, "costModel": model.value,
            "configs": configs, "capacityRps": round(result.capacity_rps, 3), "cost": round(result.cost, 6),
            "gpus": plan_gpus(result), "memoryBytes": plan_memory_bytes(result, budget)}))
        return 0
    shared = f", a {format_bytes(weights)} model once per GPU" if weights else ""
    table = Table(title=f"{profile.function}: {args.rps:g} req/s within p{slo.percentile} <= {slo.latency_ms:g} ms "
                        f"on {gpu.model} ({model.value} cost, {format_bytes(reserve)} context reserve per pod{shared})")
    for column in ("config", "quota", "SM %", "memory", "pods", "req/s per pod", "capacity", "GPUs (cost)"):
        table.add_column(column, justify="left" if column == "config" else "right")
    for planned in result.configs:
        point, pods = planned.option.point, planned.replicas
        table.add_row(point.key, f"{point.quota_request:g}", str(point.sm_partition), format_bytes(point.memory_bytes),
                      str(pods), f"{planned.option.capacity_rps:.3g}", f"{planned.option.capacity_rps * pods:.4g}",
                      f"{planned.option.cost * pods:.3f}")
    table.add_row("total", "", "", "", str(result.replicas), "", f"{result.capacity_rps:.4g}", f"{result.cost:.3f}")
    console.print(table)
    if weights:
        gpus = plan_gpus(result)
        console.print(f"GPU memory: {format_bytes(plan_memory_bytes(result, budget))} (the pods' own and the model "
                      f"once on each of {gpus} GPU{'' if gpus == 1 else 's'})", markup=False, highlight=False)
    return 0


def _model_bytes(text: str | None) -> int:
    """``--model-bytes``: 0 without it."""
    if text is None:
        return 0
    found = parse_bytes(text)
    if found is None:
        raise PlanError(f"--model-bytes {text!r} is not allowed; allowed: {BYTES_HELP}")
    return found


def _slo(args: argparse.Namespace, from_profile: Slo | None) -> Slo:
    latency = args.slo_ms if args.slo_ms is not None else from_profile.latency_ms if from_profile else None
    if latency is None:
        raise PlanError("the profile has no slo; pass --slo-ms MS (and --percentile)")
    percentile = args.percentile or (from_profile.percentile if from_profile else 95)
    return Slo(percentile=percentile, latency_ms=latency)
