"""CEL for CRD validation rules, checked the way kube-apiserver checks them.

kube-apiserver compiles every ``x-kubernetes-validations`` rule with cel-go against a type
derived from the rule's schema node, and refuses the CRD when a rule does not parse, names a
field the schema does not declare, or has an estimated worst-case cost over the budget. This
module does the same in three steps over cel-python's parse tree:

1. **Parse** with cel-python's grammar; syntax errors are reported in cel-go's form
   (``ERROR: <input>:1:9: Syntax error: mismatched input '<EOF>' expecting {...}``).
2. **Check**: the tree becomes a small AST; field selections on ``self``/``oldSelf`` and the
   variables of comprehension macros are resolved against the schema's declared type (object
   fields, maps, lists, scalars), reporting ``undefined field 'x'`` and ``undeclared reference``
   like cel-go. Function overloads are not type-checked (cel-go does; we accept more there).
3. **Estimate the cost**, following cel-go's static cost model (``checker/cost.go``): 1 per
   identifier, field selection and O(1) call; string and list traversals scaled by their maximum
   size (0.1 per byte, regex 0.25 per byte of pattern); comprehensions multiply their loop body by
   the range's maximum size. Maximum sizes come from ``maxLength``/``maxItems``/``maxProperties``,
   or, where unbounded, from the 3 MiB request limit divided by the element's smallest JSON
   form, exactly as Kubernetes estimates them. The rule's cost times the number of times it can
   run (the product of the enclosing lists' and maps' sizes) is compared with the per-rule limit
   (10^7) and the per-CRD total (10^8). The estimate is close to cel-go's, not equal: it rejects
   quadratic rules over unbounded lists and accepts bounded ones, which is what matters.

Evaluation reuses cel-python with cel-go's error semantics for ``&&``/``||`` (the first error
wins when neither side decides) and cel-go's error messages (``no such key: x``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import celpy
import lark
from celpy import celparser
from celpy.evaluation import CELEvalError, Evaluator

JSON = dict[str, Any]

MAX_REQUEST_SIZE_BYTES = 3 * 1024 * 1024
PER_RULE_COST_LIMIT = 10_000_000
"""StaticEstimatedCostLimit of apiextensions-apiserver."""
PER_CRD_COST_LIMIT = 100_000_000
"""StaticEstimatedCRDCostLimit."""
_UNBOUNDED = 2**63 - 1

_STRING_TRAVERSAL = 0.1
_REGEX_LENGTH = 0.25


# ---- types --------------------------------------------------------------------------------------


@dataclass(eq=False)
class CelType:
    """A declared type: kind plus, for containers, element types and the maximum size."""

    kind: str  # object map list string bytes int uint double bool null dyn duration timestamp
    fields: dict[str, CelType] = field(default_factory=dict)
    elem: CelType | None = None
    max_size: int = 0
    """Maximum elements (lists, maps) or bytes (strings)."""
    min_serialized: int = 1

    @property
    def sized(self) -> bool:
        return self.kind in ("string", "bytes", "list", "map")


DYN = CelType("dyn", max_size=_UNBOUNDED)
INT = CelType("int")
UINT = CelType("uint")
DOUBLE = CelType("double")
BOOL = CelType("bool", min_serialized=4)
NULL = CelType("null", min_serialized=4)


def _max_list_items(min_size: int) -> int:
    return (MAX_REQUEST_SIZE_BYTES - 2) // (min_size + 1)


def _max_map_entries(min_size: int) -> int:
    return (MAX_REQUEST_SIZE_BYTES - 2) // (min_size + 6)


def decl_type(s: JSON, root: bool = False) -> CelType:
    """The type a CEL rule sees for a value of schema ``s`` (``SchemaDeclType`` upstream)."""
    if s.get("x-kubernetes-int-or-string"):
        return CelType("dyn", max_size=MAX_REQUEST_SIZE_BYTES - 2)
    t = s.get("type")
    if t == "array":
        items = s.get("items")
        elem = decl_type(items, bool(items.get("x-kubernetes-embedded-resource"))) if isinstance(items, dict) else DYN
        n = s["maxItems"] if isinstance(s.get("maxItems"), int) else _max_list_items(elem.min_serialized)
        return CelType("list", elem=elem, max_size=max(0, n), min_serialized=2)
    if t == "object" or root:
        addl = s.get("additionalProperties")
        if isinstance(addl, dict):
            elem = decl_type(addl, bool(addl.get("x-kubernetes-embedded-resource")))
            n = s["maxProperties"] if isinstance(s.get("maxProperties"), int) else _max_map_entries(elem.min_serialized)
            return CelType("map", elem=elem, max_size=max(0, n), min_serialized=2)
        fields: dict[str, CelType] = {}
        required = set(s.get("required") or [])
        min_size = 2
        for name, prop in (s.get("properties") or {}).items():
            if not isinstance(prop, dict):
                continue
            ft = decl_type(prop, bool(prop.get("x-kubernetes-embedded-resource")))
            fields[name] = ft
            if name in required and "default" not in prop:
                min_size += len(name) + ft.min_serialized + 4
        if root:
            string = CelType("string", max_size=MAX_REQUEST_SIZE_BYTES - 2, min_serialized=2)
            fields.setdefault("apiVersion", string)
            fields.setdefault("kind", string)
            meta = fields.get("metadata")
            if meta is None or meta.kind != "object":
                meta = CelType("object", min_serialized=2)
                fields["metadata"] = meta
            meta.fields.setdefault("name", string)
            meta.fields.setdefault("generateName", string)
        return CelType("object", fields=fields, min_serialized=min_size)
    if t == "string":
        if s.get("format") == "byte":
            base = CelType("bytes", min_serialized=2)
        elif s.get("format") == "duration":
            return CelType("duration", min_serialized=2)
        elif s.get("format") in ("date", "date-time"):
            return CelType("timestamp", min_serialized=2)
        else:
            base = CelType("string", min_serialized=2)
        if isinstance(s.get("maxLength"), int):
            base.max_size = max(0, s["maxLength"]) * 4
        elif isinstance(s.get("enum"), list) and s["enum"]:
            base.max_size = max(len(str(e)) for e in s["enum"])
        else:
            base.max_size = MAX_REQUEST_SIZE_BYTES - 2
        return base
    if t == "integer":
        return INT
    if t == "number":
        return DOUBLE
    if t == "boolean":
        return BOOL
    return DYN


# ---- the AST ------------------------------------------------------------------------------------


@dataclass
class Node:
    op: str
    """lit ident select has index call list map cond comp."""
    pos: int
    args: list[Node] = field(default_factory=list)
    name: str = ""
    """Identifier, field or function name; the macro for comprehensions."""
    value: Any = None
    target: Node | None = None
    var: str = ""


_MACROS_2 = {"all", "exists", "exists_one", "filter", "map"}


class _Builder:
    """lark tree -> Node (cel-python's tree keeps every precedence level; this flattens it)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._line_starts = [0]
        for i, ch in enumerate(text):
            if ch == "\n":
                self._line_starts.append(i + 1)

    def offset(self, line: int | None, column: int | None) -> int:
        if not line or not column:
            return 0
        return self._line_starts[line - 1] + column - 1

    def _pos(self, t: lark.Tree[Any] | lark.Token) -> int:
        if isinstance(t, lark.Token):
            return self.offset(t.line, t.column)
        meta = t.meta
        return self.offset(getattr(meta, "line", None), getattr(meta, "column", None))

    def _dot_before(self, tok: lark.Token) -> int:
        i = self.offset(tok.line, tok.column) - 1
        while i > 0 and self.text[i] != ".":
            i -= 1
        return max(i, 0)

    def build(self, t: lark.Tree[Any] | lark.Token) -> Node:
        if isinstance(t, lark.Token):
            raise ValueError(f"unexpected token {t!r}")
        kids = t.children
        d = t.data
        if d == "expr":
            if len(kids) == 1:
                return self.build(kids[0])
            return Node("cond", self._pos(t), [self.build(k) for k in kids])
        if d in ("conditionalor", "conditionaland"):
            if len(kids) == 1:
                return self.build(kids[0])
            fn = "_||_" if d == "conditionalor" else "_&&_"
            return Node("call", self._pos(t), [self.build(kids[0]), self.build(kids[1])], name=fn)
        if d in ("relation", "addition", "multiplication"):
            if len(kids) == 1:
                return self.build(kids[0])
            op_tree, right = kids
            assert isinstance(op_tree, lark.Tree)
            fn = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_gt": "_>_", "relation_ge": "_>=_",
                  "relation_eq": "_==_", "relation_ne": "_!=_", "relation_in": "@in", "addition_add": "_+_",
                  "addition_sub": "_-_", "multiplication_mul": "_*_", "multiplication_div": "_/_",
                  "multiplication_mod": "_%_"}[str(op_tree.data)]
            return Node("call", self._pos(t), [self.build(op_tree.children[0]), self.build(right)], name=fn)
        if d == "unary":
            if len(kids) == 1:
                return self.build(kids[0])
            op_tree, operand = kids
            assert isinstance(op_tree, lark.Tree)
            fn = "!_" if op_tree.data == "unary_not" else "-_"
            return Node("call", self._pos(t), [self.build(operand)], name=fn)
        if d in ("member", "primary"):
            return self.build(kids[0])
        if d == "member_dot":
            operand, ident = kids
            assert isinstance(ident, lark.Token)
            return Node("select", self._dot_before(ident), [self.build(operand)], name=str(ident))
        if d == "member_dot_arg":
            operand, ident = kids[0], kids[1]
            assert isinstance(ident, lark.Token)
            raw_args = kids[2].children if len(kids) > 2 and isinstance(kids[2], lark.Tree) else []
            name = str(ident)
            pos = self._dot_before(ident)
            if name in _MACROS_2 and len(raw_args) in (2, 3):
                var_node = self.build(raw_args[0])
                if var_node.op != "ident":
                    raise _CheckError(var_node.pos, "argument is not an identifier")
                body = [self.build(a) for a in raw_args[1:]]
                return Node("comp", pos, body, name=name, target=self.build(operand), var=var_node.name)
            return Node("call", pos, [self.build(a) for a in raw_args], name=name, target=self.build(operand))
        if d == "member_index":
            operand, index = kids
            return Node("index", self._pos(index) - 1, [self.build(operand), self.build(index)])
        if d == "member_object":
            return Node("call", self._pos(t), [], name="<message>")
        if d == "ident":
            tok = kids[0]
            assert isinstance(tok, lark.Token)
            return Node("ident", self._pos(tok), name=str(tok))
        if d == "dot_ident":
            tok = kids[0]
            assert isinstance(tok, lark.Token)
            return Node("ident", self._pos(tok), name=str(tok))
        if d in ("ident_arg", "dot_ident_arg"):
            tok = kids[0]
            assert isinstance(tok, lark.Token)
            raw_args = kids[1].children if len(kids) > 1 and isinstance(kids[1], lark.Tree) else []
            if str(tok) == "has":
                if len(raw_args) != 1:
                    raise _CheckError(self._pos(tok), "invalid argument to has() macro")
                inner = self.build(raw_args[0])
                if inner.op != "select":
                    raise _CheckError(inner.pos, "invalid argument to has() macro")
                return Node("has", inner.pos, inner.args, name=inner.name)
            return Node("call", self._pos(tok), [self.build(a) for a in raw_args], name=str(tok))
        if d == "paren_expr":
            return self.build(kids[0])
        if d == "list_lit":
            items = kids[0].children if kids and isinstance(kids[0], lark.Tree) else []
            return Node("list", self._pos(t), [self.build(a) for a in items])
        if d == "map_lit":
            items = kids[0].children if kids and isinstance(kids[0], lark.Tree) else []
            return Node("map", self._pos(t), [self.build(a) for a in items])
        if d == "literal":
            tok = kids[0]
            assert isinstance(tok, lark.Token)
            kind = {"UINT_LIT": "uint", "FLOAT_LIT": "double", "INT_LIT": "int", "MLSTRING_LIT": "string",
                    "STRING_LIT": "string", "BYTES_LIT": "bytes", "BOOL_LIT": "bool", "NULL_LIT": "null"}[tok.type]
            value: Any = str(tok)
            if kind == "string":
                value = _string_literal_length(str(tok))
            return Node("lit", self._pos(tok), name=kind, value=value)
        raise ValueError(f"unexpected CEL tree node {d}")


