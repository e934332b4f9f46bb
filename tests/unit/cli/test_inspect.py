"""``fastgshare inspect``'s view: configured next to achieved, each GPU's free area and memory from
the ledger, pods below their request marked; the node agent's exposition parsed; the table and
JSON forms; each GPU's models (model sharing) on their own rows. (The real-node tier runs the
command against a real cluster.)"""

from __future__ import annotations

import argparse
import io
import json
import re

import attrs
import pytest

from fastgshare.codec import PodAssignment
from fastgshare.inventory import NodeInventory
from fastgshare.model import HeldModel, ModelRef, ModelSpec
from fastgshare_cli.cluster_reader import parse_node_metrics
from fastgshare_cli.inspect_command import inspect_main
from fastgshare_cli.inspection import (
    BELOW_MARK,
    GpuSample,
    NodeFacts,
    NodeSamples,
    PodFacts,
    PodSample,
    build_view,
    render_table,
    to_json,
)
from tests.builders import GiB, make_gpu, make_share
from tests.node_metrics_samples import NODE, node_agent_exposition

INVENTORY = NodeInventory(node_name=NODE, gpus=(make_gpu(0), make_gpu(1)), slots_per_gpu=16)


def pod(name: str, gpu: int, request: int, limit: int, sm: int, mem: int = GiB, namespace: str = "team-a",
        phase: str = "Running") -> PodFacts:
    return PodFacts(namespace=namespace, name=name, phase=phase, assignment=PodAssignment(
        node_name=NODE, gpu_uuid=f"GPU-{gpu:04d}", gpu_index=gpu, share=make_share(request, limit, sm, mem),
        assigned_at_ms=1))


PODS = [pod("resnet-7d9f8-abcde", 0, 300, 500, 50, 2 * GiB), pod("bert-large-5c6d7-fghij", 0, 200, 400, 40),
        pod("gpt2-serving-0", 1, 100, 1000, 100, 4 * GiB, namespace="team-b")]
SAMPLES = {NODE: NodeSamples(
    pods={("team-a/resnet-7d9f8-abcde", "GPU-0000"): PodSample(share=0.41, memory_used_bytes=GiB,
                                                                throttled_seconds_total=1.5,
                                                                wait_seconds_total=0.2, waits=100),
          ("team-a/bert-large-5c6d7-fghij", "GPU-0000"): PodSample(share=0.05, memory_used_bytes=0)},
    gpus={"GPU-0000": GpuSample(busy_share=0.46, healthy=True, memory_allocated_bytes=GiB),
          "GPU-0001": GpuSample(busy_share=0.0, healthy=False, memory_allocated_bytes=0)})}


def view(**kwargs: object) -> list:
    return build_view([NodeFacts(name=NODE, inventory=INVENTORY)], PODS, SAMPLES, **kwargs)  # type: ignore[arg-type]


def test_each_gpu_shows_its_free_area_and_memory_as_the_ledger_counts_them() -> None:
    (node,) = view()
    gpu0, gpu1 = node.gpus
    assert gpu0.free_area == pytest.approx(1 - (0.3 * 0.5 + 0.2 * 0.4))
    assert gpu0.free_memory_bytes == 16 * GiB - 3 * GiB
    assert gpu1.free_area == pytest.approx(0.9)
    assert not gpu1.healthy  # the agent's health wins over the inventory's
    assert [p.name for p in gpu0.pods] == ["bert-large-5c6d7-fghij", "resnet-7d9f8-abcde"]


def test_configured_is_shown_next_to_achieved_and_a_pod_below_its_request_is_marked() -> None:
    (node,) = view()
    bert, resnet = node.gpus[0].pods
    assert (resnet.request, resnet.limit, resnet.achieved, resnet.mean_wait_seconds) == (0.3, 0.5, 0.41, 0.002)
    assert not resnet.below_request
    assert bert.below_request  # 0.05 < 0.2 - 0.03
    assert node.gpus[1].pods[0].achieved is None  # no sample: not measured, not zero
    table = render_table(view())
    assert f"0.05 {BELOW_MARK}" in table
    assert "below its request" in table


def test_a_namespace_narrows_the_pods_but_every_pod_counts_in_the_free_area() -> None:
    (node,) = view(namespace="team-b")
    assert [len(gpu.pods) for gpu in node.gpus] == [0, 1]
    assert [gpu.pod_count for gpu in node.gpus] == [2, 1]
    assert node.gpus[0].free_area == pytest.approx(1 - (0.3 * 0.5 + 0.2 * 0.4))


