"""What is committed on each GPU, and whether one more pod fits.

A :class:`GpuLedger` holds the pods placed on one GPU with their shares and keeps three
budgets: pod slots, memory bytes, and the 2-D time x SM bin (see :mod:`fastgshare.packing`).
Each pod's memory is its ``gpu_mem`` plus the GPU's CUDA context reserve
(:attr:`fastgshare.inventory.GpuDevice.context_reserve_bytes`): what its context holds outside
the allocations ``gpu_mem`` limits. A pod may declare its function's model
(:class:`fastgshare.model.ModelRef`): the node's model store holds its weights once per GPU, so
the ledger charges each distinct model (by :attr:`~fastgshare.model.ModelRef.identity`) once,
while any pod of it is on the GPU or the store still holds it
(:attr:`~fastgshare.inventory.GpuDevice.held_models`, also in its grace period): a pod whose
model is already on the GPU needs only its ``gpu_mem`` and reserve, the first one brings the
model's bytes too. Best-effort pods (request 0) take only a slot and memory. On
a GPU without MPS, pods cannot run concurrently, so every rectangle is the full SM height: their
requests must sum to <= 1.

Adding a pod first tries to place it in the current free space, keeping every other pod's
position; when that fails it re-packs all rectangles from scratch in a few deterministic
orders ("keep-restructure"). Removing a pod keeps the others' positions.

Checking is fast: each ledger keeps its budgets as running sums and its layout as an interned
id (:attr:`GpuLedger.layout_id`, updated on every change), and whether a ``width x height``
rectangle fits a layout is a pure function of the layout's rectangles (the maximal free
rectangles of a set of placed rectangles do not depend on their order, and the re-pack sees
only their sizes), remembered process-wide per ``(layout id, width, height)``. So a check is a
few comparisons and one dictionary lookup; the packer runs only for a layout and size never
judged before. :attr:`GpuLedger.summary_id` interns everything a check or a placement score
reads (the GPU's static fields but its uuid, the budgets, the layout), so callers can share
answers between GPUs in the same state.

:class:`NodeState` is the ledgers of one node's GPUs, built from its inventory.
"""

from __future__ import annotations

import enum
import functools
import itertools
from collections.abc import Callable, Hashable, Mapping

import attrs

from fastgshare import keys
from fastgshare.errors import LedgerError
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.model import HeldModel, ModelRef
from fastgshare.packing import BIN, MaxRectsBin, Rect, pack
from fastgshare.quantity import format_bytes
from fastgshare.share import ShareSpec, format_fraction


class Rejection(enum.Enum):
    """Why a GPU cannot take a pod, most fundamental first."""

    UNHEALTHY = "unhealthy"
    NO_SLOT = "no-slot"
    MEMORY = "memory"
    COMPUTE = "compute"


@attrs.frozen(kw_only=True)
class ModelUsage:
    """One model charged on a GPU: its bytes (once), the pods of it there, whether the store holds it."""

    key: str  # ModelRef.key: namespace/function/name
    identity: str  # ModelRef.identity
    bytes: int
    pods: int
    held: bool  # published by the node's store (GpuDevice.held_models)


@attrs.frozen
class Fit:
    """The answer to "would this pod fit": ``rejection is None`` means yes."""

    rejection: Rejection | None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.rejection is None


FITS = Fit(None)

_Ordering = Callable[[tuple[str, Rect]], tuple[int | str, ...]]
_REPACK_ORDERS: tuple[_Ordering, ...] = (
    lambda item: (-item[1].area, -item[1].height, -item[1].width, item[0]),
    lambda item: (-item[1].height, -item[1].width, item[0]),
    lambda item: (-item[1].width, -item[1].height, item[0]),
)


_LayoutKey = tuple[tuple[int, int, int, int], ...]
INTERN_LIMIT = 200_000  # entries per process-wide table; a full table starts over (ids stay unique)


class _Interner:
    """Small unique ints for hashable keys; an id is never reused, even after the table is cleared."""

    def __init__(self, limit: int = INTERN_LIMIT) -> None:
        self._ids: dict[Hashable, int] = {}
        self._next = itertools.count(1)
        self._limit = limit

    def __call__(self, key: Hashable) -> int:
        found = self._ids.get(key)
        if found is None:
            if len(self._ids) >= self._limit:
                self._ids.clear()
            found = self._ids.setdefault(key, next(self._next))
        return found


