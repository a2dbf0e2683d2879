"""Field management: ``metadata.managedFields`` and server-side apply, as kube-apiserver does them.

This is a port of the parts of structured-merge-diff that an API client can observe:

- **Field sets** are tries of path elements in FieldsV1 spelling (``f:name``, ``k:{"name":"c"}``,
  ``v:"a"``, ``i:0``); a node holding ``"."`` is itself a member of the set.
- **Update** (create, update, patch): the operation owns what it added or changed, compared with
  the live object (the zero object of the kind on create); removed fields leave every owner.
- **Apply**: the manager owns exactly the fields of its configuration; the configuration is merged
  into the live object (associative lists by key, sets by value, atomic values replaced), fields
  it applied before and applies no more are removed unless someone else owns them, and a change
  to a field another manager owns is a conflict (409 listing each field) unless ``force=true``,
  which takes it.

Types come from :mod:`typeinfo` (CRD schemas and the built-in kinds' list/map semantics).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import APIError
from .typeinfo import TypeNode, deduced

_DEDUCED = deduced()

JSON = dict[str, Any]
Trie = dict[str, Any]
"""Path element -> child trie; the key ``"."`` marks the node itself as a member."""

MEMBER = "."

# Paths never tracked (fieldmanager's stripMeta).
_STRIP_TOP = ("apiVersion", "kind")
_STRIP_META = ("name", "namespace", "creationTimestamp", "selfLink", "uid", "clusterName", "generation",
               "managedFields", "resourceVersion")
_STRIP_TOP_ELEMENTS = frozenset(f"f:{s}" for s in _STRIP_TOP)
_STRIP_META_ELEMENTS = frozenset(f"f:{s}" for s in _STRIP_META)


# ---- path elements ------------------------------------------------------------------------------


_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode


def _go_json(v: Any) -> str:
    text = _ENCODE(v)
    if "<" in text or ">" in text or "&" in text:
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text


def item_element(item: Any, t: TypeNode, index: int) -> str:
    if t.list_type == "set":
        return "v:" + _go_json(item)
    if t.list_type == "map" and isinstance(item, dict):
        if len(t.keys) == 1:
            key = t.keys[0]
            if key in item:
                return 'k:{"' + key + '":' + _go_json(item[key]) + "}"
            return "k:{}"
        return "k:" + _go_json({k: item[k] for k in sorted(t.keys) if k in item})
    return f"i:{index}"


def element_string(pe: str) -> str:
    """A path element as upstream prints it in conflicts: ``.spec``, ``[name="c"]``, ``[="a"]``."""
    kind, rest = pe[0], pe[2:]
    if kind == "f":
        return "." + rest
    if kind == "k":
        keys = json.loads(rest)
        return "[" + ",".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in keys.items()) + "]"
    if kind == "v":
        return f"[={rest}]"
    return f"[{rest}]"


# ---- tries --------------------------------------------------------------------------------------


# Sets are kept in FieldsV1's own form, so that managedFields are read and written as they are:
# a set is a dict of path element -> node; a node ``{}`` is a member with nothing below it, a
# node with children is a member only when it holds ``"."``. The top level is never a member.


def _member(node: Trie) -> bool:
    return not node or MEMBER in node


def _node(member: bool, kids: Trie) -> Trie | None:
    """A node from its membership and children; None when it would be neither."""
    if not kids:
        return {} if member else None
    if member:
        kids[MEMBER] = {}
    return kids


def _kids(node: Trie) -> Trie:
    return {k: v for k, v in node.items() if k != MEMBER}


def is_empty(trie: Trie) -> bool:
    return not trie


def _union_node(a: Trie, b: Trie) -> Trie:
    kids = _kids(a)
    for k, v in b.items():
        if k != MEMBER:
            kids[k] = _union_node(kids[k], v) if k in kids else v
    out = _node(_member(a) or _member(b), kids)
    assert out is not None
    return out


def union(a: Trie, b: Trie) -> Trie:
    if not b:
        return a
    if not a:
        return b
    out: Trie = dict(a)
    for k, v in b.items():
        out[k] = _union_node(out[k], v) if k in out else v
    return out


def _difference_node(a: Trie, b: Trie) -> Trie | None:
    kids: Trie = {}
    for k, v in a.items():
        if k == MEMBER:
            continue
        child = _difference_node(v, b[k]) if k in b and k != MEMBER else v
        if child is not None:
            kids[k] = child
    return _node(_member(a) and not _member(b), kids)


def difference(a: Trie, b: Trie) -> Trie:
    """Members of ``a`` that are not members of ``b``."""
    if not b or not a:
        return a
    out: Trie = {}
    for k, v in a.items():
        child = _difference_node(v, b[k]) if k in b else v
        if child is not None:
            out[k] = child
    return out


def _recursive_difference_node(a: Trie, b: Trie) -> Trie | None:
    if _member(b):
        return None
    kids: Trie = {}
    for k, v in a.items():
        if k == MEMBER:
            continue
        child = _recursive_difference_node(v, b[k]) if k in b else v
        if child is not None:
            kids[k] = child
    return _node(_member(a), kids)


def recursive_difference(a: Trie, b: Trie) -> Trie:
    """``a`` without every member of ``b`` and everything below them."""
    if not b or not a:
        return a
    out: Trie = {}
    for k, v in a.items():
        child = _recursive_difference_node(v, b[k]) if k in b else v
        if child is not None:
            out[k] = child
    return out


def _intersection_node(a: Trie, b: Trie) -> Trie | None:
    kids: Trie = {}
    for k, v in a.items():
        if k != MEMBER and k in b:
            child = _intersection_node(v, b[k])
            if child is not None:
                kids[k] = child
    return _node(_member(a) and _member(b), kids)


def intersection(a: Trie, b: Trie) -> Trie:
    if not a or not b:
        return {}
    out: Trie = {}
    for k, v in a.items():
        if k in b:
            child = _intersection_node(v, b[k])
            if child is not None:
                out[k] = child
    return out


def members(trie: Trie, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for k in sorted(trie):
        if k == MEMBER:
            continue
        node = trie[k]
        if _member(node):
            out.append((*prefix, k))
        out.extend(members(node, (*prefix, k)))
    return out


def _valid(doc: Any) -> bool:
    return isinstance(doc, dict) and all(isinstance(v, dict) and _valid(v) for v in doc.values())


def strip_ignored(trie: Trie, ignored: Trie | None) -> Trie:
    t = {k: v for k, v in trie.items() if k not in _STRIP_TOP_ELEMENTS}
    meta = t.get("f:metadata")
    if meta is not None:
        meta = {k: v for k, v in meta.items() if k != MEMBER and k not in _STRIP_META_ELEMENTS}
        if not meta:
            t.pop("f:metadata")
        else:
            t["f:metadata"] = meta
    if ignored:
        t = recursive_difference(t, ignored)
    return t


def _child_type(t: TypeNode, key: str) -> tuple[TypeNode, bool]:
    """(type of ``key`` in a map value of type ``t``, whether ``key`` is a declared field)."""
    if t.kind == "struct":
        sub = t.fields.get(key)
        if sub is not None:
            return sub, True
        return t.elem or deduced(), t.elem is None
    if t.kind == "map":
        return t.elem or deduced(), False
    return deduced(), True


def _is_leaf(t: TypeNode, v: Any) -> bool:
    if t.kind == "atomic" or t.kind == "scalar":
        return True
    if isinstance(v, list):
        return t.kind != "list" or t.list_type == "atomic"
    return not isinstance(v, dict)


def field_set(value: Any, t: TypeNode) -> Trie:
    """The fields a configuration sets (``ToFieldSet``)."""
    return _to_set(value, t, False) or {}


def _to_set(v: Any, t: TypeNode, member: bool) -> Trie | None:
    if _is_leaf(t, v):
        return {}
    kids: Trie = {}
    if isinstance(v, list):
        elem = t.elem or deduced()
        for i, item in enumerate(v):
            child = _to_set(item, elem, True)
            if child is not None:
                kids[item_element(item, t, i)] = child
        return _node(member, kids)
    for k, child_v in v.items():
        ct, declared = _child_type(t, k)
        child = _to_set(child_v, ct, child_v is None or child_v == {} or not declared)
        if child is not None:
            kids[f"f:{k}"] = child
    return _node(member, kids)


@dataclass
class Comparison:
    added: Trie = field(default_factory=dict)
    removed: Trie = field(default_factory=dict)
    modified: Trie = field(default_factory=dict)


_ABSENT = object()


def compare(old: Any, new: Any, t: TypeNode) -> Comparison:
    a, r, m = _compare(old, new, t)
    return Comparison(_kids(a) if a else {}, _kids(r) if r else {}, _kids(m) if m else {})


def _whole(v: Any, t: TypeNode) -> Trie:
    """Every path of ``v`` (added or removed as a whole), this node included. (The hot path of
    every create: inlined type lookups.)"""
    kind = t.kind
    if kind == "atomic" or kind == "scalar":
        return {}
    cls = type(v)
    kids: Trie = {}
    if cls is dict:
        if not v:
            return {}
        fields = t.fields
        default = (t.elem or _DEDUCED) if kind in ("struct", "map") else _DEDUCED
        for k, child in v.items():
            ct = fields.get(k, default)
            kids["f:" + k] = _whole(child, ct) if type(child) in (dict, list) else {}
    elif cls is list:
        if kind != "list" or t.list_type == "atomic" or not v:
            return {}
        elem = t.elem or _DEDUCED
        for i, item in enumerate(v):
            pe = item_element(item, t, i)
            if pe not in kids:
                kids[pe] = _whole(item, elem) if type(item) in (dict, list) else {}
    else:
        return {}
    kids[MEMBER] = {}
    return kids


def _compare(old: Any, new: Any, t: TypeNode) -> tuple[Trie | None, Trie | None, Trie | None]:
    """(added, removed, modified) below and at this node, as nodes rooted here."""
    if old is _ABSENT:
        return _whole(new, t), None, None
    if new is _ABSENT:
        return None, _whole(old, t), None
    if old == new:
        return None, None, None
    ref = new if new is not None else old
    if ref is None or _is_leaf(t, ref) or (old is not None and new is not None and _is_leaf(t, old)):
        return None, None, {}
    added: Trie = {}
    removed: Trie = {}
    modified: Trie = {}
    if isinstance(ref, list):
        elem = t.elem or deduced()
        olds = _index_items(old if isinstance(old, list) else [], t)
        news = _index_items(new if isinstance(new, list) else [], t)
        pairs = [(pe, olds[pe], news.get(pe, _ABSENT)) for pe in olds]
        pairs += [(pe, _ABSENT, v) for pe, v in news.items() if pe not in olds]
        for pe, o, n in pairs:
            ca, cr, cm = _compare(o, n, elem)
            if ca is not None:
                added[pe] = ca
            if cr is not None:
                removed[pe] = cr
            if cm is not None:
                modified[pe] = cm
    else:
        od = old if isinstance(old, dict) else {}
        nd = new if isinstance(new, dict) else {}
        for k in list(od) + [k for k in nd if k not in od]:
            ct, _ = _child_type(t, k)
            ca, cr, cm = _compare(od.get(k, _ABSENT), nd.get(k, _ABSENT), ct)
            pe = f"f:{k}"
            if ca is not None:
                added[pe] = ca
            if cr is not None:
                removed[pe] = cr
            if cm is not None:
                modified[pe] = cm
    return added or None, removed or None, modified or None


def _index_items(items: list[Any], t: TypeNode) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, item in enumerate(items):
        out.setdefault(item_element(item, t, i), item)
    return out


def merge(live: Any, config: Any, t: TypeNode) -> Any:
    """Server-side apply's merge: the configuration's values win; granular maps and associative
    lists merge item by item, keeping the live order around the configuration's (SMD's order)."""
    if _is_leaf(t, config) or (_is_leaf(t, live) and live is not None):
        return copy.deepcopy(config)
    if isinstance(config, list):
        return _merge_list(live if isinstance(live, list) else [], config, t)
    if not isinstance(config, dict):
        return copy.deepcopy(config)
    out = dict(live) if isinstance(live, dict) else {}
    for k, v in config.items():
        ct, _ = _child_type(t, k)
        out[k] = merge(out[k], v, ct) if k in out else copy.deepcopy(v)
    return out


def _merge_list(lhs: list[Any], rhs: list[Any], t: TypeNode) -> list[Any]:
    elem = t.elem or deduced()
    lpe = [item_element(x, t, i) for i, x in enumerate(lhs)]
    rpe = [item_element(x, t, i) for i, x in enumerate(rhs)]
    lmap = dict(zip(lpe, lhs, strict=True))
    rmap = dict(zip(rpe, rhs, strict=True))
    shared = [p for p in rpe if p in lmap]
    next_shared = shared.pop(0) if shared else None
    merged: set[str] = set()
    out: list[Any] = []

    def item(pe: str) -> Any:
        if pe in lmap and pe in rmap:
            return merge(lmap[pe], rmap[pe], elem)
        return copy.deepcopy(rmap[pe] if pe in rmap else lmap[pe])

    li = ri = 0
    while li < len(lpe) or ri < len(rpe):
        if li < len(lpe) and ri < len(rpe):
            pe = lpe[li]
            if pe == rpe[ri]:
                merged.add(pe)
                out.append(item(pe))
                li += 1
                ri += 1
                next_shared = shared.pop(0) if shared else None
                continue
            if pe in rmap and next_shared is not None and next_shared != pe:
                li += 1
                continue
        if li < len(lpe):
            pe = lpe[li]
            if pe not in rmap:
                out.append(copy.deepcopy(lmap[pe]))
                li += 1
                continue
            if pe in merged:
                li += 1
                continue
        if ri < len(rpe):
            pe = rpe[ri]
            merged.add(pe)
            out.append(item(pe))
            ri += 1
            if next_shared is not None and next_shared == pe:
                next_shared = shared.pop(0) if shared else None
    return out


def remove_fields(value: Any, drop: Trie, keep: Trie, t: TypeNode) -> Any:
    """``value`` without the members of ``drop`` (a member with children goes whole unless
    something under it is in ``keep``). A map or list that the removal empties goes too, as
    structured-merge-diff's removal leaves no empty parent (kueue-v0.13-workload 042, 033: the
    Workload's ``status.admission`` and ``status.resourceRequests`` vanish when the applier that
    owned their fields stops applying them)."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            pe = f"f:{k}"
            ct, _ = _child_type(t, k)
            if pe not in drop:
                out[k] = v
                continue
            sub = drop[pe]
            if _member(sub) and not _kids(keep.get(pe) or {}):
                continue
            kept = remove_fields(v, sub, keep.get(pe) or {}, ct)
            if isinstance(kept, dict | list) and not kept and v:
                continue
            out[k] = kept
        return out
    if isinstance(value, list) and t.kind == "list" and t.list_type != "atomic":
        elem = t.elem or deduced()
        res = []
        for i, item in enumerate(value):
            pe = item_element(item, t, i)
            if pe not in drop:
                res.append(item)
                continue
            sub = drop[pe]
            if _member(sub) and not _kids(keep.get(pe) or {}):
                continue
            res.append(remove_fields(item, sub, keep.get(pe) or {}, elem))
        return res
    return value