def test_the_table_fits_120_columns_and_wide_adds_throttling_and_waits() -> None:
    table, wide = render_table(view()), render_table(view(), wide=True)
    assert max(len(line) for line in table.splitlines()) <= 120, table
    pod_header = next(line for line in table.splitlines() if line.startswith("POD "))
    wide_header = next(line for line in wide.splitlines() if line.startswith("POD "))
    assert pod_header.split()[-2:] == ["MEM", "USED"]
    assert wide_header.startswith(pod_header)
    assert wide_header.endswith("PHASE     THROTTLED   MEAN WAIT")
    assert "1.5 s" in wide
    assert "UNHEALTHY" in table
    assert "team-a/resnet-7d9f8-abcde " in table
    one_namespace = render_table(view(namespace="team-a"), qualify=False)  # as kubectl -n: names only
    assert "\nresnet-7d9f8-abcde " in one_namespace


def test_json_lists_every_pod_with_configured_and_achieved() -> None:
    data = to_json(view())
    pods = [p for node in data["nodes"] for gpu in node["gpus"] for p in gpu["pods"]]  # type: ignore[index]
    assert len(pods) == 3
    resnet = next(p for p in pods if p["name"].startswith("resnet"))
    assert resnet["configured"] == {"request": 0.3, "limit": 0.5, "smPercent": 50, "memoryBytes": 2 * GiB}
    assert resnet["achieved"]["share"] == 0.41
    json.dumps(data)


def test_nodes_without_an_inventory_or_metrics_say_why() -> None:
    nodes = [NodeFacts(name="broken", inventory=None, problem="unreadable fastgshare/gpu_info: bad JSON"),
             NodeFacts(name=NODE, inventory=INVENTORY, metrics_error="503 Service Unavailable")]
    table = render_table(build_view(nodes, PODS, {}))
    assert "unreadable fastgshare/gpu_info: bad JSON" in table
    assert "node gpu-node-1: no metrics (503 Service Unavailable)" in table


def test_the_node_agents_own_exposition_parses_into_samples() -> None:
    samples = parse_node_metrics(node_agent_exposition())
    sample = samples.pods[("team-a/resnet-7d9f8-abcde", "GPU-0000")]
    assert (sample.share, sample.memory_used_bytes, sample.throttled_seconds_total, sample.waits) == (
        0.37, GiB, 0.5, 4)
    assert samples.gpus["GPU-0000"] == GpuSample(busy_share=0.4, healthy=True, memory_allocated_bytes=GiB)
    assert samples.gpus["GPU-0001"].healthy is True


def test_a_kubeconfig_that_is_not_there_is_one_line_and_exit_1() -> None:
    err = io.StringIO()
    args = argparse.Namespace(kubeconfig="/nonexistent/kubeconfig", output="table", watch=False, interval=2.0,
                              node=None, namespace=None)
    assert inspect_main(args, io.StringIO(), err) == 1
    assert err.getvalue().count("\n") == 1
    assert "--kubeconfig /nonexistent/kubeconfig: no such file" in err.getvalue()


def test_free_memory_counts_each_pods_context_reserve_and_the_reserve_is_shown() -> None:
    reserve = 300 * 2**20
    inventory = NodeInventory(node_name=NODE, gpus=(attrs.evolve(make_gpu(0), context_reserve_bytes=reserve),
                                                    make_gpu(1)), slots_per_gpu=16)
    built = build_view([NodeFacts(name=NODE, inventory=inventory)], PODS, SAMPLES)
    gpu0, gpu1 = built[0].gpus
    assert gpu0.free_memory_bytes == 16 * GiB - 3 * GiB - 2 * reserve  # two pods on GPU 0
    assert (gpu0.context_reserve_bytes, gpu1.context_reserve_bytes) == (reserve, 0)
    assert [gpu["contextReserveBytes"] for gpu in to_json(built)["nodes"][0]["gpus"]] == [reserve, 0]  # type: ignore[index]
    table = render_table(built)
    header, row0 = (re.split(r" {2,}", line) for line in table.splitlines()[:2])
    assert (header[7:9], row0[7:9]) == (["FREE MEMORY", "CTX RESERVE"], ["12.41 GiB", "300 MiB"])
    assert max(len(line) for line in table.splitlines()) <= 120, table