intern_key = _Interner()  # shared by ledgers and their callers (node signatures)
_EMPTY_LAYOUT_ID = intern_key(("layout", ()))
# Whether a (width, height) rectangle can be placed on a layout, by (layout id, width, height).
_FIT_MEMO: dict[tuple[int, int, int], bool] = {}


@functools.lru_cache(maxsize=4096)
def model_identity(model: ModelRef) -> str:
    """``model.identity``, remembered (it is JSON made on every call; checks ask for it on every GPU)."""
    return model.identity


def _remember_fit(key: tuple[int, int, int], fits: bool) -> None:
    if len(_FIT_MEMO) >= INTERN_LIMIT:
        _FIT_MEMO.clear()
    _FIT_MEMO[key] = fits


class GpuLedger:
    """The pods on one GPU and their slots, memory and time x SM rectangles."""

    def __init__(self, gpu: GpuDevice, slots: int = keys.DEFAULT_SLOTS_PER_GPU) -> None:
        if slots < 1:
            raise LedgerError(f"slots must be >= 1, got {slots}")
        self.gpu = gpu
        self.slots = slots
        self._pods: dict[str, ShareSpec] = {}
        self._models: dict[str, ModelRef] = {}  # pod key -> the model it declares (pods without one: absent)
        self._model_pods: dict[str, int] = {}  # model identity -> pods of it on this GPU (> 0)
        self._model_refs: dict[str, ModelRef] = {}  # model identity -> the model, while a pod of it is here
        self._held: dict[str, HeldModel] = {model.identity: model for model in gpu.held_models}
        self._model_memory = sum(model.bytes for model in self._held.values())  # each model charged once
        self._layout: dict[str, Rect] = {}
        self._overcommitted = False
        self._used_memory = 0
        self._used_area = 0
        self._layout_id = _EMPTY_LAYOUT_ID
        self._summary_id = 0  # 0: not computed since the last change

    # --- reading ---------------------------------------------------------------------
    @property
    def pods(self) -> Mapping[str, ShareSpec]:
        return dict(self._pods)

    @property
    def layout(self) -> Mapping[str, Rect]:
        """Where each pod with guaranteed time sits in the 1000 x 100 bin."""
        return dict(self._layout)

    @property
    def overcommitted(self) -> bool:
        """True if pods were recorded with ``force`` whose rectangles could not be packed."""
        return self._overcommitted

    @property
    def used_memory(self) -> int:
        """The pods' ``gpu_mem``, summed (their context reserves and models not included)."""
        return self._used_memory

    @property
    def model_memory(self) -> int:
        """The models on the GPU, each counted once: those its pods declare and those its store holds."""
        return self._model_memory

    @property
    def pod_models(self) -> Mapping[str, ModelRef]:
        """The model each pod declares, by pod key (pods without one are left out)."""
        return dict(self._models)

    @property
    def models(self) -> tuple[ModelUsage, ...]:
        """Every model charged on the GPU, by key: its bytes, its pods here, whether the store holds it."""
        usages = [ModelUsage(key=model.key, identity=identity, bytes=model.bytes,
                             pods=self._model_pods[identity], held=identity in self._held)
                  for identity, model in self._model_refs.items()]
        usages += [ModelUsage(key=held.key, identity=identity, bytes=held.bytes, pods=0, held=True)
                   for identity, held in self._held.items() if identity not in self._model_pods]
        return tuple(sorted(usages, key=lambda usage: (usage.key, usage.identity)))

    def holds_model(self, model: ModelRef | None) -> bool:
        """Whether ``model`` is already charged here (a pod of it is on the GPU, or the store holds it)."""
        if model is None:
            return False
        identity = model_identity(model)
        return identity in self._model_pods or identity in self._held

    def model_charge(self, model: ModelRef | None) -> int:
        """What one more pod of ``model`` adds for the model itself: its bytes, 0 if already charged here."""
        return 0 if model is None or self.holds_model(model) else model.bytes

    @property
    def reserved_memory(self) -> int:
        """The context reserves of the pods on the GPU: one per pod."""
        return self.gpu.context_reserve_bytes * len(self._pods)

    @property
    def committed_memory(self) -> int:
        """The pods' ``gpu_mem``, their context reserves and the models (each once)."""
        return self._used_memory + self.reserved_memory + self._model_memory

    @property
    def free_memory(self) -> int:
        """What one more pod's ``gpu_mem``, context reserve and model (if not here yet) must fit in
        (negative if over-committed)."""
        return self.gpu.memory_bytes - self.committed_memory

    def memory_charge(self, share: ShareSpec, model: ModelRef | None = None) -> int:
        """What a pod with ``share`` (of ``model``) adds to this GPU's memory: its ``gpu_mem``, one
        context reserve, and the model's bytes unless the model is already on the GPU."""
        return share.memory_bytes + self.gpu.context_reserve_bytes + self.model_charge(model)

    @property
    def free_slots(self) -> int:
        return self.slots - len(self._pods)

    @property
    def used_area(self) -> int:
        return self._used_area

    @property
    def layout_id(self) -> int:
        """An id of the set of rectangles placed (equal ids: equal sets); changes with the layout."""
        return self._layout_id

    @property
    def summary_id(self) -> int:
        """An id of everything :meth:`check` and the placement policies read from this ledger
        (all of the GPU but its uuid, the slots, pods, memory, area, layout, the models charged): ledgers with equal
        ids give equal answers, messages included."""
        if not self._summary_id:
            gpu = self.gpu
            self._summary_id = intern_key((
                "gpu", gpu.index, gpu.model, gpu.memory_bytes, gpu.sm_count, gpu.healthy, gpu.mps_enabled,
                gpu.context_reserve_bytes, self.slots, len(self._pods), self._used_memory, self._used_area,
                self._overcommitted, self._layout_id, self._model_memory,
                tuple(sorted(self._model_pods.keys() | self._held.keys()))))
        return self._summary_id

    @property
    def area_fraction(self) -> float:
        """The share of the time x SM bin committed to guaranteed time, 0..1."""
        return self.used_area / BIN.area

    @property
    def memory_fraction(self) -> float:
        """The share of the GPU's memory committed to pods, context reserves included."""
        return self.committed_memory / self.gpu.memory_bytes

    @property
    def is_empty(self) -> bool:
        return not self._pods

    def rectangle_size(self, share: ShareSpec) -> tuple[int, int]:
        """``(width, height)`` of the pod's rectangle on this GPU (full height without MPS)."""
        height = share.sm_percent if self.gpu.mps_enabled else keys.SM_UNITS
        return share.request_permille, height

    # --- deciding --------------------------------------------------------------------
    def check(self, share: ShareSpec, model: ModelRef | None = None) -> Fit:
        """Whether a pod with ``share`` (declaring ``model``) fits now, and if not the most basic reason why."""
        gpu = self.gpu
        if (not gpu.healthy or len(self._pods) >= self.slots
                or self.memory_charge(share, model) > self.free_memory):
            fit, _ = self._evaluate(share, model)  # the refusal and its message
            return fit
        if share.request_permille == 0:  # best effort
            return FITS
        height = share.sm_percent if gpu.mps_enabled else keys.SM_UNITS
        if self._overcommitted or not self._fits_rectangle(share.request_permille, height):
            return Fit(Rejection.COMPUTE, self._compute_message(share))
        return FITS

    def fits(self, share: ShareSpec, model: ModelRef | None = None) -> bool:
        return self.check(share, model).ok

    # --- changing --------------------------------------------------------------------
    def add(self, pod_key: str, share: ShareSpec, *, model: ModelRef | None = None,
            force: bool = False) -> Rect | None:
        """Record a pod (declaring ``model``, if any); return its rectangle (``None`` for best-effort pods).

        Raises :class:`LedgerError` if it does not fit, unless ``force`` is set: a pod the
        cluster already runs is recorded whatever the budgets say, and the ledger then
        reports itself over-committed and refuses pods with guaranteed time.
        """
        if pod_key in self._pods:
            raise LedgerError(f"pod {pod_key} is already on GPU {self.gpu.uuid}")
        fit, layout = self._evaluate(share, model, pod_key)
        if not fit.ok and not force:
            raise LedgerError(f"pod {pod_key} does not fit GPU {self.gpu.uuid}: {fit.message}")
        self._pods[pod_key] = share
        self._used_memory += share.memory_bytes
        if model is not None:
            self._add_model(pod_key, model)
        if not share.is_best_effort:
            width, height = self.rectangle_size(share)
            self._used_area += width * height
        if layout is not None:
            self._set_layout(layout)
        elif not share.is_best_effort:
            self._overcommitted = True
        self._summary_id = 0
        return self._layout.get(pod_key)

    def remove(self, pod_key: str) -> ShareSpec:
        """Forget a pod and free its slot, memory and rectangle; the others stay in place."""
        if pod_key not in self._pods:
            raise LedgerError(f"pod {pod_key} is not on GPU {self.gpu.uuid}")
        share = self._pods.pop(pod_key)
        self._used_memory -= share.memory_bytes
        self._remove_model(pod_key)
        if not share.is_best_effort:
            width, height = self.rectangle_size(share)
            self._used_area -= width * height
        layout = dict(self._layout)
        layout.pop(pod_key, None)
        if self._overcommitted:
            repacked = self._repack(self._compute_pods(), {})
            if repacked is not None:
                layout, self._overcommitted = repacked, False
        self._set_layout(layout)
        self._summary_id = 0
        return share

    def copy(self) -> GpuLedger:
        clone = GpuLedger(self.gpu, self.slots)
        clone._pods = dict(self._pods)
        clone._models = dict(self._models)
        clone._model_pods = dict(self._model_pods)
        clone._model_refs = dict(self._model_refs)
        clone._held = self._held
        clone._model_memory = self._model_memory
        clone._layout = dict(self._layout)
        clone._overcommitted = self._overcommitted
        clone._used_memory = self._used_memory
        clone._used_area = self._used_area
        clone._layout_id = self._layout_id
        clone._summary_id = self._summary_id
        return clone

    # --- internals -------------------------------------------------------------------
    def _add_model(self, pod_key: str, model: ModelRef) -> None:
        identity = model_identity(model)
        if not self.holds_model(model):
            self._model_memory += model.bytes
        self._models[pod_key] = model
        self._model_pods[identity] = self._model_pods.get(identity, 0) + 1
        self._model_refs.setdefault(identity, model)

    def _remove_model(self, pod_key: str) -> None:
        model = self._models.pop(pod_key, None)
        if model is None:
            return
        identity = model_identity(model)
        left = self._model_pods[identity] - 1
        if left:
            self._model_pods[identity] = left
            return
        del self._model_pods[identity]
        del self._model_refs[identity]
        if identity not in self._held:  # the store still holds it: still charged
            self._model_memory -= model.bytes

    def _compute_pods(self) -> dict[str, ShareSpec]:
        return {key: share for key, share in self._pods.items() if not share.is_best_effort}

    def _evaluate(self, share: ShareSpec, model: ModelRef | None = None,
                  pod_key: str = "") -> tuple[Fit, dict[str, Rect] | None]:
        """The fit verdict and, when it fits, the layout with the new pod in it."""
        if not self.gpu.healthy:
            return Fit(Rejection.UNHEALTHY, f"GPU {self.gpu.index} is unhealthy"), None
        if self.free_slots < 1:
            return Fit(Rejection.NO_SLOT, f"GPU {self.gpu.index} has all {self.slots} slots taken"), None
        if self.memory_charge(share, model) > self.free_memory:
            return Fit(Rejection.MEMORY, f"needs {format_bytes(share.memory_bytes)}{self._model_words(model)}"
                       f"{self._reserve_words()}, GPU {self.gpu.index} has {format_bytes(max(self.free_memory, 0))} "
                       "free"), None
        if share.is_best_effort:
            return FITS, dict(self._layout)
        layout = None if self._overcommitted else self._place(self.rectangle_size(share), pod_key)
        if layout is None:
            return Fit(Rejection.COMPUTE, self._compute_message(share)), None
        return FITS, layout

    def _model_words(self, model: ModelRef | None) -> str:
        """`` + model ns/fn/vit 4 GiB (not on this GPU yet)`` when the pod brings its model; else ""."""
        if model is None or self.holds_model(model):
            return ""
        return f" + model {model.key} {format_bytes(model.bytes)} (not on this GPU yet)"

    def _reserve_words(self) -> str:
        reserve = self.gpu.context_reserve_bytes
        return f" + {format_bytes(reserve)} context reserve" if reserve else ""

    def _compute_message(self, share: ShareSpec) -> str:
        time = format_fraction(share.request_permille)
        if self._overcommitted:
            return f"GPU {self.gpu.index} is over-committed by pods it already runs"
        if not self.gpu.mps_enabled:
            return f"GPU {self.gpu.index} (no MPS, pods take turns) has less than {time} of the time free"
        return f"GPU {self.gpu.index} has no {share.sm_percent} percent of its SMs free for {time} of the time"

    def _set_layout(self, layout: dict[str, Rect]) -> None:
        self._layout = layout
        key: _LayoutKey = tuple(sorted((r.x, r.y, r.width, r.height) for r in layout.values()))
        self._layout_id = intern_key(("layout", key)) if key else _EMPTY_LAYOUT_ID

    def _fits_rectangle(self, width: int, height: int) -> bool:
        """Whether a ``width x height`` rectangle can join the layout (not over-committed)."""
        if self._used_area + width * height > BIN.area:
            return False
        key = (self._layout_id, width, height)
        fits = _FIT_MEMO.get(key)
        if fits is None:
            fits = self._pack_with((width, height), "") is not None
            _remember_fit(key, fits)
        return fits

    def _place(self, size: tuple[int, int], pod_key: str) -> dict[str, Rect] | None:
        width, height = size
        if not self._fits_rectangle(width, height):
            return None
        return self._pack_with(size, pod_key)

    def _pack_with(self, size: tuple[int, int], pod_key: str) -> dict[str, Rect] | None:
        """The layout with a ``size`` rectangle added for ``pod_key``: in the free space if it
        fits there, else from a re-pack of every rectangle; None if neither places it."""
        width, height = size
        if self._used_area + width * height > BIN.area:
            return None
        spot = MaxRectsBin(self._layout.values()).insert(width, height)
        if spot is not None:
            return {**self._layout, pod_key: spot}
        return self._repack(self._compute_pods(), {pod_key: Rect(0, 0, width, height)})

    def _repack(self, pods: Mapping[str, ShareSpec], extra: Mapping[str, Rect]) -> dict[str, Rect] | None:
        """Pack every rectangle from scratch, trying each deterministic order in turn."""
        items = [(key, Rect(0, 0, *self.rectangle_size(share))) for key, share in pods.items()]
        items += list(extra.items())
        for order in _REPACK_ORDERS:
            ordered = sorted(items, key=order)
            placed = pack([(rect.width, rect.height) for _, rect in ordered])
            if placed is not None:
                return {key: rect for (key, _), rect in zip(ordered, placed, strict=True)}
        return None


