"""Label and field selectors, parsed as the apiserver parses them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import APIError

Matcher = Callable[[dict[str, Any]], bool]

_TOKEN = re.compile(r"\s*(!=|==|=|\(|\)|,|!|[^\s!=(),]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise APIError(400, f"unable to parse requirement: invalid label selector {text!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


Requirement = tuple[str, str, frozenset[str]]  # (key, op, values)


def parse_label_selector(text: str) -> list[Requirement]:
    toks = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def fail() -> APIError:
        return APIError(400, f"unable to parse requirement: invalid label selector: {text!r}")

    while i < len(toks):
        if toks[i] == "!":
            if i + 1 >= len(toks):
                raise fail()
            reqs.append((toks[i + 1], "!", frozenset()))
            i += 2
        else:
            key = toks[i]
            i += 1
            if i >= len(toks) or toks[i] == ",":
                reqs.append((key, "exists", frozenset()))
            elif toks[i] in ("=", "==", "!="):
                op = "!=" if toks[i] == "!=" else "="
                if i + 1 >= len(toks) or toks[i + 1] in (",", "(", ")"):
                    # ``a=`` selects an empty value
                    reqs.append((key, op, frozenset({""})))
                    i += 1
                else:
                    reqs.append((key, op, frozenset({toks[i + 1]})))
                    i += 2
            elif toks[i] in ("in", "notin"):
                op = toks[i]
                i += 1
                if i >= len(toks) or toks[i] != "(":
                    raise fail()
                i += 1
                values: set[str] = set()
                while i < len(toks) and toks[i] != ")":
                    if toks[i] != ",":
                        values.add(toks[i])
                    i += 1
                if i >= len(toks):
                    raise fail()
                i += 1
                reqs.append((key, op, frozenset(values)))
            else:
                raise fail()
        if i < len(toks):
            if toks[i] != ",":
                raise fail()
            i += 1
    return reqs


def labels_match(reqs: list[Requirement], labels: dict[str, str]) -> bool:
    for key, op, values in reqs:
        present = key in labels
        if op == "exists":
            ok = present
        elif op == "!":
            ok = not present
        elif op in ("=", "in"):
            ok = present and labels[key] in values
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


def parse_field_selector(text: str, allowed: frozenset[str] | None, kind: str) -> list[tuple[str, bool, str]]:
    out: list[tuple[str, bool, str]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"([^!=]+)(!=|==|=)(.*)", part)
        if m is None:
            raise APIError(400, f"invalid selector: '{text}'; can't understand '{part}'")
        path, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if allowed is not None and path not in allowed:
            raise APIError(400, f'field label not supported: {path}')
        out.append((path, op == "!=", value))
    return out


def field_matcher(text: str | None, allowed: frozenset[str] | None, kind: str) -> Matcher | None:
    if not text:
        return None
    reqs = parse_field_selector(text, allowed, kind)

    def match(obj: dict[str, Any]) -> bool:
        return all((_field(obj, path) == value) != negate for path, negate, value in reqs)

    return match
