"""CRD structural schemas: pruning, defaulting, validation and CEL rules.

Validation errors are reported as the apiserver reports them (field path, reason, message), all
at once, in the apiserver's order: OpenAPI value validation, then list-type (set/map)
uniqueness, then the ``x-kubernetes-validations`` rules, which are skipped, with one ``<nil>``
error saying so, when the object already failed a blocking check (type, enum, required, too
long, too many). Rules are compiled once per CRD (cel.py) and evaluated with ``self`` (and
``oldSelf`` for transition rules on update).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

from celpy.adapter import json_to_cel

from . import cel
from .errors import Cause, duplicate, invalid_value, not_supported, required, too_many, type_invalid

JSON = dict[str, Any]

OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
    "ownerReferences", "finalizers", "managedFields",
})

_BLOCKING = frozenset({"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany",
                       "FieldValueTypeInvalid"})


class SchemaError(Exception):
    def __init__(self, causes: list[Cause]) -> None:
        super().__init__("; ".join(str(c) for c in causes))
        self.causes = causes


@dataclass
class _Rule:
    raw: JSON
    rule: str
    program: Any
    message: str | None
    message_program: Any
    field_path: str
    reason: str | None
    transition: bool
    cost: int


@dataclass
class RuleCost:
    path: str
    """Schema path of the rule (``properties[spec].x-kubernetes-validations[0].rule``)."""
    cost: int
    """Estimated worst-case cost of one evaluation times how often it can run."""


@dataclass
class _Node:
    s: JSON
    path: str
    props: dict[str, _Node] = field(default_factory=dict)
    items: _Node | None = None
    addl: _Node | None = None
    addl_allowed: bool = False
    rules: list[_Rule] = field(default_factory=list)
    branches: list[tuple[str, list[_Node]]] = field(default_factory=list)
    pattern: re.Pattern[str] | None = None
    has_rules_below: bool = False

    @property
    def preserve(self) -> bool:
        return bool(self.s.get("x-kubernetes-preserve-unknown-fields"))

    @property
    def embedded(self) -> bool:
        return bool(self.s.get("x-kubernetes-embedded-resource"))


def _go_regexp(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


class _Compiler:
    def __init__(self) -> None:
        self.errors: list[Cause] = []
        self.costs: list[RuleCost] = []

    def node(self, s: Any, path: str, *, root: bool, cardinality: int) -> _Node:
        if not isinstance(s, dict):
            self.errors.append(invalid_value(path, s, "must be a schema object"))
            return _Node({}, path)
        n = _Node(s, path)
        if not isinstance(s.get("properties") or {}, dict):
            self.errors.append(invalid_value(f"{path}.properties", s["properties"], "must be a map of schemas"))
            return n
        if "pattern" in s:
            try:
                n.pattern = _go_regexp(s["pattern"])
            except (re.error, TypeError) as exc:
                self.errors.append(invalid_value(f"{path}.pattern", s["pattern"],
                                                 f"must be a valid regular expression: {exc}"))
        for k, ps in (s.get("properties") or {}).items():
            embedded = isinstance(ps, dict) and bool(ps.get("x-kubernetes-embedded-resource"))
            n.props[k] = self.node(ps, f"{path}.properties[{k}]", root=embedded, cardinality=cardinality)
        if isinstance(s.get("items"), dict):
            size = cel.decl_type(s).max_size if s.get("type") == "array" else 1
            items = s["items"]
            n.items = self.node(items, f"{path}.items", root=bool(items.get("x-kubernetes-embedded-resource")),
                                cardinality=cel.saturate(cardinality * max(size, 1)))
        addl = s.get("additionalProperties")
        if isinstance(addl, dict):
            size = cel.decl_type(s).max_size
            n.addl = self.node(
                addl,
                f"{path}.additionalProperties",
                root=bool(addl.get("x-kubernetes-embedded-resource")),
                cardinality=cel.saturate(cardinality * max(size, 1)),
            )
        elif addl is True:
            n.addl_allowed = True
        for comb in ("allOf", "anyOf", "oneOf"):
            if isinstance(s.get(comb), list):
                n.branches.append((comb, [self.node(b, f"{path}.{comb}[{i}]", root=False, cardinality=cardinality)
                                          for i, b in enumerate(s[comb])]))
        if isinstance(s.get("not"), dict):
            n.branches.append(("not", [self.node(s["not"], f"{path}.not", root=False, cardinality=cardinality)]))
        rules = s.get("x-kubernetes-validations") or []
        if rules:
            self_type = cel.decl_type(s, root)
            for i, r in enumerate(rules):
                self._rule(n, r, f"{path}.x-kubernetes-validations[{i}]", self_type, cardinality)
        n.has_rules_below = bool(n.rules) or any(
            c.has_rules_below for c in [*n.props.values(), n.items, n.addl] if c is not None) or any(
            b.has_rules_below for _, bs in n.branches for b in bs)
        return n

    def _rule(self, n: _Node, r: Any, rule_path: str, self_type: cel.CelType, cardinality: int) -> None:
        if not isinstance(r, dict) or not isinstance(r.get("rule"), str):
            self.errors.append(required(f"{rule_path}.rule"))
            return
        try:
            compiled = cel.compile_rule(r["rule"], self_type)
        except cel.CompileError as exc:
            self.errors.append(Cause(f"{rule_path}.rule", "FieldValueInvalid",
                                     f"Invalid value: {cel.go_struct_json(r)}: compilation failed: {exc.detail}"))
            return
        msg_prog = None
        if r.get("messageExpression"):
            try:
                msg_prog = cel.compile_rule(r["messageExpression"], self_type, result="string").program
            except cel.CompileError as exc:
                self.errors.append(Cause(f"{rule_path}.messageExpression", "FieldValueInvalid",
                                         f"Invalid value: {cel.go_struct_json(r)}: messageExpression compilation "
                                         f"failed: {exc.detail}"))
        cost = cel.saturate(compiled.max_cost * max(cardinality, 1))
        self.costs.append(RuleCost(f"{rule_path}.rule", cost))
        reason = r.get("reason")
        n.rules.append(_Rule(
            raw=r, rule=r["rule"], program=compiled.program, message=r.get("message"), message_program=msg_prog,
            field_path=r.get("fieldPath", ""), reason=reason if isinstance(reason, str) else None,
            transition=compiled.uses_old_self, cost=cost,
        ))


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


def _join(prefix: str, name: str) -> str:
    if not prefix:
        return name
    if not name:
        return prefix
    return prefix + ("" if name.startswith("[") else ".") + name


def _child(name: str, key: str) -> str:
    return f"{name}.{key}" if name else key


class Schema:
    """One CRD version's openAPIV3Schema, compiled."""

    def __init__(self, openapi_schema: JSON) -> None:
        compiler = _Compiler()
        self.raw = openapi_schema
        self.root = compiler.node(openapi_schema, "openAPIV3Schema", root=True, cardinality=1)
        self.rule_costs = compiler.costs
        if compiler.errors:
            raise SchemaError(compiler.errors)

    # ---- pruning ---------------------------------------------------------------------------

    def prune(self, obj: JSON) -> list[str]:
        """Drop fields the schema does not know (and non-nullable nulls); return unknown paths."""
        out: list[str] = []
        _prune(obj, self.root, "", out, root=True)
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            for k in list(meta):
                if k not in OBJECT_META_FIELDS:
                    del meta[k]
                    out.append(f"metadata.{k}")
        return out

    # ---- defaulting ------------------------------------------------------------------------

    def default(self, obj: JSON) -> None:
        _default(obj, self.root)

    # ---- validation ------------------------------------------------------------------------

    def validate(self, obj: JSON, old: JSON | None) -> list[Cause]:
        body = {k: v for k, v in obj.items() if k != "metadata"}
        old_body = None if old is None else {k: v for k, v in old.items() if k != "metadata"}
        if "metadata" in obj:
            body["metadata"] = {k: obj["metadata"][k] for k in ("name", "generateName", "namespace", "labels",
                                                                "annotations") if k in obj["metadata"]}
        if old_body is not None and old is not None and "metadata" in old:
            old_body["metadata"] = {k: old["metadata"][k] for k in ("name", "generateName", "namespace",
                                                                    "labels", "annotations") if k in old["metadata"]}
        return validate_value(self.root, body, old_body, old is not None, field_prefix="")