def _string_literal_length(raw: str) -> int:
    body = raw.lstrip("rRbB")
    quote = 3 if body[:3] in ('"""', "'''") else 1
    return max(0, len(body) - 2 * quote)


# ---- errors -------------------------------------------------------------------------------------


class _CheckError(Exception):
    def __init__(self, pos: int, message: str) -> None:
        super().__init__(message)
        self.pos = pos
        self.message = message


def _format_issue(text: str, pos: int, message: str) -> str:
    """One issue in cel-go's ``ERROR: <input>:line:col: message`` form with the source line."""
    line_no = text.count("\n", 0, pos) + 1
    line_start = text.rfind("\n", 0, pos) + 1
    line_end = text.find("\n", pos)
    line = text[line_start:] if line_end < 0 else text[line_start:line_end]
    col = pos - line_start
    return f"ERROR: <input>:{line_no}:{col + 1}: {message}\n | {line}\n | {'.' * col}^"


_EXPR_START = ("{'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, "
               "STRING, BYTES, IDENTIFIER}")
_TERMINALS = {
    "RPAR": "')'", "LPAR": "'('", "RSQB": "']'", "LSQB": "'['", "RBRACE": "'}'", "LBRACE": "'{'",
    "COMMA": "','", "COLON": "':'", "DOT": "'.'", "QMARK": "'?'", "IDENT": "IDENTIFIER",
}
_STARTS = {"IDENT", "INT_LIT", "UINT_LIT", "FLOAT_LIT", "STRING_LIT", "MLSTRING_LIT", "BYTES_LIT", "BOOL_LIT",
           "NULL_LIT", "LPAR", "LSQB", "LBRACE", "BANG", "MINUS"}