# ---- managedFields entries ----------------------------------------------------------------------


@dataclass
class Manager:
    manager: str
    operation: str  # Apply | Update
    api_version: str
    subresource: str = ""
    time: str | None = None
    fields: Trie = field(default_factory=dict)

    @property
    def identity(self) -> tuple[str, str, str, str]:
        return (self.manager, self.operation, "" if self.operation == "Apply" else self.api_version, self.subresource)

    def entry(self) -> JSON:
        out: JSON = {"manager": self.manager, "operation": self.operation, "apiVersion": self.api_version}
        if self.time is not None:
            out["time"] = self.time
        out["fieldsType"] = "FieldsV1"
        out["fieldsV1"] = self.fields
        if self.subresource:
            out["subresource"] = self.subresource
        return out

    def describe(self) -> str:
        """How a conflict names this manager (upstream ``printManager``)."""
        name = json.dumps(self.manager, ensure_ascii=False)
        if self.operation == "Update":
            if self.time is None:
                return f"{name} using {self.api_version}"
            return f"{name} using {self.api_version} at {self.time}"
        if self.subresource:
            return f"{name} with subresource {json.dumps(self.subresource)}"
        return name


def decode(entries: Any, *, trusted: bool = False) -> list[Manager] | None:
    """managedFields as the request or the live object carries them; None when undecodable.
    ``trusted``: the server wrote them (the live object), so their shape is not checked again."""
    if not isinstance(entries, list):
        return None
    out: list[Manager] = []
    for e in entries:
        if not isinstance(e, dict) or e.get("fieldsType", "FieldsV1") != "FieldsV1":
            return None
        fields = e.get("fieldsV1") or {}
        if not trusted and not _valid(fields):
            return None
        out.append(Manager(str(e.get("manager", "")), str(e.get("operation", "Update")), str(e.get("apiVersion", "")),
                           str(e.get("subresource", "") or ""), e.get("time"), fields))
    return out


