"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

Strategic merge patch knows the merge keys of the built-in kinds this server serves (the
``patchMergeKey`` tags of the upstream Go types); lists without one are replaced, as upstream.

The functions consume their arguments: the caller (Engine.patch) passes a freshly decoded copy
of the live object and a freshly decoded patch, so nothing is deep-copied again; the result may
share parts with both.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import APIError

JSON = dict[str, Any]


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


# ---- RFC 6902 -------------------------------------------------------------------------------------


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _split(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise _fail(f"invalid path {pointer!r}")
    return [_unescape(t) for t in pointer[1:].split("/")]


def _fail(msg: str) -> APIError:
    """A JSON patch that does not apply: kube-apiserver answers with the generic 422 and no
    details (``msg`` says what failed, for our logs only)."""
    return APIError(422, "the server rejected our request due to an error in our request", reason="Invalid",
                    details={})


def _get(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for t in tokens:
        if isinstance(cur, dict):
            if t not in cur:
                raise _fail(f"jsonpatch: path not found: /{'/'.join(tokens)}")
            cur = cur[t]
        elif isinstance(cur, list):
            try:
                cur = cur[int(t)]
            except (ValueError, IndexError) as exc:
                raise _fail(f"jsonpatch: invalid index {t!r} in /{'/'.join(tokens)}") from exc
        else:
            raise _fail(f"jsonpatch: path not found: /{'/'.join(tokens)}")
    return cur


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _get(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                idx = int(last)
            except ValueError as exc:
                raise _fail(f"jsonpatch: invalid index {last!r}") from exc
            if idx < 0 or idx > len(parent):
                raise _fail(f"jsonpatch: index {idx} out of range")
            parent.insert(idx, value)
    else:
        raise _fail(f"jsonpatch add: doc is missing path: /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise _fail("jsonpatch: cannot remove the whole document")
    parent = _get(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _fail(f"jsonpatch remove operation does not apply: doc is missing path: /{'/'.join(tokens)}")
        return parent.pop(last)
    if isinstance(parent, list):
        try:
            return parent.pop(int(last))
        except (ValueError, IndexError) as exc:
            raise _fail(f"jsonpatch remove operation does not apply: doc is missing path: /{'/'.join(tokens)}") from exc
    raise _fail(f"jsonpatch remove operation does not apply: doc is missing path: /{'/'.join(tokens)}")


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise APIError(400, "json patch must be a list of operations")
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise _fail(f"jsonpatch: invalid operation {op!r}")
        kind = op["op"]
        tokens = _split(op["path"])
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, tokens)
        elif kind == "replace":
            _get(doc, tokens)
            if tokens:
                _remove(doc, tokens)
            doc = _add(doc, tokens, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            src = _split(op.get("from", ""))
            value = copy.deepcopy(_get(doc, src))
            if kind == "move":
                _remove(doc, src)
            doc = _add(doc, tokens, value)
        elif kind == "test":
            if _get(doc, tokens) != op.get("value"):
                raise _fail(f"testing value /{'/'.join(tokens)} failed: test failed")
        else:
            raise _fail(f"Unexpected kind: {kind}")
    return doc


# ---- strategic merge patch ------------------------------------------------------------------------

# field name -> merge key (None: merge a list of primitives as a set)
_MERGE_KEYS: dict[str, str | None] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "finalizers": None,
    "hostAliases": "ip",
    "schedulingGates": "name",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
    "secrets": "name",
}


def _merge_key(path: list[str], field: str) -> str | bool | None:
    """The merge key for a list field; False when the list is replaced."""
    if field == "ports":
        if path and path[-1] in ("containers", "initContainers", "ephemeralContainers"):
            return "containerPort"
        if "spec" in path or path == []:
            return "port"
        return False
    if field == "finalizers" and path[-1:] != ["metadata"]:
        return False
    if field == "secrets" and path:
        return False
    return _MERGE_KEYS.get(field, False)


def strategic_merge_patch(original: JSON, patch: JSON, kind: str) -> JSON:
    if not isinstance(patch, dict):
        raise APIError(400, "strategic merge patch must be a JSON object")
    result: JSON = _smp_map(original, patch, [])
    return result


def _smp_map(orig: Any, patch: JSON, path: list[str]) -> Any:
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(orig) if isinstance(orig, dict) else {}
    retain = patch.get("$retainKeys")
    for k, v in patch.items():
        if k.startswith("$deleteFromPrimitiveList/"):
            fld = k.split("/", 1)[1]
            if isinstance(result.get(fld), list) and isinstance(v, list):
                result[fld] = [x for x in result[fld] if x not in v]
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys") or k.startswith(("$setElementOrder/", "$deleteFromPrimitiveList/")):
            continue
        if v is None:
            result.pop(k, None)
            continue
        if isinstance(v, dict):
            merged = _smp_map(result.get(k), v, [*path, k])
            if merged is None:
                result.pop(k, None)
            else:
                result[k] = merged
        elif isinstance(v, list):
            mk = _merge_key(path, k)
            order = patch.get(f"$setElementOrder/{k}")
            if mk is False or mk is True or not isinstance(result.get(k), list):
                items = [x for x in v if not (isinstance(x, dict) and x.get("$patch") == "delete")]
                items = [{kk: vv for kk, vv in x.items() if kk != "$patch"} if isinstance(x, dict) else x
                         for x in items]
                if mk is None:
                    items = _dedupe(items)
                result[k] = items
            else:
                result[k] = _smp_list(result[k], v, mk, [*path, k], order if isinstance(order, list) else None)
        else:
            result[k] = v
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _dedupe(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def _smp_list(orig: list[Any], patch: list[Any], key: str | None, path: list[str],
              order: list[Any] | None = None) -> list[Any]:
    """Merge a list with a patch strategy of merge, keeping apimachinery's element order: the
    patch's items in the patch's order, the server's other items slotted in by their place in
    the original list (``normalizeElementOrder``)."""
    if key is None:
        merged = _dedupe(list(orig) + [x for x in patch])
        patch_items = [x for x in merged if x in patch]
        server_only = [x for x in merged if x not in patch]
        if order is not None:
            patch_items.sort(key=lambda x: order.index(x) if x in order else len(order))
        return _merge_sorted(server_only, patch_items, list(orig), lambda x: x)
    if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch):
        return [x for x in patch if not (isinstance(x, dict) and x.get("$patch") == "replace")]
    result = list(orig)
    patched_keys: list[Any] = []
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise APIError(422, f"map: {item!r} does not contain declared merge key: {key}", reason="Invalid")
        idx = next((i for i, x in enumerate(result) if isinstance(x, dict) and x.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                result.pop(idx)
            continue
        patched_keys.append(item[key])
        if idx is None:
            result.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            result[idx] = _smp_map(result[idx], item, path)
    patch_items = sorted((x for x in result if isinstance(x, dict) and x.get(key) in patched_keys),
                         key=lambda x: patched_keys.index(x.get(key)))
    if order is not None:
        order_keys = [o.get(key) if isinstance(o, dict) else o for o in order]
        patch_items.sort(key=lambda x: order_keys.index(x.get(key)) if x.get(key) in order_keys else len(order_keys))
    server_only = [x for x in result if not (isinstance(x, dict) and x.get(key) in patched_keys)]
    return _merge_sorted(server_only, patch_items, list(orig), lambda x: x.get(key) if isinstance(x, dict) else x)


def _merge_sorted(left: list[Any], right: list[Any], server: list[Any], ident: Any) -> list[Any]:
    """apimachinery's mergeSortedSlice: interleave, keeping each list's order; a server item goes
    before a patch item only when both are in the original and it came first there."""
    server_ids = [ident(x) for x in server]

    def pos(x: Any) -> int:
        i = ident(x)
        return server_ids.index(i) if i in server_ids else -1

    out: list[Any] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if i >= len(left):
            out.append(right[j])
            j += 1
        elif j >= len(right):
            out.append(left[i])
            i += 1
        else:
            li, ri = pos(left[i]), pos(right[j])
            if li >= 0 and ri >= 0 and li < ri:
                out.append(left[i])
                i += 1
            else:
                out.append(right[j])
                j += 1
    return out
