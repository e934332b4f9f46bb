"""Whether what the scaler wants fits the cluster's free GPU space, and what to do when it does not
(the autoscaler's ``FIT``, pure: the caller reads the cluster into :class:`FreeSpace`).

:class:`FreeSpace` is every GPU's ledger, fed with every bound pod's assignment: the same
accounting the extender keeps, so a pod that fits here is one the extender would place, barring a
bind that lands in between.

- :func:`fit_additions`: the pods a scale-up adds, placed one by one (first GPU that takes it, on
  copies of the ledgers). A configuration whose pods do not fit is replaced, for the capacity it
  would have given, by the next configurations in efficiency order that do; when they cannot
  cover all of it, the pods that do not fit are created as planned anyway (they stay Pending with
  the scheduler's reason, and the function says ``Unschedulable``).
- :func:`can_raise_in_place`: whether every pod of a vertical step may have the larger share on the
  GPU it runs on (its own rectangle taken out first, as the extender judges a live share change).

Model sharing: the bound pods are recorded with the model each declares, and the GPUs with the
models their store holds (the inventory's ``heldModels``), so each model is charged once per GPU as
the extender charges it; a new pod of a function with a model (``model``) needs the model's bytes
only on a GPU that does not hold it yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from fastgshare.autoscaling import EPSILON_RPS, Option
from fastgshare.codec import PodAssignment
from fastgshare.inventory import NodeInventory
from fastgshare.ledger import GpuLedger, NodeState
from fastgshare.model import ModelRef
from fastgshare.share import ShareSpec

ShareOf = Callable[[Option], ShareSpec]


@attrs.frozen
class FreeSpace:
    """Every healthy GPU's ledger (by UUID), and the GPU each bound pod (``namespace/name``) is on."""

    ledgers: Mapping[str, GpuLedger]
    pod_gpus: Mapping[str, str]

    @classmethod
    def of(cls, inventories: Iterable[NodeInventory], pods: Iterable[tuple[str, PodAssignment]],
           models: Mapping[str, ModelRef] | None = None) -> FreeSpace:
        """The ledgers of ``inventories`` with ``pods`` (``namespace/name``, assignment) on them, each
        declaring its model in ``models`` (by the same key; pods not in it declare none)."""
        ledgers: dict[str, GpuLedger] = {}
        for inventory in inventories:
            ledgers.update(NodeState(inventory).ledgers)
        pod_gpus: dict[str, str] = {}
        models = models or {}
        for key, assignment in pods:
            ledger = ledgers.get(assignment.gpu_uuid)
            if ledger is not None:
                ledger.add(key, assignment.share, model=models.get(key), force=True)
                pod_gpus[key] = assignment.gpu_uuid
        return cls(ledgers={uuid: ledger for uuid, ledger in ledgers.items() if ledger.gpu.healthy},
                   pod_gpus=pod_gpus)


@attrs.frozen
class Fitted:
    """The pods to add per configuration key, and how many of them fit nowhere (created anyway)."""

    additions: Mapping[str, int]
    unplaced: int


def fit_additions(additions: Mapping[str, int], usable: Sequence[Option], space: FreeSpace,
                  share_of: ShareOf, model: ModelRef | None = None) -> Fitted:
    """``additions`` (pods per configuration key, each declaring ``model``) made to fit ``space``
    (see the module docstring)."""
    ledgers = [ledger.copy() for _, ledger in sorted(space.ledgers.items())]
    by_key = {option.point.key: option for option in usable}
    placed: dict[str, int] = {}
    deficit_rps, unfit = 0.0, []
    serial = 0
    for key, count in sorted(additions.items()):
        for _ in range(count):
            serial += 1
            if _place(ledgers, f"new-{serial}", share_of(by_key[key]), model):
                placed[key] = placed.get(key, 0) + 1
            else:
                deficit_rps += by_key[key].capacity_rps
                unfit.append(key)
    replacements: dict[str, int] = {}
    for option in sorted(usable, key=lambda o: (-o.efficiency, o.point.key)):
        while deficit_rps > EPSILON_RPS:
            serial += 1
            if not _place(ledgers, f"new-{serial}", share_of(option), model):
                break
            replacements[option.point.key] = replacements.get(option.point.key, 0) + 1
            deficit_rps -= option.capacity_rps
    if deficit_rps > EPSILON_RPS:  # nothing covers it: create the planned pods anyway (Pending, with the reason)
        for key in unfit:
            placed[key] = placed.get(key, 0) + 1
        return Fitted(additions=placed, unplaced=len(unfit))
    for key, n in replacements.items():
        placed[key] = placed.get(key, 0) + n
    return Fitted(additions=placed, unplaced=0)


def _place(ledgers: Sequence[GpuLedger], pod_key: str, share: ShareSpec, model: ModelRef | None) -> bool:
    for ledger in ledgers:
        if ledger.fits(share, model):
            ledger.add(pod_key, share, model=model)
            return True
    return False


def can_raise_in_place(pods: Iterable[str], share: ShareSpec, space: FreeSpace,
                       model: ModelRef | None = None) -> bool:
    """Whether every one of ``pods`` (``namespace/name``, bound, declaring ``model``) may run with
    ``share`` on its GPU."""
    ledgers: dict[str, GpuLedger] = {}
    for pod in pods:
        uuid = space.pod_gpus.get(pod)
        if uuid is None or uuid not in space.ledgers:
            return False  # not bound yet, or on a GPU we cannot see: no live change to count on
        ledger = ledgers.setdefault(uuid, space.ledgers[uuid].copy())
        ledger.remove(pod)
        if not ledger.fits(share, model):
            return False
        ledger.add(pod, share, model=model)
    return True