def encode(managers: list[Manager]) -> list[JSON]:
    def key(m: Manager) -> tuple[str, str, str, str, str]:
        return (m.operation, (m.time or "")[:19], m.manager, m.api_version, m.subresource)

    return [m.entry() for m in sorted((m for m in managers if not is_empty(m.fields)), key=key)]


def managers_for_request(live_meta: JSON | None, request_meta: JSON | None, subresource: str | None) -> list[Manager]:
    """The managedFields an operation starts from: the request's when it sends valid ones (a
    single empty entry resets them), else the live object's."""
    live = decode((live_meta or {}).get("managedFields") or [], trusted=True) or []
    if subresource or request_meta is None or "managedFields" not in request_meta:
        return live
    sent = request_meta.get("managedFields")
    if sent == [{}]:
        return []
    decoded = decode(sent)
    if not decoded:
        return live
    return decoded


def _find(managers: list[Manager], ident: tuple[str, str, str, str]) -> Manager | None:
    return next((m for m in managers if m.identity == ident), None)


def update(managers: list[Manager], live: JSON, new: JSON, t: TypeNode, me: Manager,
           ignored: Trie | None, now: str) -> list[Manager]:
    """An Update operation by ``me``: it owns what it added or changed; removed fields leave
    everyone; whatever it changed leaves the other managers (updates always force)."""
    c = compare(_tracked(live), _tracked(new), t)
    changed = strip_ignored(union(c.added, c.modified), ignored)
    removed = strip_ignored(c.removed, ignored)
    out: list[Manager] = []
    for m in managers:
        if m.identity == me.identity:
            continue
        fields = difference(difference(m.fields, changed), removed)
        out.append(Manager(m.manager, m.operation, m.api_version, m.subresource, m.time, fields))
    prev = _find(managers, me.identity)
    mine = difference(prev.fields, removed) if prev is not None else {}
    if not is_empty(changed):
        out.append(Manager(me.manager, me.operation, me.api_version, me.subresource, now, union(mine, changed)))
    elif prev is not None:
        out.append(Manager(prev.manager, prev.operation, prev.api_version, prev.subresource, prev.time, mine))
    return [m for m in out if not is_empty(m.fields)]