def test_a_parked_pod_shows_as_parked_and_the_memory_parked_pods_hold_is_said() -> None:
    parked = [pod("resnet-q40-s12-abcde", 1, 0, 0, 12, 2 * GiB), pod("resnet-q40-s12-fghij", 1, 0, 0, 12, 2 * GiB)]
    (node,) = build_view([NodeFacts(name=NODE, inventory=INVENTORY)], [*PODS, *parked], SAMPLES)
    shown = {p.name: p for p in node.gpus[1].pods}
    assert shown["resnet-q40-s12-abcde"].parked
    assert not shown["gpt2-serving-0"].parked
    assert node.gpus[1].free_memory_bytes == 16 * GiB - 4 * GiB - 4 * GiB  # parked pods hold their memory
    assert node.gpus[1].free_area == pytest.approx(0.9)  # and no time x SM area
    table = render_table([node])
    row = next(line for line in table.splitlines() if line.startswith("team-a/resnet-q40-s12-abcde"))
    assert row.split()[3:6] == ["0", "0", "parked"]
    assert "parked: 2 pods with no GPU time (time quota 0/0) hold 4 GiB of GPU memory" in table
    pods = to_json([node])["nodes"][0]["gpus"][1]["pods"]  # type: ignore[index]
    assert {p["name"]: p["parked"] for p in pods} == {"gpt2-serving-0": False, "resnet-q40-s12-abcde": True,
                                                    "resnet-q40-s12-fghij": True}


def test_each_gpu_shows_its_models_on_their_own_rows_and_free_memory_counts_each_once() -> None:
    vit = ModelRef(namespace="team-a", function="vit-fn", spec=ModelSpec(name="vit", bytes=4 * GiB, path="vit.bin"))
    bert = ModelRef(namespace="team-b", function="bert-fn", spec=ModelSpec(name="bert", bytes=2 * GiB, path="b.bin"))
    held = HeldModel(identity=bert.identity, key=bert.key, bytes=bert.bytes)  # no pod left: its grace period
    inventory = NodeInventory(node_name=NODE, gpus=(make_gpu(0), attrs.evolve(make_gpu(1), held_models=(held,))),
                              slots_per_gpu=16)
    pods = [attrs.evolve(pod(f"vit-{i}", 0, 100, 200, 20), model=vit) for i in range(4)]
    (node,) = build_view([NodeFacts(name=NODE, inventory=inventory)], pods, SAMPLES)
    gpu0, gpu1 = node.gpus
    assert gpu0.free_memory_bytes == 16 * GiB - 4 * GiB - 4 * GiB  # four pods' own memory, the model once
    assert gpu1.free_memory_bytes == 16 * GiB - 2 * GiB
    gpus = to_json([node])["nodes"][0]["gpus"]  # type: ignore[index]
    assert gpus[0]["models"] == [{"key": "team-a/vit-fn/vit", "bytes": 4 * GiB, "pods": 4}]
    assert gpus[1]["models"] == [{"key": "team-b/bert-fn/bert", "bytes": 2 * GiB, "pods": 0}]
    table = render_table([node])
    lines = table.splitlines()
    gpu0_row = next(i for i, line in enumerate(lines) if re.match(rf"{NODE} +0 +Tesla", line))
    assert lines[gpu0_row + 1].split() == ["model", "team-a/vit-fn/vit", "4", "GiB", "4", "pods"]
    assert lines[gpu0_row + 1].index("model") == lines[0].index("MODEL")  # from the MODEL column on
    assert lines[gpu0_row + 3].split() == ["model", "team-b/bert-fn/bert", "2", "GiB", "0", "pods"]
    assert "model rows: the weights the node's model store holds once on the GPU above" in table
    assert max(len(line) for line in lines) <= 120, table
    narrowed = build_view([NodeFacts(name=NODE, inventory=inventory)], pods, SAMPLES, namespace="team-b")
    assert narrowed[0].gpus[0].models[0].pods == 4  # every pod counts, as in the free memory


def test_gpus_without_models_show_no_model_rows() -> None:
    table = render_table(view())
    assert "model " not in table
    assert "model rows" not in table
    assert all(gpu["models"] == [] for gpu in to_json(view())["nodes"][0]["gpus"])  # type: ignore[index]
