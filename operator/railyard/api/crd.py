"""Generate the TrainingJob CustomResourceDefinition from the pydantic models (and the trainer
contract's sections they hold, railyard.protocol.trainerconfig).

pydantic emits JSON Schema (with ``$ref``, ``anyOf: [X, null]``, titles); a CRD needs a
*structural* OpenAPI v3 schema: everything inlined, one type per node, descriptions everywhere,
defaults without nulls. :func:`build_crd` does that conversion, adds the CEL rules, the printer
columns and the status subresource. ``crds/trainingjob.yaml`` is this function's output and a
test keeps the two equal.
"""

from __future__ import annotations

import copy
from dataclasses import is_dataclass
from typing import Any

import yaml
from pydantic.json_schema import GenerateJsonSchema

from railyard import GROUP, VERSION
from railyard.api.trainingjob import (
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    TrainingJobSpec,
    TrainingJobStatus,
)
from railyard.protocol.trainerconfig import to_wire

#: JSON-schema keys that carry over to OpenAPI v3 as they are.
_KEEP = {
    "type", "description", "default", "enum", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", "pattern",
    "x-kubernetes-validations", "format",
}

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
    {"name": "Nodes", "type": "integer", "jsonPath": ".spec.nodes", "description": "Nodes in the gang."},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step", "description": "Newest training step."},
    {
        "name": "Restarts",
        "type": "integer",
        "jsonPath": ".status.restarts.total",
        "description": "Restarts, all classes.",
    },
    {
        "name": "Spares",
        "type": "integer",
        "jsonPath": ".status.sparesHeld",
        "description": "Hot spare nodes held (placeholder pods).",
    },
    {
        "name": "Checkpoint",
        "type": "string",
        "jsonPath": ".status.lastCheckpoint.tier",
        "priority": 1,
        "description": "Tier of the newest verified checkpoint.",
    },
    {
        "name": "Message",
        "type": "string",
        "jsonPath": ".status.message",
        "priority": 1,
        "description": "What is happening now.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


class _JsonSchema(GenerateJsonSchema):
    """pydantic's JSON Schema, with a default that is a section of the trainer contract
    (railyard.protocol.trainerconfig, a stdlib dataclass) written by its wire names, as the
    trainer reads it (pydantic would write the Python names: the dataclass has no config)."""

    def encode_default(self, dft: Any) -> Any:
        if is_dataclass(dft) and not isinstance(dft, type):
            dft = to_wire(dft, keep_none=True)
        return super().encode_default(dft)


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline refs and turn one JSON-schema node into a structural OpenAPI v3 node."""
    node = dict(node)
    if "$ref" in node:
        # A type's docstring is for Python readers (the contract's sections have them); the CRD
        # says what a field means with the field's description.
        target = {k: v for k, v in defs[node.pop("$ref").split("/")[-1]].items() if k != "description"}
        merged = {**target, **node}  # the referring node's description/default win
        return _convert(merged, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = node.pop("allOf")[0]
        return _convert({**inner, **node}, defs)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {len(options)} types in a structural schema")
        # Optional[X]: the field may be omitted; explicit null is not part of our API.
        return _convert({**options[0], **node}, defs)

    out: dict[str, Any] = {k: v for k, v in node.items() if k in _KEEP}
    # JSON Schema 2020 writes exclusive bounds as numbers; OpenAPI v3.0 (Kubernetes) as a bound
    # plus a boolean flag.
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), int | float) and not isinstance(out[bound], bool):
            out[flag] = out.pop(bound)
            out[bound] = True
    if "const" in node:
        out["enum"] = [node["const"]]
    if "default" in out:
        if out["default"] is None:
            del out["default"]
        else:
            out["default"] = _strip_nulls(out["default"])
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        out["type"] = "object"
        if "properties" in node:
            out["properties"] = {k: _convert(v, defs) for k, v in node["properties"].items()}
            if node.get("required"):
                out["required"] = list(node["required"])
        elif isinstance(node.get("additionalProperties"), dict):
            out["additionalProperties"] = _convert(node["additionalProperties"], defs)
    elif kind == "array":
        out["items"] = _convert(node.get("items", {}), defs)
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def defaulted(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` with the schema's defaults filled in, as the API server fills them (a default
    first, then the defaults inside it)."""
    if isinstance(value, dict) and schema.get("type") == "object":
        out = dict(value)
        for key, sub in (schema.get("properties") or {}).items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = defaulted(out[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            out = {k: v if k in (schema.get("properties") or {}) else defaulted(v, extra) for k, v in out.items()}
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [defaulted(v, schema["items"]) for v in value]
    return value


def openapi_schema(model: type[TrainingJobSpec] | type[TrainingJobStatus]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_JsonSchema)
    defs = raw.pop("$defs", {})
    return _convert(raw, defs)


def build_crd() -> dict[str, Any]:
    spec_schema = openapi_schema(TrainingJobSpec)
    spec_schema["description"] = (
        "What to train and how: the gang's shape, parallelism, topology, checkpoints, health and restart policy."
    )
    # A TrainingJob without a spec runs the default job. The API server checks a default as it
    # is written, against its own schema and rules, without defaulting it first: so the default is
    # what `spec: {}` defaults to, spelled out (a bare {} fails every rule that reads a field).
    spec_schema["default"] = defaulted({}, spec_schema)
    status_schema = openapi_schema(TrainingJobStatus)
    status_schema["description"] = "Observed state, written by the operator once per reconcile."
    schema = {
        "type": "object",
        "description": "A distributed PyTorch training job, placed as one rail-aware gang and kept running through "
                       "failures.",
        "properties": {
            "apiVersion": {"type": "string", "description": "railyard.dev/v1alpha1"},
            "kind": {"type": "string", "description": "TrainingJob"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "railyard", "app.kubernetes.io/part-of": "railyard"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["railyard", "all"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": copy.deepcopy(PRINTER_COLUMNS),
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    header = "# Generated by `railyard crd` from operator/railyard/api/trainingjob.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
