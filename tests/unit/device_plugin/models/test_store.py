"""The agent's side of the model store, with fake workers and a fake clock: loading once, the
one-line refusals, freeing after the grace period, a worker that went away, what the store holds on
disk (held.json) and the pods told (ModelLost) when a worker lost their model."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs
import pytest

from device_plugin.agent import with_held_models
from device_plugin.allocation import NodePod
from device_plugin.models import protocol
from device_plugin.models.access import open_model
from device_plugin.models.held_file import HELD_FILE_NAME, HeldFile, SavedModel
from device_plugin.models.store import (
    REASON_MODEL_LOST,
    ModelStore,
    ModelUnavailable,
    WorkerGone,
)
from fastgshare import keys
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.model import HeldModel, ModelSpec
from tests.unit.device_plugin.models.helpers import GPU_A, GPU_B, NODE, SPEC, model_pod


class FakeWorkers:
    """Workers as dictionaries: what each GPU holds, handles numbered by load."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, dict[str, object]]] = {}  # gpu -> identity -> list entry
        self.calls: list[tuple[str, str]] = []
        self.started: list[str] = []
        self.loads = 0

    def call(self, gpu: str, request: Mapping[str, object], timeout_s: float) -> dict[str, object]:
        self.calls.append((gpu, str(request["op"])))
        if gpu not in self.held:
            raise WorkerGone(f"no worker for {gpu}")
        parsed = protocol.parse_worker_request(dict(request))
        models = self.held[gpu]
        if isinstance(parsed, protocol.ListRequest):
            return {"ok": True, "pid": 100, "models": list(models.values())}
        if isinstance(parsed, protocol.FreeRequest):
            models.pop(parsed.identity, None)
            return {"ok": True}
        if parsed.identity not in models:
            self.loads += 1
            models[parsed.identity] = {"identity": parsed.identity, "key": parsed.key, "bytes": parsed.bytes,
                                       "handle": f"{self.loads:0128x}"}
        entry = models[parsed.identity]
        return {"ok": True, "handle": entry["handle"], "bytes": entry["bytes"]}

    def start(self, gpu: str) -> None:
        self.started.append(gpu)
        self.held.setdefault(gpu, {})

    def reap(self) -> None:
        pass


class FakePods:
    def __init__(self, *pods: NodePod) -> None:
        self.pods = {pod.uid: pod for pod in pods}

    def snapshot(self) -> tuple[int, list[NodePod]]:
        return 0, list(self.pods.values())


@attrs.define
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


OTHER = ModelSpec(name="bert", bytes=4096, path="bert/weights.bin")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    for spec in (SPEC, OTHER):
        (tmp_path / spec.path).parent.mkdir()
        (tmp_path / spec.path).write_bytes(b"w" * spec.bytes)
    return tmp_path


def make_store(model_dir: Path, pods: FakePods, workers: FakeWorkers, clock: Clock) -> ModelStore:
    return ModelStore(node_name=NODE, model_dir=model_dir, gpus=(GPU_A, GPU_B), pods=pods, workers=workers,
                      grace_s=300, clock=clock)


def test_pods_of_one_function_on_one_gpu_share_one_load(model_dir: Path) -> None:
    a, b, c = model_pod("a"), model_pod("b"), model_pod("c", GPU_B)
    workers, pods = FakeWorkers(), FakePods(a, b, c)
    store = make_store(model_dir, pods, workers, Clock())
    first, second, third = store.acquire(a), store.acquire(b), store.acquire(c)
    assert first == second
    assert (first.bytes, first.key) == (SPEC.bytes, "team-a/fn/resnet")
    assert third.handle != first.handle, "another GPU, another copy"
    assert workers.started == [GPU_A, GPU_B], "a worker started on first need"
    assert workers.loads == 2
    held = store.held_models()
    assert held[GPU_A] == (HeldModel(identity=held[GPU_A][0].identity, key="team-a/fn/resnet", bytes=SPEC.bytes),)
    store.sweep()
    assert store.model_pods() == {(GPU_A, "team-a/fn/resnet"): 2, (GPU_B, "team-a/fn/resnet"): 1}


def test_an_unneeded_model_is_freed_after_the_grace_period(model_dir: Path) -> None:
    a = model_pod("a")
    workers, pods, clock = FakeWorkers(), FakePods(a), Clock()
    store = make_store(model_dir, pods, workers, clock)
    store.acquire(a)
    revision = store.revision()
    store.sweep()
    assert store.held_models()[GPU_A], "needed"
    pods.pods["uid-a"] = attrs.evolve(a, deleting=True)
    store.sweep()  # unneeded from now on
    clock.now += 299
    store.sweep()
    assert store.held_models()[GPU_A], "in its grace period: still held (and charged)"
    assert store.model_pods() == {(GPU_A, "team-a/fn/resnet"): 0}
    assert ("GPU-aaaa", "free") not in workers.calls
    clock.now += 1
    store.sweep()
    assert store.held_models() == {}
    assert workers.held[GPU_A] == {}, "the worker was told to free it"
    assert store.revision() != revision


