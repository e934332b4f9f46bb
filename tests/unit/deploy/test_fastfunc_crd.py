"""The FaSTFunc CRD's schema carries what the controller reads: ``spec.model`` (model sharing) as
:meth:`fastgshare.model.ModelSpec.to_spec` writes it, ``bytes`` a number or a quantity like ``memory``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fastgshare.model import MAX_PATH_LENGTH, ModelSpec

CRD = Path(__file__).resolve().parents[3] / "deploy" / "crd" / "fastfuncs.yaml"


def spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    [version] = crd["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def test_spec_model_has_the_fields_the_core_parses() -> None:
    model = spec_schema()["model"]
    written = ModelSpec(name="resnet50", bytes=1, path="a/b").to_spec()
    assert model["type"] == "object"
    assert set(model["properties"]) == set(written)
    assert set(model["required"]) == set(written)
    assert model["properties"]["name"]["type"] == "string"
    assert model["properties"]["bytes"] == {**model["properties"]["bytes"], "x-kubernetes-int-or-string": True}
    assert "type" not in model["properties"]["bytes"]  # int-or-string, as spec.memory
    source = model["properties"]["source"]
    assert set(source["properties"]) == {"path"} == set(source["required"])
    assert source["properties"]["path"]["maxLength"] == MAX_PATH_LENGTH
    # unknown fields are pruned by the API server (no x-kubernetes-preserve-unknown-fields)
    assert "x-kubernetes-preserve-unknown-fields" not in model
