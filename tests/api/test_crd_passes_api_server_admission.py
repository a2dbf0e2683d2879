"""The CRD `railyard crd` generates passes the checks a real kube-apiserver runs when a CRD is
created, checked without a server by the embedded API server's own CRD admission code.

The recorded answers of a real kube-apiserver v1.36 (tests/golden/kube-v1.36) are the oracle for
that code: it must refuse the CRD as it stood before (a ``default: {}`` the rules cannot read)
with the very causes the real server gave.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from railyard.api.crd import build_crd, defaulted
from railyard.api.trainingjob import TrainingJobSpec
from railyard_local.apiserver import cel
from railyard_local.apiserver.crd import validate_crd, validate_openapi_schema

CORPUS = Path(__file__).resolve().parents[1] / "golden" / "kube-v1.36"


def _case(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CORPUS / f"{name}.json").read_text())
    return data


def _causes(causes: list[Any]) -> list[dict[str, str]]:
    return [c.as_dict() for c in causes]


def _spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return schema


def test_the_generated_crd_passes_crd_admission() -> None:
    assert validate_crd(build_crd(), None) == []


def test_the_crd_as_it_landed_is_refused_with_the_real_servers_causes() -> None:
    case = _case("000-crd-landed-project-crd")
    want = case["response"]["body"]["details"]["causes"]
    assert len(want) == 10
    assert _causes(validate_crd(case["request"]["body"], None)) == want


def test_a_bare_empty_default_on_spec_is_refused_again() -> None:
    """The class of bug: put ``default: {}`` back and admission names every rule it breaks."""
    crd = build_crd()
    _spec_schema(crd)["default"] = {}
    causes = validate_crd(crd, None)
    assert causes and all(c.field.endswith("properties[spec].default") for c in causes)
    assert any("no such key: procsPerNode evaluating rule" in c.detail for c in causes)


def test_the_spec_default_is_what_an_empty_spec_defaults_to_and_the_models_default() -> None:
    schema = _spec_schema(build_crd())
    assert schema["default"] == defaulted({}, {k: v for k, v in schema.items() if k != "default"})
    from_default = TrainingJobSpec.model_validate(schema["default"])
    assert from_default == TrainingJobSpec.model_validate({})


@pytest.mark.parametrize("name", [
    "001-crd-default-empty-object-with-cel-on-children", "003-crd-nonstructural-missing-type",
    "004-crd-cel-syntax-error", "005-crd-cel-unknown-field", "006-crd-cel-cost-over-budget",
    "008-crd-default-violates-minimum", "009-crd-name-mismatch",
])
def test_refused_crds_get_the_real_servers_causes(name: str) -> None:
    case = _case(name)
    assert _causes(validate_crd(case["request"]["body"], None)) == case["response"]["body"]["details"]["causes"]


@pytest.mark.parametrize("name", [
    "002-crd-default-empty-object-with-has-guard", "007-crd-cel-cost-bounded-ok", "010-crd-exclusive-minimum-bool",
    "011-crd-printer-column-bad-jsonpath", "012-crd-int-or-string-and-preserve",
])
def test_accepted_crds_are_accepted(name: str) -> None:
    assert validate_crd(_case(name)["request"]["body"], None) == []


def _list_rule_schema(max_items: int | None, max_length: int | None) -> dict[str, Any]:
    items: dict[str, Any] = {"type": "string"}
    if max_length is not None:
        items["maxLength"] = max_length
    xs: dict[str, Any] = {"type": "array", "items": items}
    if max_items is not None:
        xs["maxItems"] = max_items
    return {"type": "object", "properties": {"spec": {
        "type": "object", "properties": {"xs": xs},
        "x-kubernetes-validations": [{"rule": "self.xs.all(a, self.xs.all(b, a == b || a != b))"}]}}}


def test_the_cost_estimate_grows_with_the_bounds_and_refuses_unbounded_quadratic_rules() -> None:
    costs = []
    for n in (8, 64, 512):
        rule_type = cel.decl_type(_list_rule_schema(n, 16)["properties"]["spec"])
        costs.append(cel.compile_rule("self.xs.all(a, self.xs.all(b, a == b || a != b))", rule_type).max_cost)
    assert costs[0] < costs[1] < costs[2]
    assert costs[2] / costs[1] > 30, "a nested loop costs about n squared"
    assert validate_openapi_schema(_list_rule_schema(512, 16), "s") == []
    refused = validate_openapi_schema(_list_rule_schema(None, None), "s")
    assert [c.reason for c in refused] == ["FieldValueForbidden"] * 3
    assert "more than 100x" in refused[0].detail


def test_every_rule_of_the_generated_crd_is_cheap() -> None:
    schema = copy.deepcopy(build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    from railyard_local.apiserver.schema import Schema

    costs = Schema(schema).rule_costs
    assert costs and all(c.cost < cel.PER_RULE_COST_LIMIT / 100 for c in costs), costs
