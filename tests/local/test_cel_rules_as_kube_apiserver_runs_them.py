"""CRD validation rules compiled, checked and run the way kube-apiserver's cel-go does (cel.py):
its error words, its error-first semantics of ``&&``/``||``, ``has()`` on a missing parent."""

from __future__ import annotations

from typing import Any

import pytest
from celpy.adapter import json_to_cel

from railyard_local.apiserver import cel

SCHEMA = {"type": "object", "properties": {
    "n": {"type": "integer"}, "inner": {"type": "object", "properties": {"k": {"type": "integer"}}},
    "tags": {"type": "array", "items": {"type": "string"}}, "labels": {"type": "object",
                                                                      "additionalProperties": {"type": "string"}}}}


def run(rule: str, value: dict[str, Any]) -> tuple[Any, str | None]:
    compiled = cel.compile_rule(rule, cel.decl_type(SCHEMA))
    return cel.evaluate(compiled.program, {"self": json_to_cel(value)})


@pytest.mark.parametrize(("rule", "message"), [
    ("self.n >", "ERROR: <input>:1:9: Syntax error: mismatched input '<EOF>' expecting"),
    ("self.x > 0", "ERROR: <input>:1:5: undefined field 'x'"),
    ("self.inner.z == 1", "ERROR: <input>:1:11: undefined field 'z'"),
    ("self.n > limit", "ERROR: <input>:1:10: undeclared reference to 'limit'"),
    ("self.n + 1", "cel expression must evaluate to a bool"),
])
def test_rules_that_do_not_compile(rule: str, message: str) -> None:
    with pytest.raises(cel.CompileError) as err:
        cel.compile_rule(rule, cel.decl_type(SCHEMA))
    assert err.value.detail.startswith(message), err.value.detail


def test_map_keys_and_list_items_resolve_like_the_schema() -> None:
    assert run("self.labels.app == 'x'", {"labels": {"app": "x"}}) == (True, None)
    assert run("self.tags.all(t, t.startsWith('a'))", {"tags": ["ab", "ac"]}) == (True, None)
    assert run("type(self.n) == int", {"n": 1}) == (True, None)


def test_the_first_error_wins_when_neither_side_decides() -> None:
    assert run("self.n > 0 || self.inner.k > 0", {}) == (None, "no such key: n")
    assert run("self.n > 0 || true", {}) == (True, None)
    assert run("self.n > 0 && false", {}) == (False, None)


def test_has_on_a_missing_parent_is_an_error_not_false() -> None:
    assert run("!has(self.inner.k)", {}) == (None, "no such key: inner")
    assert run("!has(self.inner.k)", {"inner": {}}) == (True, None)
    assert run("has(self.n)", {}) == (False, None)


def test_the_cost_of_a_comprehension_scales_with_the_list_bound() -> None:
    def cost(max_items: int) -> int:
        schema = {"type": "object", "properties": {"xs": {"type": "array", "maxItems": max_items,
                                                          "items": {"type": "integer"}}}}
        return cel.compile_rule("self.xs.all(x, x > 0)", cel.decl_type(schema)).max_cost

    assert cost(10) < cost(100) < cost(1000)
    assert cost(1000) // cost(100) >= 9
