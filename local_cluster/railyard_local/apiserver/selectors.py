"""Label and field selectors, parsed as apimachinery parses them (and failing with its words)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import APIError
from .names import LABEL_NAME

Matcher = Callable[[dict[str, Any]], bool]

Requirement = tuple[str, str, frozenset[str]]
"""(key, op, values); op is one of exists ! = != in notin gt lt."""

# ---- the label selector lexer and parser (k8s.io/apimachinery/pkg/labels/selector.go) -------------

_SPECIAL = ("!=", "==", "=", "!", "(", ")", ",", ">", "<")
_SPECIAL_CHARS = set("=!(),><")
_BINARY_OPERATORS = "in, notin, =, ==, !=, gt, lt"
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class _SelectorError(Exception):
    pass


def _lex(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
            continue
        if ch in _SPECIAL_CHARS:
            sym = next(s for s in _SPECIAL if text.startswith(s, i))
            out.append((sym, sym))
            i += len(sym)
            continue
        j = i
        while j < len(text) and not text[j].isspace() and text[j] not in _SPECIAL_CHARS:
            j += 1
        word = text[i:j]
        out.append(({"in": "in", "notin": "notin"}.get(word, "id"), word))
        i = j
    out.append(("eos", ""))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.items = _lex(text)
        self.pos = 0

    def lookahead(self, values: bool = True) -> tuple[str, str]:
        tok, lit = self.items[self.pos]
        if values and tok in ("in", "notin"):
            tok = "id"
        return tok, lit

    def consume(self, values: bool = True) -> tuple[str, str]:
        tok, lit = self.lookahead(values)
        if self.pos < len(self.items) - 1:
            self.pos += 1
        return tok, lit

    def parse(self) -> list[Requirement]:
        reqs: list[Requirement] = []
        while True:
            tok, lit = self.lookahead()
            if tok in ("id", "!"):
                try:
                    reqs.append(self.requirement())
                except _SelectorError as exc:
                    raise _SelectorError(f"unable to parse requirement: {exc}") from None
                t, lit2 = self.consume()
                if t == "eos":
                    return reqs
                if t == ",":
                    t2, l2 = self.lookahead()
                    if t2 not in ("id", "!"):
                        raise _SelectorError(f"found '{l2}', expected: identifier after ','")
                    continue
                raise _SelectorError(f"found '{lit2}', expected: ',' or 'end of string'")
            if tok == "eos":
                return reqs
            raise _SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")

    def requirement(self) -> Requirement:
        op = ""
        tok, lit = self.consume()
        if tok == "!":
            op = "!"
            tok, lit = self.consume()
        if tok != "id":
            raise _SelectorError(f"found '{lit}', expected: identifier")
        _validate_key(lit)
        key = lit
        nxt, _ = self.lookahead()
        if nxt in ("eos", ","):
            return (key, op or "exists", frozenset())
        if op == "!":
            raise _SelectorError(f"found '{self.lookahead()[1]}', expected: ',' or 'end of string'")
        tok, lit = self.consume(values=False)
        ops = {"in": "in", "notin": "notin", "=": "=", "==": "=", "!=": "!=", ">": "gt", "<": "lt"}
        if tok not in ops:
            raise _SelectorError(f"found '{lit}', expected: {_BINARY_OPERATORS}")
        op = ops[tok]
        values = self.values() if op in ("in", "notin") else self.exact_value()
        for i, v in enumerate(sorted(values)):
            if not _LABEL_VALUE.match(v) or len(v) > 63:
                raise _SelectorError(
                    f'values[{i}][{key}]: Invalid value: "{v}": a valid label must be an empty string or consist '
                    "of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric "
                    "character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is "
                    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
        if op in ("gt", "lt"):
            if len(values) != 1:
                raise _SelectorError(
                    "values: Invalid value: []: for 'Gt', 'Lt' operators, exactly one value is required"
                )
            (v,) = values
            if not re.fullmatch(r"[+-]?\d+", v):
                raise _SelectorError(f"values[0]: Invalid value: \"{v}\": for 'Gt', 'Lt' operators, the value must be "
                                     "an integer")
        return (key, op, frozenset(values))

    def values(self) -> set[str]:
        tok, lit = self.consume()
        if tok != "(":
            raise _SelectorError(f"found '{lit}' expected: '('")
        tok, lit = self.lookahead()
        if tok in ("id", ","):
            s = self.identifiers()
            tok, _ = self.consume()
            if tok != ")":
                raise _SelectorError(f"found '{lit}', expected: ')'")
            return s
        if tok == ")":
            self.consume()
            return {""}
        raise _SelectorError(f"found '{lit}', expected: ',', ')' or identifier")

    def identifiers(self) -> set[str]:
        s: set[str] = set()
        while True:
            tok, lit = self.consume()
            if tok == "id":
                s.add(lit)
                tok2, lit2 = self.lookahead()
                if tok2 == ",":
                    continue
                if tok2 == ")":
                    return s
                raise _SelectorError(f"found '{lit2}', expected: ',' or ')'")
            if tok == ",":
                if not s:
                    s.add("")
                tok2, _ = self.lookahead()
                if tok2 == ")":
                    s.add("")
                    return s
                if tok2 == ",":
                    self.consume()
                    s.add("")
                continue
            raise _SelectorError(f"found '{lit}', expected: ',', or identifier")

    def exact_value(self) -> set[str]:
        tok, _ = self.lookahead()
        if tok in ("eos", ","):
            return {""}
        tok, lit = self.consume()
        if tok == "id":
            return {lit}
        raise _SelectorError(f"found '{lit}', expected: identifier")


def _validate_key(key: str) -> None:
    parts = key.split("/")
    name = parts[-1]
    problems = []
    if len(parts) > 2:
        problems.append("a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start "
                        "and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
                        "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS "
                        "subdomain prefix and '/' (e.g. 'example.com/MyName')")
    else:
        if len(parts) == 2 and (not parts[0] or len(parts[0]) > 253 or not _DNS_SUBDOMAIN.match(parts[0])):
            problems.append("prefix part must be non-empty" if not parts[0] else
                            "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                            "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
                            "'example.com', regex used for validation is "
                            "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
        if len(name) > 63:
            problems.append("name part must be no more than 63 characters")
        if not LABEL_NAME.match(name):
            problems.append("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
                            "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
                            "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
    if problems:
        raise _SelectorError(f'key: Invalid value: "{key}": ' + "; ".join(problems))


def parse_label_selector(text: str) -> list[Requirement]:
    try:
        return _Parser(text).parse()
    except _SelectorError as exc:
        raise APIError(400, str(exc)) from None


def labels_match(reqs: list[Requirement], labels: dict[str, str]) -> bool:
    for key, op, values in reqs:
        present = key in labels
        if op == "exists":
            ok = present
        elif op == "!":
            ok = not present
        elif op in ("=", "in"):
            ok = present and labels[key] in values
        elif op in ("gt", "lt"):
            try:
                have, want = int(labels[key]), int(next(iter(values)))
            except (KeyError, ValueError, StopIteration):
                ok = False
            else:
                ok = have > want if op == "gt" else have < want
        else:  # != and notin match objects without the label, as upstream does
            ok = not present or labels[key] not in values
        if not ok:
            return False
    return True


def label_matcher(text: str | None) -> Matcher | None:
    if not text:
        return None
    reqs = parse_label_selector(text)
    return lambda obj: labels_match(reqs, obj.get("metadata", {}).get("labels") or {})


def selector_from_match_labels(sel: dict[str, Any] | None) -> Matcher | None:
    """A LabelSelector object (matchLabels/matchExpressions) as a matcher."""
    if not sel:
        return None
    reqs: list[Requirement] = [(k, "=", frozenset({v})) for k, v in (sel.get("matchLabels") or {}).items()]
    for e in sel.get("matchExpressions") or []:
        op = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}[e["operator"]]
        reqs.append((e["key"], op, frozenset(e.get("values") or [])))
    return lambda obj: labels_match(reqs, obj.get("metadata", {}).get("labels") or {})


# ---- field selectors (k8s.io/apimachinery/pkg/fields) ---------------------------------------------


def _field(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def _split_unescaped(text: str, sep: str) -> list[str]:
    out, cur, i = [], "", 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            cur += text[i:i + 2]
            i += 2
            continue
        if text[i] == sep:
            out.append(cur)
            cur = ""
        else:
            cur += text[i]
        i += 1
    out.append(cur)
    return out


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def parse_field_selector(text: str, allowed: frozenset[str] | None, kind: str,
                         custom_labels: bool = False) -> list[tuple[str, bool, str]]:
    out: list[tuple[str, bool, str]] = []
    for part in _split_unescaped(text, ","):
        if not part:
            continue
        m = re.fullmatch(r"([^!=]*?)(!=|==|=)(.*)", part)
        if m is None:
            raise APIError(400, f"invalid selector: '{text}'; can't understand '{part}'")
        path, op, value = m.group(1).strip(), m.group(2), _unescape(m.group(3).strip())
        if allowed is not None and path not in allowed:
            if custom_labels:
                raise APIError(400, f"field label not supported: {path}")
            raise APIError(400, f'"{path}" is not a known field selector: only "metadata.name", "metadata.namespace"')
        out.append((path, op == "!=", value))
    return out


def field_matcher(text: str | None, allowed: frozenset[str] | None, kind: str,
                  custom_labels: bool = False) -> Matcher | None:
    if not text:
        return None
    reqs = parse_field_selector(text, allowed, kind, custom_labels)

    def match(obj: dict[str, Any]) -> bool:
        return all((_field(obj, path) == value) != negate for path, negate, value in reqs)

    return match