def _tracked(obj: JSON) -> JSON:
    return {k: v for k, v in obj.items() if k not in _STRIP_TOP}


@dataclass
class ApplyResult:
    obj: JSON
    managers: list[Manager]


def apply(managers: list[Manager], live: JSON, config: JSON, t: TypeNode, me: Manager, force: bool,
          ignored: Trie | None, now: str) -> ApplyResult:
    """Server-side apply of ``config`` by ``me`` (operation Apply) onto ``live``."""
    cfg = _tracked(config)
    merged = merge(_tracked(live), cfg, t)
    new_set = strip_ignored(field_set(cfg, t), ignored)
    prev = _find(managers, me.identity)
    last = prev.fields if prev is not None else {}
    others = [m for m in managers if m.identity != me.identity]
    if not is_empty(last):
        owned: Trie = dict(new_set)
        for m in others:
            owned = union(owned, m.fields)
        drop = difference(last, owned)
        if not is_empty(drop):
            merged = remove_fields(merged, drop, owned, t)
    c = compare(_tracked(live), merged, t)
    changed = strip_ignored(union(c.added, c.modified), ignored)
    removed = strip_ignored(c.removed, ignored)
    conflicts: list[tuple[Manager, tuple[str, ...]]] = []
    for m in others:
        for p in members(intersection(m.fields, changed)):
            conflicts.append((m, p))
    if conflicts and not force:
        raise conflict_error(conflicts)
    out: list[Manager] = []
    for m in others:
        fields = difference(difference(m.fields, changed), removed)
        out.append(Manager(m.manager, m.operation, m.api_version, m.subresource, m.time, fields))
    fields_changed = prev is None or prev.fields != new_set or not is_empty(changed)
    out.append(Manager(me.manager, "Apply", me.api_version, me.subresource,
                       now if fields_changed or prev is None else prev.time, new_set))
    result = dict(merged)
    for k in _STRIP_TOP:
        if k in live:
            result[k] = live[k]
        if k in config:
            result[k] = config[k]
    return ApplyResult(result, [m for m in out if not is_empty(m.fields)])


def conflict_error(conflicts: list[tuple[Manager, tuple[str, ...]]]) -> APIError:
    causes = []
    for m, p in conflicts:
        causes.append({"reason": "FieldManagerConflict", "message": f"conflict with {m.describe()}",
                       "field": "".join(element_string(pe) for pe in p)})
    if len(conflicts) == 1:
        m, p = conflicts[0]
        message = (
            f"Apply failed with 1 conflict: conflict with {m.describe()}: {''.join(element_string(pe) for pe in p)}"
        )
    else:
        by: dict[str, list[str]] = {}
        for m, p in conflicts:
            by.setdefault(m.describe(), []).append("".join(element_string(pe) for pe in p))
        lines = []
        for name in sorted(by):
            lines.append(f"conflicts with {name}:")
            lines.extend(f"- {p}" for p in by[name])
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return APIError(409, message, reason="Conflict", details={"causes": causes})


def manager_from_user_agent(user_agent: str) -> str:
    """The default field manager: the User-Agent up to its first '/' (upstream prefixFromUserAgent)."""
    return user_agent.split("/", 1)[0][:128]
