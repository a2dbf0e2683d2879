"""CRD structural schemas: pruning, defaulting, validation and CEL rules.

Validation errors are reported as the apiserver reports them (field path, reason, message), all
at once. ``x-kubernetes-validations`` rules are compiled once with cel-python (``celpy``) when the
CRD is registered and evaluated with ``self`` (and ``oldSelf`` for transition rules on update).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy.adapter import json_to_cel

from .errors import Cause, duplicate, invalid_value, not_supported, required, too_many, type_invalid

JSON = dict[str, Any]

OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers", "managedFields",
})

_CEL_ENV = celpy.Environment()


class SchemaError(Exception):
    def __init__(self, causes: list[Cause]) -> None:
        super().__init__("; ".join(str(c) for c in causes))
        self.causes = causes


@dataclass
class _Rule:
    rule: str
    program: Any
    message: str | None
    message_program: Any
    field_path: str
    reason: str
    transition: bool


@dataclass
class _Node:
    s: JSON
    props: dict[str, _Node] = field(default_factory=dict)
    items: _Node | None = None
    addl: _Node | None = None
    addl_allowed: bool = False
    rules: list[_Rule] = field(default_factory=list)
    branches: list[tuple[str, list[_Node]]] = field(default_factory=list)
    pattern: re.Pattern[str] | None = None

    @property
    def preserve(self) -> bool:
        return bool(self.s.get("x-kubernetes-preserve-unknown-fields"))

    @property
    def embedded(self) -> bool:
        return bool(self.s.get("x-kubernetes-embedded-resource"))


def _compile(s: JSON, path: str, errors: list[Cause]) -> _Node:
    if not isinstance(s, dict):
        errors.append(invalid_value(path, s, "must be a schema object"))
        return _Node({})
    node = _Node(s)
    if not isinstance(s.get("properties") or {}, dict):
        errors.append(invalid_value(f"{path}.properties", s["properties"], "must be a map of schemas"))
        return node
    if "pattern" in s:
        try:
            node.pattern = re.compile(s["pattern"])
        except (re.error, TypeError) as exc:
            errors.append(invalid_value(f"{path}.pattern", s["pattern"], f"must be a valid regular expression: {exc}"))
    for k, ps in (s.get("properties") or {}).items():
        node.props[k] = _compile(ps, f"{path}.properties[{k}]", errors)
    if isinstance(s.get("items"), dict):
        node.items = _compile(s["items"], f"{path}.items", errors)
    addl = s.get("additionalProperties")
    if isinstance(addl, dict):
        node.addl = _compile(addl, f"{path}.additionalProperties", errors)
    elif addl is True:
        node.addl_allowed = True
    for comb in ("allOf", "anyOf", "oneOf"):
        if isinstance(s.get(comb), list):
            node.branches.append((comb, [_compile(b, f"{path}.{comb}", errors) for b in s[comb]]))
    if isinstance(s.get("not"), dict):
        node.branches.append(("not", [_compile(s["not"], f"{path}.not", errors)]))
    for i, r in enumerate(s.get("x-kubernetes-validations") or []):
        rule_path = f"{path}.x-kubernetes-validations[{i}]"
        try:
            program = _CEL_ENV.program(_CEL_ENV.compile(r["rule"]))
        except Exception as exc:
            errors.append(invalid_value(f"{rule_path}.rule", r.get("rule"), f"compilation failed: {exc}"))
            continue
        msg_prog = None
        if r.get("messageExpression"):
            try:
                msg_prog = _CEL_ENV.program(_CEL_ENV.compile(r["messageExpression"]))
            except Exception as exc:
                errors.append(invalid_value(f"{rule_path}.messageExpression", r["messageExpression"],
                                            f"messageExpression compilation failed: {exc}"))
        node.rules.append(_Rule(
            rule=r["rule"], program=program, message=r.get("message"), message_program=msg_prog,
            field_path=r.get("fieldPath", ""), reason=r.get("reason", "FieldValueInvalid"),
            transition=bool(re.search(r"\boldSelf\b", r["rule"])),
        ))
    return node


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _is_type(v: Any, t: str) -> bool:
    if t == "string":
        return isinstance(v, str)
    if t == "integer":
        return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, int | float) and not isinstance(v, bool)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "array":
        return isinstance(v, list)
    if t == "object":
        return isinstance(v, dict)
    return True


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _cel_error(exc: BaseException) -> str:
    """cel-python's CELEvalError carries (message, python exception type, its args); keep the message."""
    first = exc.args[0] if exc.args else exc
    return str(first)