def _syntax_error(text: str, exc: Exception) -> str:
    if isinstance(exc, lark.exceptions.UnexpectedToken):
        tok = exc.token
        at_end = tok.type == "$END"
        pos = len(text) if at_end else _Builder(text).offset(tok.line, tok.column)
        found = "<EOF>" if at_end else str(tok)
        expected = set(exc.expected or ())
        if expected & _STARTS:
            want = _EXPR_START
        else:
            names = sorted(_TERMINALS.get(e, f"'{e.lower()}'") for e in expected)
            want = names[0] if len(names) == 1 else "{" + ", ".join(names) + "}"
        return _format_issue(text, pos, f"Syntax error: mismatched input '{found}' expecting {want}")
    if isinstance(exc, lark.exceptions.UnexpectedCharacters):
        pos = _Builder(text).offset(exc.line, exc.column)
        return _format_issue(text, pos, f"Syntax error: token recognition error at: '{text[pos:pos + 1]}'")
    return _format_issue(text, 0, f"Syntax error: {exc}")


_PARSER = celparser.CELParser()


def parse(text: str) -> lark.Tree[Any]:
    """cel-python's parse tree, or CompileError with cel-go's message."""
    if not text.strip():
        raise CompileError(_format_issue(text, 0, "Syntax error: mismatched input '<EOF>' expecting " + _EXPR_START))
    parser = celparser.CELParser.CEL_PARSER
    assert parser is not None
    try:
        tree: lark.Tree[Any] = parser.parse(text)
    except lark.exceptions.LarkError as exc:
        raise CompileError(_syntax_error(text, exc)) from None
    return tree


