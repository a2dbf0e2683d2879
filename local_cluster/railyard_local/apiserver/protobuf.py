"""Decode the Kubernetes protobuf request bodies that kubectl sends for a few built-in kinds.

kubectl's typed commands (``kubectl create namespace|configmap|secret|serviceaccount|service``,
``kubectl drain``'s evictions) POST ``application/vnd.kubernetes.protobuf``: the magic ``k8s\\0``,
then a ``runtime.Unknown`` envelope whose ``raw`` bytes are the object in the field numbering of
k8s.io/api's generated.proto. We decode those kinds into the JSON form and answer in JSON, which
kubectl accepts. Other kinds get 415, as before.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

from .errors import APIError

MAGIC = b"k8s\x00"

Field = tuple[str, str, Any]
Schema = dict[int, Field]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        val: int | bytes
        if wire == 0:
            val, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            val = buf[pos:pos + n]
            pos += n
        elif wire == 1:
            val = int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wire == 5:
            val = int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.append((num, wire, val))
    return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


TYPE_META: Schema = {1: ("apiVersion", "string", None), 2: ("kind", "string", None)}
UNKNOWN: Schema = {1: ("typeMeta", "msg", TYPE_META), 2: ("raw", "bytes", None),
                   3: ("contentEncoding", "string", None), 4: ("contentType", "string", None)}
OWNER_REF: Schema = {5: ("apiVersion", "string", None), 1: ("kind", "string", None), 3: ("name", "string", None),
                     4: ("uid", "string", None), 6: ("controller", "bool", None),
                     7: ("blockOwnerDeletion", "bool", None)}
OBJECT_META: Schema = {
    1: ("name", "string", None), 2: ("generateName", "string", None), 3: ("namespace", "string", None),
    5: ("uid", "string", None), 6: ("resourceVersion", "string", None), 7: ("generation", "int", None),
    10: ("deletionGracePeriodSeconds", "int", None), 11: ("labels", "map_ss", None),
    12: ("annotations", "map_ss", None), 13: ("ownerReferences", "rmsg", OWNER_REF),
    14: ("finalizers", "rstring", None),
}
OBJECT_REF: Schema = {1: ("kind", "string", None), 2: ("namespace", "string", None), 3: ("name", "string", None),
                      4: ("uid", "string", None), 5: ("apiVersion", "string", None),
                      6: ("resourceVersion", "string", None), 7: ("fieldPath", "string", None)}
LOCAL_REF: Schema = {1: ("name", "string", None)}
INT_OR_STRING: Schema = {1: ("type", "int", None), 2: ("intVal", "int", None), 3: ("strVal", "string", None)}
SERVICE_PORT: Schema = {1: ("name", "string", None), 2: ("protocol", "string", None), 3: ("port", "int", None),
                        4: ("targetPort", "intorstr", INT_OR_STRING), 5: ("nodePort", "int", None),
                        6: ("appProtocol", "string", None)}
SERVICE_SPEC: Schema = {1: ("ports", "rmsg", SERVICE_PORT), 2: ("selector", "map_ss", None),
                        3: ("clusterIP", "string", None), 4: ("type", "string", None),
                        5: ("externalIPs", "rstring", None), 7: ("sessionAffinity", "string", None)}
PRECONDITIONS: Schema = {1: ("uid", "string", None), 2: ("resourceVersion", "string", None)}
DELETE_OPTIONS: Schema = {1: ("gracePeriodSeconds", "int", None), 2: ("preconditions", "msg", PRECONDITIONS),
                          3: ("orphanDependents", "bool", None), 4: ("propagationPolicy", "string", None),
                          5: ("dryRun", "rstring", None)}

KINDS: dict[str, Schema] = {
    "Namespace": {1: ("metadata", "msg", OBJECT_META),
                  2: ("spec", "msg", {1: ("finalizers", "rstring", None)})},
    "ConfigMap": {1: ("metadata", "msg", OBJECT_META), 2: ("data", "map_ss", None),
                  3: ("binaryData", "map_sb", None), 4: ("immutable", "bool", None)},
    "Secret": {1: ("metadata", "msg", OBJECT_META), 2: ("data", "map_sb", None), 3: ("type", "string", None),
               4: ("stringData", "map_ss", None), 5: ("immutable", "bool", None)},
    "ServiceAccount": {1: ("metadata", "msg", OBJECT_META), 2: ("secrets", "rmsg", OBJECT_REF),
                       3: ("imagePullSecrets", "rmsg", LOCAL_REF),
                       4: ("automountServiceAccountToken", "bool", None)},
    "Service": {1: ("metadata", "msg", OBJECT_META), 2: ("spec", "msg", SERVICE_SPEC)},
    "Eviction": {1: ("metadata", "msg", OBJECT_META), 2: ("deleteOptions", "msg", DELETE_OPTIONS)},
    "DeleteOptions": DELETE_OPTIONS,
    "SelfSubjectAccessReview": {1: ("metadata", "msg", OBJECT_META), 2: ("spec", "msg", {
        1: ("resourceAttributes", "msg", {1: ("namespace", "string", None), 2: ("verb", "string", None),
                                          3: ("group", "string", None), 4: ("version", "string", None),
                                          5: ("resource", "string", None), 6: ("subresource", "string", None),
                                          7: ("name", "string", None)}),
        2: ("nonResourceAttributes", "msg", {1: ("path", "string", None), 2: ("verb", "string", None)})})},
    "SelfSubjectRulesReview": {1: ("metadata", "msg", OBJECT_META),
                               2: ("spec", "msg", {1: ("namespace", "string", None)})},
}


_KEEP_ZERO = frozenset({"gracePeriodSeconds", "deletionGracePeriodSeconds", "orphanDependents"})


def _decode(buf: bytes, schema: Schema) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for num, _wire, val in _fields(buf):
        spec = schema.get(num)
        if spec is None:
            continue
        name, kind, sub = spec
        if kind in ("string", "int", "bool") and not val and name not in _KEEP_ZERO:
            continue  # Go writes zero values of non-pointer fields; JSON omits them
        if kind == "string":
            out[name] = bytes(val).decode()
        elif kind == "bytes":
            out[name] = bytes(val)
        elif kind == "int":
            out[name] = _signed(val)
        elif kind == "bool":
            out[name] = bool(val)
        elif kind == "msg":
            out[name] = _decode(val, sub)
        elif kind == "rmsg":
            out.setdefault(name, []).append(_decode(val, sub))
        elif kind == "rstring":
            out.setdefault(name, []).append(bytes(val).decode())
        elif kind in ("map_ss", "map_sb"):
            entry = {n: v for n, _, v in _fields(val)}
            key = bytes(entry.get(1, b"")).decode()
            raw = bytes(entry.get(2, b""))
            out.setdefault(name, {})[key] = raw.decode() if kind == "map_ss" else base64.b64encode(raw).decode()
        elif kind == "intorstr":
            ios = _decode(val, sub)
            out[name] = ios.get("strVal", "") if ios.get("type") == 1 else ios.get("intVal", 0)
        elif kind == "time":
            t = _decode(val, {1: ("seconds", "int", None)})
            out[name] = datetime.datetime.fromtimestamp(t.get("seconds", 0), datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%SZ")
    return out


def decode_body(data: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it stands for; 415 for kinds we cannot read."""
    if not data.startswith(MAGIC):
        raise APIError(415, "the protobuf body lacks the k8s magic prefix", reason="UnsupportedMediaType")
    try:
        envelope = _decode(data[len(MAGIC):], UNKNOWN)
        kind = envelope.get("typeMeta", {}).get("kind", "")
        schema = KINDS.get(kind)
        if schema is None:
            raise APIError(415, f"protobuf bodies of kind {kind!r} are not supported by this server; send "
                           "application/json", reason="UnsupportedMediaType")
        obj = _decode(envelope.get("raw", b""), schema)
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"error decoding protobuf body: {exc}") from exc
    if kind != "DeleteOptions":
        obj = {"apiVersion": envelope["typeMeta"].get("apiVersion", "v1"), "kind": kind, **obj}
    return obj
