"""A generic, model-free check of a manifest against a CRD's openAPIV3Schema, the way the API
server does it: apply schema defaults, reject unknown fields (strict field validation, as
``kubectl apply`` asks), validate with a JSON-schema (draft 4, the dialect OpenAPI v3.0 builds on) validator, then evaluate every CEL rule
``x-kubernetes-validations`` at the node that carries it. Test-only: it exists to show that the
CRD we generate and our pydantic models reach the same verdict."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    if schema.get("type") == "object" and isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                value[key] = apply_defaults(value[key], extra)
    elif schema.get("type") == "array" and isinstance(value, list):
        return [apply_defaults(v, schema.get("items", {})) for v in value]
    return value


def unknown_fields(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    out: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in value.items():
            if key not in schema["properties"]:
                out.append(f"{path}.{key}")
            else:
                out.extend(unknown_fields(sub, schema["properties"][key], f"{path}.{key}"))
    elif isinstance(value, list) and "items" in schema:
        for i, sub in enumerate(value):
            out.extend(unknown_fields(sub, schema["items"], f"{path}[{i}]"))
    return out


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop OpenAPI-only keys the JSON-schema validator would not understand."""
    out = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if "properties" in out:
        out["properties"] = {k: _json_schema(v) for k, v in out["properties"].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _json_schema(out["additionalProperties"])
    if "items" in out:
        out["items"] = _json_schema(out["items"])
    return out


def cel_errors(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    out: list[str] = []
    env = celpy.Environment()
    for rule in schema.get("x-kubernetes-validations", []):
        program = env.program(env.compile(rule["rule"]))
        try:
            ok = program.evaluate({"self": celpy.json_to_cel(value)})
        except Exception:
            continue
        if isinstance(ok, celpy.celtypes.BoolType) and not bool(ok):
            out.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}")
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                out.extend(cel_errors(value[key], sub, f"{path}.{key}"))
    return out


def check(manifest: dict[str, Any], crd: dict[str, Any]) -> list[str]:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = apply_defaults(copy.deepcopy(manifest), schema)
    errors = [f"{p}: unknown field" for p in unknown_fields(obj, schema, "")]
    validator = jsonschema.Draft4Validator(_json_schema(schema))
    errors += [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]
    if not errors:
        errors += cel_errors(obj, schema, "")
    return errors