def _prune(value: Any, node: _Node, path: str, out: list[str], root: bool = False) -> None:
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
                _prune(value[k], sub, child_path, out)
            elif not (node.preserve or node.addl_allowed):
                del value[k]
                out.append(child_path)
    elif isinstance(value, list) and node.items is not None:
        for i, item in enumerate(value):
            _prune(item, node.items, f"{path}[{i}]", out)


def has_unknown_fields(node: _Node, value: Any) -> bool:
    """Whether pruning would change ``value`` (defaults must be given pruned)."""
    copy_ = copy.deepcopy(value)
    _prune(copy_, node, "", [], root=node.embedded)
    return bool(copy_ != value)


def _default(value: Any, node: _Node) -> None:
    if isinstance(value, dict):
        for k, sub in node.props.items():
            if k not in value and "default" in sub.s:
                value[k] = copy.deepcopy(sub.s["default"])
            if k in value:
                _default(value[k], sub)
        if node.addl is not None:
            for k, v in value.items():
                if k not in node.props:
                    _default(v, node.addl)
    elif isinstance(value, list) and node.items is not None:
        for item in value:
            _default(item, node.items)


def validate_value(node: _Node, value: Any, old: Any, has_old: bool, *, field_prefix: str) -> list[Cause]:
    """Validate ``value`` against ``node`` as kube-apiserver validates a custom resource.

    ``field_prefix`` is prepended to error field paths (the path of a default in a CRD); messages
    name the path inside the value, as kube-openapi does.
    """
    v = _Validator(field_prefix)
    v.schema(value, node, "", old, has_old)
    causes = v.schema_causes + v.list_causes
    if node.has_rules_below:
        if any(c.reason in _BLOCKING for c in causes):
            causes.append(Cause("<nil>", "FieldValueInvalid", "Invalid value: null: some validation rules were not "
                                "checked because the object was invalid; correct the existing errors to complete "
                                "validation"))
        else:
            v.rules(value, node, "", old, has_old)
            causes.extend(v.cel_causes)
    return causes


