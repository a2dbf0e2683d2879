"""The runtime's watch decoder (orjson where exact, json elsewhere) reads every line as json does.

orjson and json differ on a few inputs: an integer past 64 bits (orjson: a float), NaN and
Infinity and lone surrogates (orjson refuses), floats and escapes it would write otherwise. Each
row is such a line or an ordinary one; ``repr`` tells 1 from 1.0 and True.
"""

from __future__ import annotations

import json

import orjson
import pytest

from railyard_local.apiserver.store import dumps
from railyard_local.kube import decode_line

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7",
                                                       "labels": {"b": "1", "a": "2"}},
       "spec": {"containers": [{"name": "c", "image": "i", "args": ["caf\u00e9", "\U0001f680"]}]},
       "status": {"phase": "Running", "podIP": "127.0.0.11"}}

ROWS: list[tuple[str, bytes]] = [
    ("a pod as the embedded server sends it", b'{"type":"MODIFIED","object":' + dumps(POD) + b"}"),
    ("a bookmark", b'{"type":"BOOKMARK","object":{"kind":"Pod","metadata":{"resourceVersion":"9"}}}'),
    ("an integer past 64 bits", b'{"type":"ADDED","object":{"n":18446744073709551616}}'),
    ("a negative integer past 64 bits", b'{"type":"ADDED","object":{"n":-9223372036854775809}}'),
    ("the largest 64-bit integers", b'{"type":"ADDED","object":{"n":[18446744073709551615,-9223372036854775808]}}'),
    ("NaN and Infinity", b'{"type":"ADDED","object":{"f":[NaN,Infinity,-Infinity]}}'),
    ("floats written otherwise", b'{"type":"ADDED","object":{"f":[1e-05,1.5e-07,1e+16,1E400,0.1,-0.0]}}'),
    ("minus zero as an integer", b'{"type":"ADDED","object":{"n":-0}}'),
    ("a duplicated key", b'{"type":"ADDED","object":{"a":1,"b":2,"a":3}}'),
    ("escapes as Go writes them", b'{"type":"ADDED","object":{"s":"\\u003cb\\u003e \\u0026 \\u2028 \\u00e9"}}'),
    ("a lone surrogate", b'{"type":"ADDED","object":{"s":"\\ud800"}}'),
    ("spaces as a pretty printer writes them", b'{ "type": "ADDED", "object": {"a": [1, 2]} }'),
    ("true, false, null", b'{"type":"ADDED","object":{"t":true,"f":false,"n":null,"e":{},"l":[]}}'),
]


@pytest.mark.parametrize(("why", "line"), ROWS, ids=[r[0] for r in ROWS])
def test_a_watch_line_decodes_as_json_reads_it(why: str, line: bytes) -> None:
    assert repr(decode_line(line)) == repr(json.loads(line)), why


def test_invalid_lines_are_refused_as_json_refuses_them() -> None:
    for line in (b'{"type":', b"{'a':1}", b"\xff"):
        with pytest.raises(ValueError):
            decode_line(line)


def test_the_rows_orjson_alone_reads_otherwise_are_the_ones_the_check_sends_to_json() -> None:
    """Without the write-back check the big integers would be floats: the rows above test it."""
    differs = []
    for why, line in ROWS:
        try:
            if repr(orjson.loads(line)) != repr(json.loads(line)):
                differs.append(why)
        except orjson.JSONDecodeError:
            differs.append(why)
    assert "an integer past 64 bits" in differs and "NaN and Infinity" in differs