class CompileError(Exception):
    """A rule that does not compile; ``detail`` is cel-go's issue text."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


# ---- checking and cost --------------------------------------------------------------------------


@dataclass
class Cost:
    lo: int = 0
    hi: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(saturate(self.lo + other.lo), saturate(self.hi + other.hi))


def saturate(v: float) -> int:
    """An estimate capped at the largest int64 (cel-go saturates its cost arithmetic)."""
    return int(min(v, _UNBOUNDED))


def _factor(size: int, f: float) -> int:
    return saturate(math.ceil(size * f))


@dataclass
class _Typed:
    type: CelType
    cost: Cost
    size: int
    """Maximum size of the value (strings: bytes; lists, maps: elements; scalars: 1)."""


class _Checker:
    def __init__(self, text: str, variables: dict[str, CelType]) -> None:
        self.text = text
        self.scopes: list[dict[str, CelType]] = [dict(variables)]
        self.issues: list[tuple[int, str]] = []

    def lookup(self, name: str) -> CelType | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def _size_of(self, t: CelType) -> int:
        if t.sized:
            return t.max_size
        if t.kind == "dyn":
            return _UNBOUNDED
        return 1

    def check(self, n: Node) -> _Typed:
        if n.op == "lit":
            kind = str(n.name)
            t = {"int": INT, "uint": UINT, "double": DOUBLE, "bool": BOOL, "null": NULL}.get(kind)
            if t is not None:
                return _Typed(t, Cost(), 1)
            size = int(n.value) if isinstance(n.value, int) else 0
            return _Typed(CelType(kind, max_size=size), Cost(), size)
        if n.op == "ident":
            t = self.lookup(n.name)
            if t is None:
                self.issues.append((n.pos, f"undeclared reference to '{n.name}' (in container '')"))
                t = DYN
            return _Typed(t, Cost(1, 1), self._size_of(t))
        if n.op in ("select", "has"):
            operand = self.check(n.args[0])
            t = self._field(operand.type, n)
            cost = operand.cost + Cost(1, 1)
            if n.op == "has":
                return _Typed(BOOL, cost, 1)
            return _Typed(t, cost, self._size_of(t))
        if n.op == "index":
            operand, index = self.check(n.args[0]), self.check(n.args[1])
            t = operand.type.elem if operand.type.kind in ("list", "map") and operand.type.elem else DYN
            return _Typed(t, operand.cost + index.cost + Cost(1, 1), self._size_of(t))
        if n.op == "list":
            items = [self.check(a) for a in n.args]
            cost = Cost(1, 1)
            for i in items:
                cost = cost + i.cost
            elem = items[0].type if items else DYN
            return _Typed(CelType("list", elem=elem, max_size=len(items)), cost, len(items))
        if n.op == "map":
            parts = [self.check(a) for a in n.args]
            cost = Cost(1, 1)
            for p in parts:
                cost = cost + p.cost
            elem = parts[1].type if len(parts) > 1 else DYN
            return _Typed(CelType("map", elem=elem, max_size=len(parts) // 2), cost, len(parts) // 2)
        if n.op == "cond":
            c, a, b = (self.check(x) for x in n.args)
            cost = c.cost + Cost(min(a.cost.lo, b.cost.lo), max(a.cost.hi, b.cost.hi))
            return _Typed(a.type if a.type.kind == b.type.kind else DYN, cost, max(a.size, b.size))
        if n.op == "comp":
            return self._comprehension(n)
        return self._call(n)

    def _field(self, t: CelType, n: Node) -> CelType:
        if t.kind == "object":
            ft = t.fields.get(n.name)
            if ft is None:
                self.issues.append((n.pos, f"undefined field '{n.name}'"))
                return DYN
            return ft
        if t.kind == "map":
            return t.elem or DYN
        return DYN

    def _comprehension(self, n: Node) -> _Typed:
        assert n.target is not None
        rng = self.check(n.target)
        if rng.type.kind == "list":
            var_t = rng.type.elem or DYN
        elif rng.type.kind == "map":
            var_t = CelType("string", max_size=MAX_REQUEST_SIZE_BYTES - 2)
        else:
            var_t = DYN
        self.scopes.append({n.var: var_t})
        try:
            body = [self.check(b) for b in n.args]
        finally:
            self.scopes.pop()
        accu, step_extra = Cost(1, 1), Cost()
        if n.name in ("all", "exists"):
            loop = Cost(2, 2) + accu + body[0].cost
            result_t, size = BOOL, 1
        elif n.name == "exists_one":
            loop = body[0].cost + Cost(2, 2)
            step_extra = Cost(2, 2)
            result_t, size = BOOL, 1
        elif n.name == "filter":
            loop = body[0].cost + Cost(3, 3)
            result_t, size = CelType("list", elem=var_t, max_size=rng.size), rng.size
        else:  # map, with an optional filter
            loop = Cost(2, 2) + body[-1].cost + (body[0].cost if len(body) == 2 else Cost())
            result_t = CelType("list", elem=body[-1].type, max_size=rng.size)
            size = rng.size
        total = rng.cost + Cost(1, 1) + step_extra + Cost(0, saturate(loop.hi * rng.size))
        return _Typed(result_t, total, size)

    def _call(self, n: Node) -> _Typed:
        target = self.check(n.target) if n.target is not None else None
        args = [self.check(a) for a in n.args]
        arg_sum = target.cost if target is not None else Cost()
        for a in args:
            arg_sum = arg_sum + a.cost
        fn = n.name
        if fn in ("_&&_", "_||_"):
            lhs, rhs = args
            return _Typed(BOOL, Cost(lhs.cost.lo, (lhs.cost + rhs.cost).hi), 1)
        if fn in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"):
            smallest = min(args[0].size, args[1].size)
            traversal = Cost(1 if smallest > 0 else 0, _factor(smallest, _STRING_TRAVERSAL))
            return _Typed(BOOL, traversal + arg_sum, 1)
        if fn == "@in":
            coll = args[1]
            per = coll.size if coll.type.kind in ("list", "dyn") else 1
            return _Typed(BOOL, Cost(1, per) + arg_sum, 1)
        if fn == "_+_" and args and args[0].type.kind in ("string", "bytes", "list"):
            size = saturate(args[0].size + args[1].size)
            if args[0].type.kind == "list":
                return _Typed(args[0].type, Cost(1, 1) + arg_sum, size)
            return _Typed(
                CelType(args[0].type.kind, max_size=size), Cost(0, _factor(size, _STRING_TRAVERSAL)) + arg_sum, size
            )
        if target is not None and fn in ("startsWith", "endsWith") and len(args) == 1:
            return _Typed(BOOL, Cost(0, _factor(args[0].size, _STRING_TRAVERSAL)) + arg_sum, 1)
        if target is not None and fn == "contains" and len(args) == 1:
            return _Typed(BOOL, Cost(0, saturate(_factor(target.size, _STRING_TRAVERSAL) *
                                             _factor(args[0].size, _STRING_TRAVERSAL))) + arg_sum, 1)
        if fn == "matches" and (target is not None or len(args) == 2):
            s, pattern = (target, args[0]) if target is not None else (args[0], args[1])
            cost = saturate(_factor(saturate(s.size + 1), _STRING_TRAVERSAL) * _factor(pattern.size, _REGEX_LENGTH))
            return _Typed(BOOL, Cost(0, cost) + arg_sum, 1)
        if fn == "size":
            return _Typed(INT, Cost(1, 1) + arg_sum, 1)
        if fn in ("int", "uint", "double", "string", "bool", "bytes", "duration", "timestamp", "dyn", "type"):
            kind = {"int": INT, "uint": UINT, "double": DOUBLE, "bool": BOOL}.get(fn)
            t = kind or CelType(fn if fn in ("string", "bytes", "duration", "timestamp") else "dyn",
                                max_size=args[0].size if args else 0)
            return _Typed(t, Cost(1, 1) + arg_sum, self._size_of(t) if t.sized else 1)
        if fn in ("_-_", "_*_", "_/_", "_%_", "_+_", "-_"):
            t = args[0].type if args and args[0].type.kind in ("int", "uint", "double") else DYN
            return _Typed(t, Cost(1, 1) + arg_sum, 1)
        if fn == "!_":
            return _Typed(BOOL, Cost(1, 1) + arg_sum, 1)
        # Any other function (the Kubernetes CEL libraries among them): O(1), as cel-go's default.
        return _Typed(DYN, Cost(1, 1) + arg_sum, _UNBOUNDED)


#: Identifiers cel-go declares besides ``self``/``oldSelf``: the type names, and the namespaces of
#: the extension libraries Kubernetes enables (their functions are called as ``math.greatest(...)``).
_GLOBALS = ("int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type",
            "optional", "math", "strings", "sets", "lists", "base64", "encoders")


@dataclass
class CompiledRule:
    text: str
    program: celpy.Runner
    max_cost: int
    uses_old_self: bool


def compile_rule(text: str, self_type: CelType, *, old_self: bool = True,
                 result: str | None = "bool") -> CompiledRule:
    """Parse, check and cost ``text`` with ``self`` (and ``oldSelf``) of ``self_type``.

    Raises :class:`CompileError` with cel-go's issue text.
    """
    tree = parse(text)
    builder = _Builder(text)
    try:
        ast = builder.build(tree)
    except _CheckError as exc:
        raise CompileError(_format_issue(text, exc.pos, exc.message)) from None
    variables = {name: DYN for name in _GLOBALS}
    variables["self"] = self_type
    if old_self:
        variables["oldSelf"] = self_type
    checker = _Checker(text, variables)
    typed = checker.check(ast)
    if checker.issues:
        raise CompileError("\n".join(_format_issue(text, p, m) for p, m in sorted(checker.issues)))
    if result == "bool" and typed.type.kind not in ("bool", "dyn"):
        raise CompileError("cel expression must evaluate to a bool")
    if result == "string" and typed.type.kind not in ("string", "dyn"):
        raise CompileError("must evaluate to a string")
    uses_old = re.search(r"\boldSelf\b", text) is not None
    return CompiledRule(text, _ENV.program(tree), typed.cost.hi, uses_old)


def check_expression(text: str, variables: dict[str, CelType]) -> str:
    """Parse and type-check ``text`` with ``variables`` declared (DRA's ``device``); the kind of
    its result. Raises :class:`CompileError` with cel-go's issue text."""
    tree = parse(text)
    try:
        ast = _Builder(text).build(tree)
    except _CheckError as exc:
        raise CompileError(_format_issue(text, exc.pos, exc.message)) from None
    checker = _Checker(text, {**{name: DYN for name in _GLOBALS}, **variables})
    typed = checker.check(ast)
    if checker.issues:
        raise CompileError("\n".join(_format_issue(text, p, m) for p, m in sorted(checker.issues)))
    return typed.type.kind


# ---- evaluation ---------------------------------------------------------------------------------


class _GoEvaluator(Evaluator):
    """cel-python's evaluator with cel-go's semantics where two errors meet in ``&&``/``||``."""

    def _logical(self, tree: lark.Tree[Any], decisive: bool) -> Any:
        if len(tree.children) == 1:
            return self.visit_children(tree)[0]
        left, right = self.visit_children(tree)
        for v in (left, right):
            if isinstance(v, celpy.celtypes.BoolType) and bool(v) is decisive:
                return celpy.celtypes.BoolType(decisive)
        for v in (left, right):
            if isinstance(v, CELEvalError):
                return v
        if isinstance(left, celpy.celtypes.BoolType) and isinstance(right, celpy.celtypes.BoolType):
            return celpy.celtypes.BoolType(not decisive)
        return CELEvalError("no such overload", TypeError, None, tree=tree)

    def conditionalor(self, tree: lark.Tree[Any]) -> Any:
        return self._logical(tree, True)

    def macro_has_eval(self, exprlist: lark.Tree[Any]) -> Any:
        """``has(e.f)``: an error in ``e`` is an error (cel-python answers false)."""
        node: Any = exprlist.children[0]
        while isinstance(node, lark.Tree) and node.data != "member_dot" and len(node.children) == 1:
            node = node.children[0]
        if not (isinstance(node, lark.Tree) and node.data == "member_dot"):
            return super().macro_has_eval(exprlist)
        operand = self.visit(node.children[0])
        if isinstance(operand, CELEvalError):
            return operand
        if isinstance(operand, celpy.celtypes.MapType):
            return celpy.celtypes.BoolType(celpy.celtypes.StringType(str(node.children[1])) in operand)
        return CELEvalError("no such overload", TypeError, None, tree=node)

    def conditionaland(self, tree: lark.Tree[Any]) -> Any:
        return self._logical(tree, False)


class _GoRunner(celpy.InterpretedRunner):
    def evaluate(self, context: Any) -> Any:
        return _GoEvaluator(ast=self.ast, activation=self.new_activation()).evaluate(context)


_ENV = celpy.Environment(runner_class=_GoRunner)


def go_error(exc: BaseException) -> str:
    """cel-python's evaluation error as cel-go words it."""
    args = exc.args
    msg = str(args[0]) if args else str(exc)
    m = re.match(r"no such member in mapping: '(.*)'$", msg)
    if m:
        return f"no such key: {m.group(1)}"
    if msg == "no such key" and len(args) > 2 and args[2]:
        return f"no such key: {args[2][0]}"
    if msg == "modulus or divide by zero":
        tree = getattr(exc, "tree", None)
        return "modulus by zero" if tree is not None and "%" in celparser.tree_dump(tree) else "division by zero"
    if msg == "return error for overflow":
        return "integer overflow"
    if msg.startswith("found no matching overload"):
        return "no such overload"
    return msg


def evaluate(program: celpy.Runner, activation: dict[str, Any]) -> tuple[Any, str | None]:
    """(result, None) or (None, cel-go error message)."""
    try:
        result = program.evaluate(activation)
    except CELEvalError as exc:
        return None, go_error(exc)
    except Exception as exc:  # cel-python raises plain exceptions for some type errors
        return None, str(exc) or type(exc).__name__
    if isinstance(result, CELEvalError):
        return None, go_error(result)
    return result, None


def cost_factor_message(name: str, cost: int, limit: int) -> str:
    """apiextensions' ``getCostErrorMessage``."""
    factor = cost / limit
    if factor > 100.0:
        f = "more than 100x"
    elif factor < 1.5:
        f = f"{factor:f}x"
    else:
        f = f"{factor:.1f}x"
    return (f"{name} exceeds budget by factor of {f} (try simplifying the rule, or adding maxItems, "
            "maxProperties, and maxLength where arrays, maps, and strings are declared)")


def go_struct_json(rule: JSON) -> str:
    """A ValidationRule as Go's ``%v`` of the internal struct prints in field errors."""
    out = {"Rule": rule.get("rule", ""), "Message": rule.get("message", ""),
           "MessageExpression": rule.get("messageExpression", ""), "Reason": rule.get("reason"),
           "FieldPath": rule.get("fieldPath", ""), "OptionalOldSelf": rule.get("optionalOldSelf")}
    text = json.dumps(out, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