def test_a_pod_coming_back_within_the_grace_period_keeps_the_model(model_dir: Path) -> None:
    a = model_pod("a")
    workers, pods, clock = FakeWorkers(), FakePods(a), Clock()
    store = make_store(model_dir, pods, workers, clock)
    handle = store.acquire(a).handle
    del pods.pods["uid-a"]
    store.sweep()
    clock.now += 200
    b = model_pod("b")
    pods.pods["uid-b"] = b
    assert store.acquire(b).handle == handle, "reused, not reloaded"
    clock.now += 200
    store.sweep()
    assert store.held_models()[GPU_A]
    assert workers.loads == 1


def test_a_store_that_has_not_read_the_pods_frees_nothing(model_dir: Path) -> None:
    workers, clock = FakeWorkers(), Clock()
    workers.start(GPU_A)
    workers.held[GPU_A]["i"] = {"identity": "i", "key": "x/y/z", "bytes": 5, "handle": "ab" * 64}
    synced = False
    store = ModelStore(node_name=NODE, model_dir=model_dir, gpus=(GPU_A,), pods=FakePods(), workers=workers,
                       grace_s=0, clock=clock, synced=lambda: synced, sweep_s=3600)
    store.start()  # adopts what the running worker holds
    try:
        assert store.held_models() == {GPU_A: (HeldModel(identity="i", key="x/y/z", bytes=5),)}
        store.sweep()
        assert store.held_models(), "pods not listed yet: nothing is unneeded"
        synced = True
        store.sweep()
        assert store.held_models() == {}
    finally:
        store.stop()


def test_a_worker_that_went_away_is_forgotten_and_the_next_acquire_reloads(model_dir: Path) -> None:
    a = model_pod("a")
    workers, pods = FakeWorkers(), FakePods(a)
    store = make_store(model_dir, pods, workers, Clock())
    first = store.acquire(a).handle
    del workers.held[GPU_A]  # crashed
    store.sweep()
    assert store.held_models() == {}
    second = store.acquire(a).handle
    assert second != first
    assert workers.started == [GPU_A, GPU_A]


@pytest.mark.parametrize(("pod", "says"), [
    (model_pod("plain", spec=None), "pod team-a/plain declares no model: it has no fastgshare/model annotation"),
    (model_pod("waiting", gpu=None), "pod team-a/waiting is not assigned to a GPU of node gpu-node-1 yet"),
    (model_pod("gone", deleting=True), "is finished or being deleted"),
    (model_pod("far", gpu="GPU-elsewhere"), "GPU-elsewhere, which is not one of node gpu-node-1's GPUs"),
])
def test_refusals_are_one_line_saying_what_to_fix(model_dir: Path, pod: NodePod, says: str) -> None:
    store = make_store(model_dir, FakePods(pod), FakeWorkers(), Clock())
    with pytest.raises(ModelUnavailable) as caught:
        store.acquire(pod)
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_malformed_annotation_is_named(model_dir: Path) -> None:
    pod = model_pod("bad")
    pod = attrs.evolve(pod, annotations={**pod.annotations, keys.MODEL_ANNOTATION: '{"function": "fn"}'})
    with pytest.raises(ModelUnavailable, match=r"pod team-a/bad: annotation fastgshare/model\.name"):
        make_store(model_dir, FakePods(pod), FakeWorkers(), Clock()).acquire(pod)


def test_a_missing_or_wrong_sized_file_is_named_with_its_path(model_dir: Path) -> None:
    pod = model_pod("a")
    store = make_store(model_dir, FakePods(pod), FakeWorkers(), Clock())
    path = model_dir / SPEC.path
    path.write_bytes(b"short")
    with pytest.raises(ModelUnavailable, match=f"its file {path} has 5 bytes but spec.model.bytes says {SPEC.bytes}"):
        store.acquire(pod)
    path.unlink()
    with pytest.raises(ModelUnavailable) as caught:
        store.acquire(pod)
    assert f"its file {path} is missing: put the weights there on node {NODE}" in str(caught.value)
    assert f"--model-dir {model_dir}" in str(caught.value)


