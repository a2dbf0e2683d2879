"""Offline validation of TrainingJob manifests, agreeing with the API server's verdict.

Field rules come from the pydantic models (the same constraints the CRD schema carries);
cross-field rules are the CEL expressions of :data:`SPEC_RULES`, evaluated here with the same
CEL library the embedded API server uses. Every problem is reported at once, each with its field
path and how to fix it.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, get_args

import celpy
from celpy.adapter import json_to_cel
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from railyard.api.trainingjob import API_VERSION, KIND, SPEC_RULES, TrainingJob, TrainingJobSpec


@dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


_FIXES = {
    "greater_than_equal": "use a larger value",
    "greater_than": "use a larger value",
    "less_than_equal": "use a smaller value",
    "less_than": "use a smaller value",
    "literal_error": "use one of the allowed values",
    "int_parsing": "use a whole number",
    "int_type": "use a whole number",
    "float_parsing": "use a number",
    "bool_parsing": "use true or false",
    "string_too_long": "shorten it",
    "string_too_short": "give a non-empty value",
    "too_long": "remove entries",
    "missing": "add it",
}


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


#: What users write for a field by another name (torchrun's, Kubernetes' or a first guess),
#: where spelling alone is too far off for difflib. Used only where the target exists.
FIELD_ALIASES = {
    "gpus": "gpusPerPod",
    "gpu": "gpusPerPod",
    "gpusPerNode": "gpusPerPod",
    "nprocPerNode": "procsPerNode",
    "nprocsPerNode": "procsPerNode",
    "nnodes": "nodes",
    "numNodes": "nodes",
    "replicas": "nodes",
}


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (directly, in a list, or optional)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


def known_fields(loc: Sequence[int | str]) -> list[str]:
    """The wire names of the fields of the object at ``loc`` (a TrainingJob path, list indices
    included); empty where the path leads to no model (free-form maps)."""
    model: type[BaseModel] = TrainingJob
    for part in loc:
        if isinstance(part, int):
            continue
        field = next((f for name, f in model.model_fields.items() if (f.alias or name) == part), None)
        sub = _model_in(field.annotation) if field is not None else None
        if sub is None:
            return []
        model = sub
    return [f.alias or name for name, f in model.model_fields.items()]


def nearest_field(name: str, known: Sequence[str]) -> str | None:
    """The known field ``name`` most likely meant: its camelCase spelling, an alias
    (:data:`FIELD_ALIASES`), or the closest spelling (difflib, case-insensitive)."""
    camel = to_camel(name) if "_" in name else name
    for guess in (camel, FIELD_ALIASES.get(camel)):
        if guess in known:
            return guess
    lowered = {k.lower(): k for k in known}
    close = difflib.get_close_matches(camel.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[close[0]] if close else None


def unknown_field_message(loc: Sequence[int | str]) -> str:
    """``unknown field; did you mean spec.gpusPerPod?``, or where to look the fields up."""
    parent, name = tuple(loc[:-1]), loc[-1]
    guess = nearest_field(str(name), known_fields(parent))
    if guess is not None:
        return f"unknown field; did you mean {_loc((*parent, guess))}?"
    explain = ".".join(["trainingjob", *(str(p) for p in parent if not isinstance(p, int))])
    return f"unknown field; remove it, or check its spelling against `kubectl explain {explain}`"


@cache
def _programs() -> list[tuple[dict[str, str], Any]]:
    env = celpy.Environment()
    return [(rule, env.program(env.compile(rule["rule"]))) for rule in SPEC_RULES]


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


@cache
def _spec_defaults() -> dict[str, Any]:
    return TrainingJobSpec().model_dump(by_alias=True, exclude_none=True)


def check_spec_rules(spec: dict[str, Any]) -> list[Problem]:
    """Evaluate the CEL cross-field rules on a spec (camelCase dict), after defaulting as the
    API server does. A rule that cannot be evaluated because a field it reads is itself invalid
    is skipped: that field's own problem is reported instead."""
    merged = _deep_merge(_spec_defaults(), {k: v for k, v in spec.items() if v is not None})
    activation = {"self": json_to_cel(merged)}
    problems = []
    for rule, program in _programs():
        try:
            ok = program.evaluate(activation)
        except Exception:  # CELEvalError and type errors: the field itself is invalid
            continue
        if isinstance(ok, celpy.celtypes.BoolType) and not bool(ok):
            problems.append(Problem("spec" + rule["fieldPath"], rule["message"]))
    return problems


def validate_manifest(obj: Any) -> list[Problem]:
    """Every problem of one manifest; an empty list means the API server would accept it."""
    if not isinstance(obj, dict):
        return [Problem("(document)", "expected a YAML/JSON object with apiVersion, kind, metadata and spec")]
    if obj.get("kind") != KIND or obj.get("apiVersion") != API_VERSION:
        return [Problem("kind", f"expected apiVersion {API_VERSION} and kind {KIND}, got {obj.get('apiVersion')} {obj.get('kind')}")]
    problems: list[Problem] = []
    name = (obj.get("metadata") or {}).get("name")
    if not name and not (obj.get("metadata") or {}).get("generateName"):
        problems.append(Problem("metadata.name", "required: give the job a name"))
    body = {k: v for k, v in obj.items() if k != "status"}
    try:
        # by wire name only, as the API server decodes (the models also take Python names)
        TrainingJob.model_validate(body, by_alias=True, by_name=False)
    except ValidationError as exc:
        for err in exc.errors():
            path = _loc(err["loc"])
            fix = _FIXES.get(err["type"], "fix the value")
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                problems.append(Problem(path, unknown_field_message(err["loc"])))
                continue
            elif err["type"] == "value_error":
                # our rules (railyard.api.corev1, api.quantity) say what to write instead
                problems.append(Problem(path, msg.removeprefix("Value error, ")))
                continue
            problems.append(Problem(path, f"{msg}; {fix}"))
    spec = obj.get("spec") or {}
    if isinstance(spec, dict):
        problems.extend(check_spec_rules(spec))
    return problems