class Schema:
    """One CRD version's openAPIV3Schema, compiled."""

    def __init__(self, openapi_schema: JSON) -> None:
        errors: list[Cause] = []
        self.raw = openapi_schema
        self.root = _compile(openapi_schema, "openAPIV3Schema", errors)
        self._cel_causes: list[Cause] = []
        if errors:
            raise SchemaError(errors)

    # ---- pruning ---------------------------------------------------------------------------

    def prune(self, obj: JSON) -> list[str]:
        """Drop fields the schema does not know (and non-nullable nulls); return unknown paths."""
        out: list[str] = []
        self._prune(obj, self.root, "", out, root=True)
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            for k in list(meta):
                if k not in OBJECT_META_FIELDS:
                    del meta[k]
                    out.append(f"metadata.{k}")
        return out

    def _prune(self, value: Any, node: _Node, path: str, out: list[str], root: bool = False) -> None:
        if isinstance(value, dict):
            keep_meta = root or node.embedded
            for k in list(value):
                child_path = f"{path}.{k}" if path else k
                if keep_meta and k in ("apiVersion", "kind", "metadata"):
                    continue
                sub = node.props.get(k) or node.addl
                if value[k] is None and sub is not None and not sub.s.get("nullable"):
                    del value[k]
                    continue
                if sub is not None:
                    self._prune(value[k], sub, child_path, out)
                elif not (node.preserve or node.addl_allowed):
                    del value[k]
                    out.append(child_path)
        elif isinstance(value, list) and node.items is not None:
            for i, item in enumerate(value):
                self._prune(item, node.items, f"{path}[{i}]", out)

    # ---- defaulting ------------------------------------------------------------------------

    def default(self, obj: JSON) -> None:
        self._default(obj, self.root)

    def _default(self, value: Any, node: _Node) -> None:
        if isinstance(value, dict):
            for k, sub in node.props.items():
                if k not in value and "default" in sub.s:
                    value[k] = copy.deepcopy(sub.s["default"])
                if k in value:
                    self._default(value[k], sub)
            if node.addl is not None:
                for k, v in value.items():
                    if k not in node.props:
                        self._default(v, node.addl)
        elif isinstance(value, list) and node.items is not None:
            for item in value:
                self._default(item, node.items)

    # ---- validation ------------------------------------------------------------------------

    def validate(self, obj: JSON, old: JSON | None) -> list[Cause]:
        causes: list[Cause] = []
        body = {k: v for k, v in obj.items() if k != "metadata"}
        old_body = None if old is None else {k: v for k, v in old.items() if k != "metadata"}
        if "metadata" in obj:
            body["metadata"] = {k: obj["metadata"][k] for k in ("name", "generateName", "namespace", "labels",
                                                                "annotations") if k in obj["metadata"]}
        if old_body is not None and "metadata" in (old or {}):
            assert old is not None
            old_body["metadata"] = {k: old["metadata"][k] for k in ("name", "generateName", "namespace",
                                                                    "labels", "annotations") if k in old["metadata"]}
        self._cel_causes = []
        self._validate(body, self.root, "", old_body, old is not None, causes, root=True)
        if any(c.reason == "FieldValueTypeInvalid" for c in causes):
            # as upstream: rules are not evaluated on an object of the wrong shape
            if self._cel_causes:
                causes.append(Cause("<root>", "FieldValueInvalid", 'Invalid value: "": some validation rules '
                                    "were not checked because the object was invalid; correct the existing "
                                    "errors to complete validation"))
        else:
            causes.extend(self._cel_causes)
        return causes

    def _validate(self, v: Any, node: _Node, path: str, old: Any, has_old: bool, causes: list[Cause],
                  root: bool = False) -> None:
        s = node.s
        shown = path or "<root>"
        if v is None:
            if not s.get("nullable") and s.get("type"):
                causes.append(type_invalid(shown, "null", f'{shown} in body must be of type {s["type"]}: "null"'))
            return
        t = s.get("type")
        if s.get("x-kubernetes-int-or-string"):
            if not (isinstance(v, str) or _is_type(v, "integer")):
                causes.append(type_invalid(shown, _type_name(v),
                                           f'{shown} in body must be of type integer,string: "{_type_name(v)}"'))
                return
        elif t and not _is_type(v, t):
            causes.append(type_invalid(shown, _type_name(v), f'{shown} in body must be of type {t}: "{_type_name(v)}"'))
            return
        if "enum" in s and v not in s["enum"]:
            causes.append(not_supported(shown, v, s["enum"]))
        if isinstance(v, int | float) and not isinstance(v, bool):
            if "minimum" in s:
                if s.get("exclusiveMinimum") is True and v <= s["minimum"]:
                    causes.append(invalid_value(shown, v, f"{shown} in body should be greater than {_num(s['minimum'])}"))
                elif v < s["minimum"]:
                    causes.append(invalid_value(shown, v,
                                                f"{shown} in body should be greater than or equal to {_num(s['minimum'])}"))
            if "maximum" in s:
                if s.get("exclusiveMaximum") is True and v >= s["maximum"]:
                    causes.append(invalid_value(shown, v, f"{shown} in body should be less than {_num(s['maximum'])}"))
                elif v > s["maximum"]:
                    causes.append(invalid_value(shown, v,
                                                f"{shown} in body should be less than or equal to {_num(s['maximum'])}"))
            if "multipleOf" in s and s["multipleOf"] and (v / s["multipleOf"]) % 1 != 0:
                causes.append(invalid_value(shown, v, f"{shown} in body should be a multiple of {_num(s['multipleOf'])}"))
        if isinstance(v, str):
            if "minLength" in s and len(v) < s["minLength"]:
                causes.append(invalid_value(shown, v, f"{shown} in body should be at least {s['minLength']} chars long"))
            if "maxLength" in s and len(v) > s["maxLength"]:
                causes.append(Cause(shown, "FieldValueTooLong",
                                    f"Too long: may not be more than {s['maxLength']} bytes"))
            if node.pattern is not None and not node.pattern.search(v):
                causes.append(invalid_value(shown, v, f"{shown} in body should match '{s['pattern']}'"))
        if isinstance(v, list):
            if "minItems" in s and len(v) < s["minItems"]:
                causes.append(invalid_value(shown, v, f"{shown} in body should have at least {s['minItems']} items"))
            if "maxItems" in s and len(v) > s["maxItems"]:
                causes.append(too_many(shown, len(v), s["maxItems"]))
            list_type = s.get("x-kubernetes-list-type")
            if s.get("uniqueItems") or list_type == "set":
                seen: list[str] = []
                for i, item in enumerate(v):
                    k = json.dumps(item, sort_keys=True)
                    if k in seen:
                        causes.append(duplicate(f"{shown}[{i}]", item))
                    seen.append(k)
            old_items: dict[str, Any] = {}
            map_keys = s.get("x-kubernetes-list-map-keys") or []
            if list_type == "map" and map_keys:
                seen_keys: set[str] = set()
                for i, item in enumerate(v):
                    if isinstance(item, dict):
                        k = json.dumps([item.get(mk) for mk in map_keys])
                        if k in seen_keys:
                            causes.append(duplicate(f"{shown}[{i}]", {mk: item.get(mk) for mk in map_keys}))
                        seen_keys.add(k)
                if isinstance(old, list):
                    for item in old:
                        if isinstance(item, dict):
                            old_items[json.dumps([item.get(mk) for mk in map_keys])] = item
            if node.items is not None:
                for i, item in enumerate(v):
                    okey = json.dumps([item.get(mk) for mk in map_keys]) if map_keys and isinstance(item, dict) else None
                    o = old_items.get(okey) if okey is not None else None
                    self._validate(item, node.items, f"{path}[{i}]", o, o is not None, causes)
        if isinstance(v, dict):
            for r in s.get("required") or []:
                if r not in v:
                    causes.append(required(f"{path}.{r}" if path else r))
            if "minProperties" in s and len(v) < s["minProperties"]:
                causes.append(invalid_value(shown, v, f"{shown} in body should have at least {s['minProperties']} properties"))
            if "maxProperties" in s and len(v) > s["maxProperties"]:
                causes.append(too_many(shown, len(v), s["maxProperties"]))
            for k, child in v.items():
                sub = node.props.get(k)
                child_path = f"{path}.{k}" if path else k
                if sub is None and node.addl is not None:
                    sub = node.addl
                    child_path = f"{path}[{k}]"
                if sub is None:
                    continue
                o = old.get(k) if isinstance(old, dict) else None
                self._validate(child, sub, child_path, o, isinstance(old, dict) and k in old, causes)
        for comb, branches in node.branches:
            results = []
            for b in branches:
                sub_causes: list[Cause] = []
                self._validate(v, b, path, old, has_old, sub_causes)
                results.append(sub_causes)
            if comb == "allOf":
                for rc in results:
                    causes.extend(rc)
            elif comb == "anyOf" and all(results):
                causes.append(invalid_value(shown, v, f"{shown} in body must match at least one schema (anyOf)"))
            elif comb == "oneOf" and sum(1 for rc in results if not rc) != 1:
                causes.append(invalid_value(shown, v, f"{shown} in body must match exactly one schema (oneOf)"))
            elif comb == "not" and not results[0]:
                causes.append(invalid_value(shown, v, f"{shown} in body must not match the schema (not)"))
        if node.rules:
            self._cel(v, node, path, old, has_old, self._cel_causes)

    def _cel(self, v: Any, node: _Node, path: str, old: Any, has_old: bool, causes: list[Cause]) -> None:
        activation: dict[str, Any] = {"self": json_to_cel(v)}
        if has_old:
            activation["oldSelf"] = json_to_cel(old)
        for r in node.rules:
            if r.transition and not has_old:
                continue
            field_path = path + r.field_path if r.field_path else path
            shown = field_path or "<root>"
            # upstream shows the schema type of the rule's node as the "value"
            type_name = node.s.get("type", "object")
            try:
                result = r.program.evaluate(activation)
            except Exception as exc:
                causes.append(invalid_value(shown, type_name, f"{_cel_error(exc)} evaluating rule: {r.rule}"))
                continue
            if isinstance(result, Exception):
                causes.append(invalid_value(shown, type_name, f"{_cel_error(result)} evaluating rule: {r.rule}"))
                continue
            if bool(result):
                continue
            message = r.message or f"failed rule: {r.rule}"
            if r.message_program is not None:
                try:
                    m = r.message_program.evaluate(activation)
                    if isinstance(m, str) and m.strip():
                        message = str(m)
                except Exception:
                    pass
            if r.reason == "FieldValueRequired":
                causes.append(Cause(shown, r.reason, f"Required value: {message}"))
            elif r.reason == "FieldValueForbidden":
                causes.append(Cause(shown, r.reason, f"Forbidden: {message}"))
            elif r.reason == "FieldValueDuplicate":
                causes.append(Cause(shown, r.reason, f"Duplicate value: {message}"))
            else:
                causes.append(invalid_value(shown, type_name, message))
