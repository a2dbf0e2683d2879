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
from dataclasses import dataclass, fields, is_dataclass
from functools import cache
from typing import Any, get_args, get_type_hints

import celpy
from celpy.adapter import json_to_cel
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from railyard.api.trainingjob import API_VERSION, KIND, SPEC_RULES, TrainingJob, TrainingJobSpec
from railyard.protocol.trainerconfig import wire_name


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

#: What pydantic says of a field no model or section has (a section is a dataclass: its unknown
#: fields are unexpected keyword arguments).
_UNKNOWN_FIELD = ("extra_forbidden", "unexpected_keyword_argument")


def _message(err: Any) -> str:
    """pydantic's message in the words it has for models and lists: the trainer's sections are
    dataclasses and their lists tuples, which the wire knows as objects and lists."""
    if err["type"] == "dataclass_type":
        return f"Input should be a valid dictionary or instance of {err['ctx']['class_name']}"
    if err["type"] == "tuple_type":
        return "Input should be a valid list"
    return str(err["msg"]).replace("Tuple should", "List should")


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


def _object_in(annotation: Any) -> type | None:
    """The object type a field holds (directly, in a list, or optional): a pydantic model or a
    section of the trainer contract (a dataclass)."""
    if isinstance(annotation, type) and (issubclass(annotation, BaseModel) or is_dataclass(annotation)):
        return annotation
    for arg in get_args(annotation):
        if (found := _object_in(arg)) is not None:
            return found
    return None


def _fields_of(cls: type) -> dict[str, Any]:
    """wire name -> the type the field holds."""
    if issubclass(cls, BaseModel):
        return {f.alias or name: f.annotation for name, f in cls.model_fields.items()}
    hints = get_type_hints(cls)
    return {wire_name(f.name): hints[f.name] for f in fields(cls)}  # type: ignore[arg-type]


def known_fields(loc: Sequence[int | str]) -> list[str]:
    """The wire names of the fields of the object at ``loc`` (a TrainingJob path, list indices
    included); empty where the path leads to no object (free-form maps)."""
    cls: type | None = TrainingJob
    for part in loc:
        if isinstance(part, int):
            continue
        cls = _object_in(_fields_of(cls).get(part)) if cls is not None else None
    return [] if cls is None else list(_fields_of(cls))


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
    return TrainingJobSpec().model_dump(by_alias=True, exclude_none=True, mode="json")


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
        return [
            Problem(
                "kind",
                f"expected apiVersion {API_VERSION} and kind {KIND}, got {obj.get('apiVersion')} {obj.get('kind')}",
            )
        ]
    problems: list[Problem] = []
    name = (obj.get("metadata") or {}).get("name")
    if not name and not (obj.get("metadata") or {}).get("generateName"):
        problems.append(Problem("metadata.name", "required: give the job a name"))
    body = {k: v for k, v in obj.items() if k != "status"}
    try:
        # by wire name only, as the API server decodes (the models also take Python names)
        TrainingJob.model_validate(body, by_alias=True, by_name=False)
    except ValidationError as exc:
        errors = exc.errors()
        # A tuple counts only its valid items: a list whose item is invalid is not also too short.
        bad_items = {_loc(err["loc"][:-1]) for err in errors if err["loc"] and isinstance(err["loc"][-1], int)}
        for err in errors:
            path = _loc(err["loc"])
            fix = _FIXES.get(err["type"], "fix the value")
            msg = _message(err)
            if err["type"] in _UNKNOWN_FIELD:
                problems.append(Problem(path, unknown_field_message(err["loc"])))
                continue
            elif err["type"] == "value_error":
                # our rules (railyard.api.corev1, api.quantity) say what to write instead
                problems.append(Problem(path, msg.removeprefix("Value error, ")))
                continue
            elif err["type"] == "too_short" and path in bad_items:
                continue
            problems.append(Problem(path, f"{msg}; {fix}"))
    spec = obj.get("spec") or {}
    if isinstance(spec, dict):
        problems.extend(check_spec_rules(spec))
    return problems
