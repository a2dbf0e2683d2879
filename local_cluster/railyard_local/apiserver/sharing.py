"""One copy of each distinct ``metadata.managedFields`` in memory, however many objects carry it.

Field management gives every object a managedFields list whose FieldsV1 tries are as large as
the object itself (a trie node per field, a dict per node), and pods made from one template
have identical tries: 16,384 pods held 16,384 copies. Stored objects are never mutated (a write
stores a new object; readers copy with ``Entry.clone``), so identical subtrees can be one object:
:class:`ManagedFieldsInterner` replaces each stored object's managedFields by the canonical
equal value (the FieldsV1 trie by its compact JSON, entries by their values, lists by their
entries). Serialisation and comparison are unchanged: the values are equal, only shared.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

JSON = dict[str, Any]

_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False).encode

_ORJSON_DUMPS: Callable[..., bytes] | None
try:
    import orjson
except ImportError:  # a development install without the operator's dependencies: json's text alone
    _ORJSON_DUMPS = None
else:
    _ORJSON_DUMPS = orjson.dumps
    #: what orjson writes that json would not (dataclasses, datetimes, subclasses of dict, str,
    #: int, list) it refuses instead, so the key falls back to json's text
    _ORJSON_STRICT = (orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
                      | orjson.OPT_PASSTHROUGH_SUBCLASS)


def trie_key(node: Any) -> str | bytes:
    """A trie's identity as a table key: its compact JSON, which keeps the key order.

    orjson writes it in a tenth of json's time (every write of an object with managedFields asks
    for one per entry). Only equality of keys matters: two tries with the same orjson bytes are
    equal dicts in the same order. Where orjson refuses (integers past 64 bits, keys that are not
    strings, types json would not write either), json's text is the key; a bytes key never equals
    a text key, so such a trie only shares with tries keyed the same way. Raises TypeError or
    ValueError where json cannot encode ``node``.
    """
    if _ORJSON_DUMPS is not None:
        try:
            return _ORJSON_DUMPS(node, option=_ORJSON_STRICT)
        except TypeError:  # orjson.JSONEncodeError
            pass
    return _ENCODE(node)


def _is_trie(node: Any) -> bool:
    return type(node) is dict and all(_is_trie(v) for v in node.values())


class ManagedFieldsInterner:
    """Canonical managedFields lists, entries and FieldsV1 tries.

    Equal tries in the same key order share one object (the order is kept: it is what a
    serialisation writes); a trie becomes canonical as it is, so the stored object keeps the
    one it was given when no equal one is known. ``limit`` (entries) and ``key_bytes`` (the
    tries' JSON kept as keys, and the lists' JSON kept for ``store.dumps_stored``) bound the
    table: past them it starts afresh (objects keep the values they share; new ones share among
    themselves).
    """

    def __init__(self, limit: int = 200_000, key_bytes: int = 32 << 20) -> None:
        self.limit = limit
        #: the trie keys are JSON text: a cluster of objects with tries all different must not
        #: grow the table without bound either
        self.key_bytes = key_bytes
        self._by_key: dict[tuple[Any, ...], Any] = {}
        self._key_total = 0
        #: id -> canonical object, for objects that are canonical already (and to keep them alive)
        self._canonical: dict[int, Any] = {}
        #: id of a canonical list -> its compact JSON (json's, as ``store.dumps`` writes it)
        self._encoded: dict[int, str] = {}

    def _known(self, value: Any) -> bool:
        return self._canonical.get(id(value)) is value

    def _remember(self, key: tuple[Any, ...], value: Any) -> Any:
        size = len(key[1]) if key[0] == "t" else 0
        if len(self._by_key) >= self.limit or self._key_total + size > self.key_bytes:
            self._by_key.clear()
            self._canonical.clear()
            self._encoded.clear()
            self._key_total = 0
        self._key_total += size
        self._by_key[key] = value
        self._canonical[id(value)] = value
        return value

    def trie(self, node: JSON) -> JSON | None:
        """The canonical trie equal to ``node`` (its compact JSON, which keeps the key order, is
        the key: one C-encoded string instead of a walk over every node); None when it is not a
        trie of dicts."""
        if self._known(node):
            return node
        try:
            key = ("t", trie_key(node))
        except (TypeError, ValueError):
            return None
        found: JSON | None = self._by_key.get(key)
        if found is not None:
            return found
        if not _is_trie(node):
            return None
        return self._remember(key, node)  # type: ignore[no-any-return]

    def entry(self, entry: Any) -> JSON | None:
        """The canonical managedFields entry equal to ``entry``; None when it is not one the
        server writes (scalars and a FieldsV1 trie)."""
        if type(entry) is not dict:
            return None
        if self._known(entry):
            return entry
        fields: JSON | None = None
        parts: list[Any] = []
        for k, v in entry.items():
            if k == "fieldsV1":
                if type(v) is not dict:
                    return None
                fields = self.trie(v)
                if fields is None:
                    return None
                parts.append((k, id(fields)))
            elif type(v) in (str, int, bool, type(None)):
                parts.append((k, v))
            else:
                return None
        key = ("e", *parts)
        found: JSON | None = self._by_key.get(key)
        if found is not None:
            return found
        value = {k: (fields if k == "fieldsV1" else v) for k, v in entry.items()}
        return self._remember(key, value)  # type: ignore[no-any-return]

    def managed_fields(self, value: Any) -> Any:
        """The canonical list equal to ``value``, or ``value`` itself when it is not a list of
        server-shaped entries."""
        if type(value) is not list:
            return value
        if self._known(value):
            return value
        entries = []
        for e in value:
            canonical = self.entry(e)
            if canonical is None:
                return value
            entries.append(canonical)
        key = ("l", *(id(e) for e in entries))
        found = self._by_key.get(key)
        if found is not None:
            return found
        return self._remember(key, entries)

    def encoded(self, value: Any) -> str | None:
        """The compact JSON of ``value`` when it is a canonical managedFields list (written once,
        then reused: the list is never mutated, and every object made from one template carries
        it), else None. A pod's managedFields are a third of its bytes and of its encoding time."""
        if type(value) is not list or not self._known(value):
            return None
        text = self._encoded.get(id(value))
        if text is None:
            text = _ENCODE(value)
            if self._key_total + len(text) <= self.key_bytes:  # counted with the keys, as bounded
                self._encoded[id(value)] = text
                self._key_total += len(text)
        return text

    def share(self, obj: JSON) -> None:
        """Replace ``obj``'s managedFields by the canonical equal list (``obj`` is about to be
        stored: its metadata is its own)."""
        meta = obj.get("metadata")
        if type(meta) is dict:
            mf = meta.get("managedFields")
            if mf is not None:
                meta["managedFields"] = self.managed_fields(mf)
