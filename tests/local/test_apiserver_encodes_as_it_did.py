"""The embedded API server's faster encodings give the bytes and identities the slower ones gave.

``store.dumps`` (every stored object and every answer) is json's C encoder without the circular
check: each row must encode to exactly what ``json.dumps(..., separators=(",", ":"),
ensure_ascii=False)`` wrote, the golden replays compare those bytes with a recorded
kube-apiserver. The managedFields interner keys tries by orjson's bytes: equal tries must share,
unequal ones must not, and what orjson refuses must still be keyed (by json's text).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from typing import Any

import pytest

from railyard_local.apiserver import store
from railyard_local.apiserver.sharing import ManagedFieldsInterner, trie_key
from railyard_local.apiserver.store import dumps

ROWS: list[tuple[str, Any]] = [
    ("a pod's shape, key order kept", {"kind": "Pod", "apiVersion": "v1",
                                       "metadata": {"name": "p", "labels": {"b": "1", "a": "2"}},
                                       "spec": {"containers": [{"name": "c", "args": ["x", "y"]}]}}),
    ("non-ASCII as UTF-8, not escaped", {"message": "caf\u00e9 \u65e5\u672c \U0001f680 \u2028\u2029"}),
    ("control characters and quotes escaped", {"s": "\x00\x01\x1f\x7f\"\\\b\f\n\r\t/"}),
    ("every code point below 0x800", {"s": "".join(chr(c) for c in range(0x800))}),
    ("floats as Python writes them", {"f": [0.1, 1.0, -0.0, 1e-05, 1.5e-07, 1e16, 1.5e16, 1e22, 5e-324, 2.5]}),
    ("non-finite floats as json writes them", {"f": [math.nan, math.inf, -math.inf]}),
    ("integers past 64 bits", {"i": [2**64, -(2**70), 0, -1]}),
    ("keys that are not strings", {1: "one", False: "f", None: "n", 2.5: "x"}),
    ("null, booleans and empty containers", {"n": None, "t": True, "f": False, "e": {}, "l": [], "q": ""}),
    ("tuples as arrays", {"t": (1, "a")}),
    ("an OrderedDict", OrderedDict([("z", 1), ("a", 2)])),
    ("deep nesting", json.loads("[" * 500 + "]" * 500)),
]


@pytest.mark.parametrize(("why", "obj"), ROWS, ids=[r[0] for r in ROWS])
def test_stored_bytes_are_the_ones_json_dumps_wrote(why: str, obj: Any) -> None:
    assert dumps(obj) == json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(), why


def test_what_json_refuses_is_still_refused() -> None:
    for bad in ({"s": object()}, {"s": {1, 2}}):
        with pytest.raises(TypeError):
            dumps(bad)
    with pytest.raises(UnicodeEncodeError):
        dumps({"lone surrogate": "\ud800"})


def trie(*keys: str) -> dict[str, Any]:
    return {k: {".": {}} for k in keys}


def test_equal_tries_share_one_key_and_unequal_ones_do_not() -> None:
    assert trie_key(trie("f:a", "f:b")) == trie_key(json.loads(json.dumps(trie("f:a", "f:b"))))
    assert trie_key(trie("f:a", "f:b")) != trie_key(trie("f:b", "f:a")), "key order is part of a trie"
    assert trie_key(trie("f:a")) != trie_key(trie("f:\u00e9"))
    assert trie_key({"f:a": {}}) != trie_key({"f:a": []}) != trie_key({"f:a": None})


def test_what_orjson_refuses_is_keyed_by_json_text() -> None:
    for node in ({"f:a": {"x": 2**70}}, {1: {}}):
        assert trie_key(node) == json.dumps(node, separators=(",", ":"), ensure_ascii=False)
    with pytest.raises(TypeError):
        trie_key({"f:a": object()})


def test_the_interner_shares_tries_and_keeps_odd_ones_apart() -> None:
    interner = ManagedFieldsInterner()
    a, b = trie("f:spec", "f:status"), json.loads(json.dumps(trie("f:spec", "f:status")))
    assert interner.trie(a) is a and interner.trie(b) is a
    odd: dict[Any, Any] = {"f:x": {"big": {"y": 2**70}}}  # refused by orjson; an integer leaf: no trie
    assert interner.trie(odd) is None
    int_keys: dict[Any, Any] = {1: {}}
    assert interner.trie(int_keys) is int_keys, "keyed by json's text, as before"
    assert interner.trie({"1": {}}) is not int_keys, "a bytes key never meets a text key"


def test_stored_objects_with_shared_managed_fields_encode_as_a_whole() -> None:
    interner = ManagedFieldsInterner()
    entry = {"manager": "m", "operation": "Update", "apiVersion": "v1", "time": "t", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:labels": {"f:caf\u00e9": {}, ".": {}}}, "f:spec": {"f:x": {}}}}

    def pod(i: int, **meta: Any) -> dict[str, Any]:
        obj = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"p-{i}", "labels": {"caf\u00e9": "\u65e5"}, **meta,
                            "managedFields": [json.loads(json.dumps(entry))]},
               "spec": {"x": i, "f": 0.5}, "status": {}}
        interner.share(obj)
        return obj

    first, second = pod(0), pod(1)
    assert first["metadata"]["managedFields"] is second["metadata"]["managedFields"]
    placeholder = store._PLACEHOLDER
    odd = {"metadata": {"name": "q", "managedFields": [{"manager": "m", "fieldsV1": {"f:x": []}}]}}
    interner.share(odd)
    rows = [first, second, pod(2, annotations={"a": placeholder}), pod(3, annotations={placeholder: "x"}), odd,
            {"metadata": {"name": "none"}}, {"kind": "List"}]
    for obj in rows:
        before = json.dumps(obj)
        assert store.dumps_stored(obj, interner) == dumps(obj)
        assert json.dumps(obj) == before, "the object is left as it was"
    assert interner.encoded(first["metadata"]["managedFields"]) is not None
    assert interner.encoded(odd["metadata"]["managedFields"]) is None