def test_a_pod_gets_only_its_own_functions_model(model_dir: Path) -> None:
    pod = model_pod("a")
    store = make_store(model_dir, FakePods(pod), FakeWorkers(), Clock())
    refused = open_model(pod, protocol.OpenRequest("bert"), store)
    assert refused["ok"] is False
    assert refused["error"] == ("pod team-a/a may open only its own function's model 'resnet' (annotation "
                                "fastgshare/model), not 'bert': ask for 'resnet' or for \"\" (the pod's own)")
    for name in ("", "resnet"):
        answer = open_model(pod, protocol.OpenRequest(name), store)
        assert answer["ok"] is True
        assert (answer["bytes"], answer["model"]) == (SPEC.bytes, "team-a/fn/resnet")
    plain = model_pod("plain", spec=None)
    assert "no fastgshare/model annotation" in str(open_model(plain, protocol.OpenRequest(""), store)["error"])


def test_the_inventory_carries_each_gpus_held_models_sorted() -> None:
    gpus = (GpuDevice(uuid=GPU_A, index=0, model="m", memory_bytes=1 << 30, sm_count=80),
            GpuDevice(uuid=GPU_B, index=1, model="m", memory_bytes=1 << 30, sm_count=80))
    inventory = NodeInventory(node_name=NODE, gpus=gpus)
    one, two = HeldModel(identity="b", key="k/b/x", bytes=2), HeldModel(identity="a", key="k/a/x", bytes=1)
    published = with_held_models(inventory, {GPU_A: (one, two)})
    assert published.gpus[0].held_models == (two, one)
    assert published.gpus[1].held_models == ()
    assert with_held_models(inventory, {GPU_A: (two, one)}) == published, "the same holdings, the same text"


# --- what the store holds, on disk, and telling the pods of a lost model -----------------------------