class _Validator:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.schema_causes: list[Cause] = []
        self.list_causes: list[Cause] = []
        self.cel_causes: list[Cause] = []

    def _field(self, name: str) -> str:
        f = _join(self.prefix, name)
        return f or "<root>"

    def schema(self, v: Any, node: _Node, name: str, old: Any, has_old: bool) -> None:
        s = node.s
        out = self.schema_causes
        where = self._field(name)
        if v is None:
            if not s.get("nullable") and s.get("type"):
                out.append(type_invalid(where, "null", f'{name} in body must be of type {s["type"]}: "null"'))
            return
        t = s.get("type")
        if s.get("x-kubernetes-int-or-string"):
            if not (isinstance(v, str) or _is_type(v, "integer")):
                out.append(type_invalid(where, _type_name(v),
                                        f'{name} in body must be of type integer,string: "{_type_name(v)}"'))
                return
        elif t and not _is_type(v, t):
            out.append(type_invalid(where, _type_name(v), f'{name} in body must be of type {t}: "{_type_name(v)}"'))
            return
        if "enum" in s and v not in s["enum"]:
            out.append(not_supported(where, v, s["enum"]))
        if isinstance(v, int | float) and not isinstance(v, bool):
            if "minimum" in s:
                if s.get("exclusiveMinimum") is True and v <= s["minimum"]:
                    out.append(invalid_value(where, v, f"{name} in body should be greater than {_num(s['minimum'])}"))
                elif v < s["minimum"]:
                    out.append(invalid_value(where, v,
                                             f"{name} in body should be greater than or equal to {_num(s['minimum'])}"))
            if "maximum" in s:
                if s.get("exclusiveMaximum") is True and v >= s["maximum"]:
                    out.append(invalid_value(where, v, f"{name} in body should be less than {_num(s['maximum'])}"))
                elif v > s["maximum"]:
                    out.append(invalid_value(where, v,
                                             f"{name} in body should be less than or equal to {_num(s['maximum'])}"))
            if "multipleOf" in s and s["multipleOf"] and (v / s["multipleOf"]) % 1 != 0:
                out.append(invalid_value(where, v, f"{name} in body should be a multiple of {_num(s['multipleOf'])}"))
        if isinstance(v, str):
            if "minLength" in s and len(v) < s["minLength"]:
                out.append(invalid_value(where, v, f"{name} in body should be at least {s['minLength']} chars long"))
            if "maxLength" in s and len(v) > s["maxLength"]:
                out.append(Cause(where, "FieldValueTooLong", f"Too long: may not be more than {s['maxLength']} bytes"))
            if node.pattern is not None and not node.pattern.search(v):
                out.append(invalid_value(where, v, f"{name} in body should match '{s['pattern']}'"))
        if isinstance(v, list):
            self._list(v, node, name, old)
        if isinstance(v, dict):
            for r in s.get("required") or []:
                if r not in v:
                    out.append(required(self._field(_child(name, r))))
            if "minProperties" in s and len(v) < s["minProperties"]:
                out.append(
                    invalid_value(where, v, f"{name} in body should have at least {s['minProperties']} properties")
                )
            if "maxProperties" in s and len(v) > s["maxProperties"]:
                out.append(too_many(where, len(v), s["maxProperties"]))
            for k, child in v.items():
                sub = node.props.get(k)
                child_name = _child(name, k)
                if sub is None and node.addl is not None:
                    sub = node.addl
                    child_name = f"{name}[{k}]"
                if sub is None:
                    continue
                o = old.get(k) if isinstance(old, dict) else None
                self.schema(child, sub, child_name, o, isinstance(old, dict) and k in old)
        for comb, branches in node.branches:
            results = []
            for b in branches:
                sub_v = _Validator(self.prefix)
                sub_v.schema(v, b, name, old, has_old)
                results.append(sub_v.schema_causes)
            if comb == "allOf":
                for rc in results:
                    out.extend(rc)
            elif comb == "anyOf" and all(results):
                out.append(invalid_value(where, v, f"{name} in body must match at least one schema (anyOf)"))
            elif comb == "oneOf" and sum(1 for rc in results if not rc) != 1:
                out.append(invalid_value(where, v, f"{name} in body must match exactly one schema (oneOf)"))
            elif comb == "not" and not results[0]:
                out.append(invalid_value(where, v, f"{name} in body must not match the schema (not)"))

    def _list(self, v: list[Any], node: _Node, name: str, old: Any) -> None:
        s = node.s
        where = self._field(name)
        if "minItems" in s and len(v) < s["minItems"]:
            self.schema_causes.append(
                invalid_value(where, v, f"{name} in body should have at least {s['minItems']} items")
            )
        if "maxItems" in s and len(v) > s["maxItems"]:
            self.schema_causes.append(too_many(where, len(v), s["maxItems"]))
        list_type = s.get("x-kubernetes-list-type")
        if s.get("uniqueItems") or list_type == "set":
            seen: set[str] = set()
            for i, item in enumerate(v):
                k = json.dumps(item, sort_keys=True)
                if k in seen:
                    self.list_causes.append(duplicate(self._field(f"{name}[{i}]"), item))
                seen.add(k)
        map_keys = s.get("x-kubernetes-list-map-keys") or []
        if list_type == "map" and map_keys:
            seen_keys: set[str] = set()
            for i, item in enumerate(v):
                if isinstance(item, dict):
                    k = json.dumps([item.get(mk) for mk in map_keys])
                    if k in seen_keys:
                        self.list_causes.append(duplicate(self._field(f"{name}[{i}]"),
                                                          {mk: item.get(mk) for mk in map_keys}))
                    seen_keys.add(k)
        if node.items is not None:
            for i, item in enumerate(v):
                self.schema(item, node.items, f"{name}[{i}]", None, False)

    # ---- CEL -------------------------------------------------------------------------------

    def rules(self, v: Any, node: _Node, name: str, old: Any, has_old: bool) -> None:
        if not node.has_rules_below or v is None:
            return
        if node.rules:
            self._cel(v, node, name, old, has_old)
        if isinstance(v, dict):
            for k, child in v.items():
                sub = node.props.get(k)
                child_name = _child(name, k)
                if sub is None and node.addl is not None:
                    sub, child_name = node.addl, f"{name}[{k}]"
                if sub is None:
                    continue
                o_has = isinstance(old, dict) and k in old
                self.rules(child, sub, child_name, old.get(k) if o_has else None, o_has)
        elif isinstance(v, list) and node.items is not None:
            old_items = _old_list_items(node, old)
            for i, item in enumerate(v):
                o, o_has = old_items(item)
                self.rules(item, node.items, f"{name}[{i}]", o, o_has)
        for _, branches in node.branches:
            for b in branches:
                self.rules(v, b, name, old, has_old)

    def _cel(self, v: Any, node: _Node, name: str, old: Any, has_old: bool) -> None:
        activation: dict[str, Any] = {"self": json_to_cel(v)}
        if has_old:
            activation["oldSelf"] = json_to_cel(old)
        type_name = node.s.get("type", "object")
        for r in node.rules:
            if r.transition and not has_old:
                continue
            result, err = cel.evaluate(r.program, activation)
            if err is not None:
                shown = r.message.strip() if r.message else r.rule.strip()
                self.cel_causes.append(invalid_value(self._field(name), type_name, f"{err} evaluating rule: {shown}"))
                continue
            if bool(result):
                continue
            message = r.message or f"failed rule: {r.rule}"
            if r.message_program is not None:
                m, merr = cel.evaluate(r.message_program, activation)
                if merr is None and isinstance(m, str) and m.strip():
                    message = str(m)
            where = self._field(_join(name, r.field_path.lstrip(".")) if r.field_path else name)
            if r.reason == "FieldValueRequired":
                self.cel_causes.append(Cause(where, r.reason, f"Required value: {message}"))
            elif r.reason == "FieldValueForbidden":
                self.cel_causes.append(Cause(where, r.reason, f"Forbidden: {message}"))
            elif r.reason == "FieldValueDuplicate":
                self.cel_causes.append(Cause(where, r.reason, f"Duplicate value: {message}"))
            else:
                self.cel_causes.append(Cause(where, "FieldValueInvalid", f"Invalid value: {message}"))


def _old_list_items(node: _Node, old: Any) -> Any:
    """Correlate list items with their old values (only for list-type map, by key)."""
    keys = node.s.get("x-kubernetes-list-map-keys") or []
    index: dict[str, Any] = {}
    if node.s.get("x-kubernetes-list-type") == "map" and keys and isinstance(old, list):
        for item in old:
            if isinstance(item, dict):
                index[json.dumps([item.get(k) for k in keys])] = item

    def lookup(item: Any) -> tuple[Any, bool]:
        if not index or not isinstance(item, dict):
            return None, False
        k = json.dumps([item.get(mk) for mk in keys])
        return index.get(k), k in index

    return lookup
