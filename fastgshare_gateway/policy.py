"""What a cluster admin allows through the gateway's provider API: replicas per function and image
prefixes (``--max-replicas``, ``--allowed-image-prefixes``). Pure: problems as :class:`FieldProblem`,
named by the ``FunctionDeployment`` field they came from, so the answer is a 400 naming the limit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fastgshare import keys
from fastgshare.errors import FieldProblem

DEFAULT_MAX_REPLICAS = 100
# spec.scaling field of a FaSTFunc -> the FunctionDeployment label it came from
_SCALING_LABELS = {"minReplicas": keys.OPENFAAS_SCALE_MIN_LABEL, "maxReplicas": keys.OPENFAAS_SCALE_MAX_LABEL}


@attrs.frozen
class DeployPolicy:
    """``max_replicas``: the most replicas a deploy, update or scale may ask for one function;
    ``image_prefixes``: images must start with one of them (literally: end a registry prefix with ``/``);
    empty allows any image."""

    max_replicas: int = DEFAULT_MAX_REPLICAS
    image_prefixes: tuple[str, ...] = ()

    def replicas_problem(self, replicas: int, field: str = "replicas") -> FieldProblem | None:
        if replicas <= self.max_replicas:
            return None
        return FieldProblem(field, replicas, f"over this gateway's limit of {self.max_replicas} replicas per "
                                             "function (--max-replicas)")

    def image_problem(self, image: str) -> FieldProblem | None:
        if not self.image_prefixes or image.startswith(self.image_prefixes):
            return None
        return FieldProblem("image", image, "not an allowed image; images must start with one of: "
                                            f"{', '.join(self.image_prefixes)} (--allowed-image-prefixes)")

    def fastfunc_problems(self, fastfunc: Mapping[str, Any]) -> list[FieldProblem]:
        """What a FaSTFunc made from a ``FunctionDeployment`` asks beyond the limits."""
        spec = fastfunc.get("spec") or {}
        problems = []
        scaling = spec.get("scaling") or {}
        for field, label in _SCALING_LABELS.items():
            count = scaling.get(field)
            if isinstance(count, int) and (problem := self.replicas_problem(count, f"labels[{label}]")):
                problems.append(problem)
        for container in (spec.get("podSpec") or {}).get("containers") or []:
            if problem := self.image_problem(str(container.get("image", ""))):
                problems.append(problem)
        return problems