class NodeState:
    """The ledgers of all GPUs of one node, in GPU index order.

    With ``held_models`` False the GPUs are taken without the models their store holds (what the
    node offers once every model's grace period has run out: a refusal then is for good).
    """

    def __init__(self, inventory: NodeInventory, *, held_models: bool = True) -> None:
        self.inventory = inventory
        gpus = sorted(inventory.gpus, key=lambda g: g.index)
        if not held_models:
            gpus = [attrs.evolve(gpu, held_models=()) if gpu.held_models else gpu for gpu in gpus]
        self.ledgers: dict[str, GpuLedger] = {gpu.uuid: GpuLedger(gpu, inventory.slots_per_gpu) for gpu in gpus}

    @property
    def name(self) -> str:
        return self.inventory.node_name

    def ledger(self, uuid: str) -> GpuLedger:
        try:
            return self.ledgers[uuid]
        except KeyError:
            raise LedgerError(f"node {self.name} has no GPU {uuid}") from None

    def find_pod(self, pod_key: str) -> GpuLedger | None:
        """The ledger of the GPU the pod is recorded on, if any."""
        return next((ledger for ledger in self.ledgers.values() if pod_key in ledger.pods), None)

    def copy(self) -> NodeState:
        clone = NodeState(self.inventory)
        clone.ledgers = {uuid: ledger.copy() for uuid, ledger in self.ledgers.items()}
        return clone

    def empty_gpu_count(self) -> int:
        """Healthy GPUs with no pod on them."""
        return sum(1 for ledger in self.ledgers.values() if ledger.is_empty and ledger.gpu.healthy)