class Warnings:
    """The ``warn`` callback: (pod key, reason, message) in the order said."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str, str]] = []

    def __call__(self, pod: NodePod, reason: str, message: str) -> None:
        self.said.append((pod.key, reason, message))

    def pods(self) -> list[str]:
        return [pod for pod, _reason, _message in self.said]



def held_store(model_dir: Path, pods: FakePods, workers: FakeWorkers, *, warn: Warnings | None = None,
               synced: Callable[[], bool] = lambda: True) -> ModelStore:
    return ModelStore(node_name=NODE, model_dir=model_dir, gpus=(GPU_A, GPU_B), pods=pods, workers=workers,
                      grace_s=300, clock=Clock(), synced=synced, sweep_s=3600,
                      held_file=model_dir / "store" / HELD_FILE_NAME, warn=warn)


def test_what_the_store_holds_is_written_and_read_back(model_dir: Path) -> None:
    a, b = model_pod("a"), model_pod("b", GPU_B)
    pods, workers = FakePods(a, b), FakeWorkers()
    store = held_store(model_dir, pods, workers)
    store.acquire(a)
    store.acquire(b)
    path = model_dir / "store" / HELD_FILE_NAME
    held, lost = HeldFile(path).load()
    assert held == [SavedModel(gpu, model) for gpu, models in sorted(store.held_models().items()) for model in models]
    assert [saved.gpu for saved in held] == [GPU_A, GPU_B]
    assert lost == []
    assert json.loads(path.read_text())["models"][0] == {"gpu": GPU_A, "identity": held[0].model.identity,
                                                          "key": "team-a/fn/resnet", "bytes": SPEC.bytes}
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in path.parent.iterdir()] == [HELD_FILE_NAME], "no temporary file left behind"
    del pods.pods["uid-b"]
    workers.held[GPU_B].clear()  # freed by hand: the store sees it on its next look
    store.sweep()
    assert [saved.gpu for saved in HeldFile(path).load()[0]] == [GPU_A], "rewritten when what is held changes"


def restarted(model_dir: Path, pods: FakePods, warn: Warnings | None, synced: Callable[[], bool] = lambda: True,
              ) -> tuple[ModelStore, FakeWorkers]:
    """A store that held resnet on GPU A and bert on GPU B, and a new one after both workers died with it."""
    first_workers = FakeWorkers()
    first = held_store(model_dir, FakePods(model_pod("x"), model_pod("y", GPU_B, spec=OTHER)), first_workers)
    first.acquire(model_pod("x"))
    first.acquire(model_pod("y", GPU_B, spec=OTHER))
    workers = FakeWorkers()  # no worker answers: they ended with the agent's container
    return held_store(model_dir, pods, workers, warn=warn, synced=synced), workers


def test_a_restarted_store_whose_workers_died_tells_the_pods_that_declared_the_lost_model_once(
        model_dir: Path) -> None:
    affected, same_on_b = model_pod("a"), model_pod("b", GPU_B)
    other_model, plain = model_pod("c", spec=OTHER), model_pod("d", spec=None)
    elsewhere = model_pod("e", node="gpu-node-2")
    leaving = model_pod("f", deleting=True)
    bert_on_b = model_pod("g", GPU_B, spec=OTHER)
    pods, warn = FakePods(affected, same_on_b, other_model, plain, elsewhere, leaving, bert_on_b), Warnings()
    synced = False
    store, _workers = restarted(model_dir, pods, warn, lambda: synced)
    store.start()
    try:
        assert store.held_models() == {}
        store.sweep()
        assert warn.said == [], "not before the pod records are synced"
        synced = True
        store.sweep()
        assert sorted(warn.pods()) == ["team-a/a", "team-a/g"], \
            "resnet's pods on GPU A and bert's on GPU B; not another model's, another GPU's, another node's"
        _pod, reason, message = warn.said[warn.pods().index("team-a/a")]
        assert reason == REASON_MODEL_LOST == "ModelLost"
        assert message.startswith(f"the model store of node {NODE} lost model team-a/fn/resnet on GPU {GPU_A} "
                                  "(its worker exited while no node agent ran")
        assert message.endswith("delete the pod, its FaSTPod makes a new one that maps a fresh copy")
        assert "\n" not in message
        store.sweep()
        assert len(warn.said) == 2, "once"
        assert HeldFile(model_dir / "store" / HELD_FILE_NAME).load() == ([], []), "nothing held, nothing to tell"
    finally:
        store.stop()


def test_a_loss_not_told_yet_survives_another_restart(model_dir: Path) -> None:
    pods, warn = FakePods(model_pod("a")), Warnings()
    store, workers = restarted(model_dir, pods, warn, lambda: False)
    store.start()  # the agent ends again before its pods are synced
    store.stop()
    again = held_store(model_dir, pods, workers, warn=warn)
    again.start()
    try:
        again.sweep()
        assert warn.pods() == ["team-a/a"]
    finally:
        again.stop()


def test_a_worker_found_gone_while_the_agent_runs_tells_its_pods(model_dir: Path) -> None:
    a, b = model_pod("a"), model_pod("b")
    pods, workers, warn = FakePods(a, b), FakeWorkers(), Warnings()
    store = held_store(model_dir, pods, workers, warn=warn)
    store.acquire(a)
    store.sweep()
    assert warn.said == []
    del workers.held[GPU_A]  # crashed
    store.sweep()
    assert sorted(warn.pods()) == ["team-a/a", "team-a/b"]
    assert "its worker is gone" in warn.said[0][2]
    store.sweep()
    assert len(warn.said) == 2


def test_a_pod_handed_a_fresh_copy_after_the_loss_is_not_told(model_dir: Path) -> None:
    a = model_pod("a")
    pods, workers, warn = FakePods(a), FakeWorkers(), Warnings()
    store = held_store(model_dir, pods, workers, warn=warn)
    store.acquire(a)
    del workers.held[GPU_A]  # the worker died
    b = model_pod("b")
    pods.pods["uid-b"] = b
    store.acquire(b)  # finds the worker gone, starts a new one, loads again
    store.sweep()
    assert warn.pods() == ["team-a/a"]


def test_without_warn_simulated_gpus_nobody_is_told(model_dir: Path) -> None:
    store, _workers = restarted(model_dir, FakePods(model_pod("a")), None)
    assert HeldFile(model_dir / "store" / HELD_FILE_NAME).load()[0], "the first store's models are on disk"
    store.start()
    try:
        store.sweep()
        assert HeldFile(model_dir / "store" / HELD_FILE_NAME).load() == ([], []), "no loss kept to tell"
    finally:
        store.stop()


@pytest.mark.parametrize("text", ["{not json", '{"version": 1, "models": [{"gpu": "GPU-aaaa"}]}',
                                  '{"version": 9, "models": []}', "[]",
                                  '{"version": 1, "models": [{"gpu": "GPU-aaaa", "identity": "i", "key": "k", '
                                  '"bytes": true}]}'])
def test_a_damaged_file_is_ignored_with_one_log_line(model_dir: Path, text: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    path = model_dir / "store" / HELD_FILE_NAME
    path.parent.mkdir()
    path.write_text(text)
    warn = Warnings()
    pods = FakePods(model_pod("a"))
    store = held_store(model_dir, pods, FakeWorkers(), warn=warn)
    with caplog.at_level(logging.ERROR, logger="device_plugin.models.store"):
        store.start()
    try:
        store.sweep()
        assert warn.said == []
        said = [record.getMessage() for record in caplog.records]
        assert len(said) == 1
        assert said[0].startswith(f"model store file {path} is damaged (")
        store.acquire(pods.pods["uid-a"])
        assert [saved.gpu for saved in HeldFile(path).load()[0]] == [GPU_A], "replaced on the next change"
    finally:
        store.stop()
