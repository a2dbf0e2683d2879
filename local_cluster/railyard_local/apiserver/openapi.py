"""OpenAPI documents: v3 per group-version (what ``kubectl explain`` and ``kubectl apply`` read)
and v2 (JSON for tools that ask for it; an empty protobuf document for kubectl's client-side
validation, which then defers to server-side field validation advertised in v3)."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .errors import APIError

if TYPE_CHECKING:
    from .registry import Registry, ResourceType

JSON = dict[str, Any]

_OBJECT_META_REF = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_OBJECT_META: JSON = {
    "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects "
                   "users must create.",
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name must be unique within a namespace."},
        "generateName": {"type": "string", "description": "GenerateName is an optional prefix, used by the server, "
                         "to generate a unique name ONLY IF the Name field has not been provided."},
        "namespace": {"type": "string", "description": "Namespace defines the space within which each name must be "
                      "unique."},
        "uid": {"type": "string", "description": "UID is the unique in time and space value for this object."},
        "resourceVersion": {"type": "string", "description": "An opaque value that represents the internal version "
                            "of this object."},
        "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a "
                       "specific generation of the desired state."},
        "creationTimestamp": {"type": "string", "format": "date-time", "description": "CreationTimestamp is a "
                              "timestamp representing the server time when this object was created."},
        "deletionTimestamp": {"type": "string", "format": "date-time", "description": "DeletionTimestamp is RFC "
                              "3339 date and time at which this resource will be deleted."},
        "deletionGracePeriodSeconds": {"type": "integer", "format": "int64", "description": "Number of seconds "
                                       "allowed for this object to gracefully terminate."},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Map of string "
                   "keys and values that can be used to organize and categorize objects."},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}, "description":
                        "Annotations is an unstructured key value map."},
        "finalizers": {"type": "array", "items": {"type": "string"}, "description": "Must be empty before the "
                       "object is deleted from the registry.", "x-kubernetes-patch-strategy": "merge",
                       "x-kubernetes-list-type": "set"},
        "ownerReferences": {"type": "array", "items": {"type": "object"}, "description": "List of objects depended "
                            "by this object.", "x-kubernetes-patch-merge-key": "uid",
                            "x-kubernetes-patch-strategy": "merge"},
    },
}

_BUILTIN_DESCRIPTIONS = {
    "Pod": "Pod is a collection of containers that can run on a host.",
    "Node": "Node is a worker node in Kubernetes.",
    "Namespace": "Namespace provides a scope for Names.",
    "Service": "Service is a named abstraction of software service.",
    "ConfigMap": "ConfigMap holds configuration data for pods to consume.",
    "Secret": "Secret holds secret data of a certain type.",
    "ServiceAccount": "ServiceAccount binds together a name, a principal and a set of secrets.",
    "Event": "Event is a report of an event somewhere in the cluster.",
    "Lease": "Lease defines a lease concept.",
    "CustomResourceDefinition": "CustomResourceDefinition represents a resource that should be exposed on the API "
                                "server.",
}


def _reverse_group(group: str) -> str:
    return ".".join(reversed(group.split(".")))


def schema_name(rt: ResourceType, version: str) -> str:
    if rt.is_custom:
        return f"{_reverse_group(rt.group)}.{version}.{rt.kind}"
    group = {"": "core", "coordination.k8s.io": "coordination", "events.k8s.io": "events",
             "apiextensions.k8s.io": "apiextensions"}.get(rt.group, rt.group)
    if rt.group == "apiextensions.k8s.io":
        return f"io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.{version}.{rt.kind}"
    return f"io.k8s.api.{group}.{version}.{rt.kind}"


def _kind_schema(rt: ResourceType, version: str, v3: bool) -> JSON:
    ref_prefix = "#/components/schemas/" if v3 else "#/definitions/"
    gvk = [{"group": rt.group, "kind": rt.kind, "version": version}]
    if rt.is_custom and version in rt.schemas:
        s = copy.deepcopy(rt.schemas[version].raw)
    else:
        s = {"type": "object", "description": _BUILTIN_DESCRIPTIONS.get(rt.kind, rt.kind),
             "properties": {
                 "spec": {"type": "object", "description": f"Specification of the {rt.kind}.",
                          "x-kubernetes-preserve-unknown-fields": True},
                 "status": {"type": "object", "description": f"Most recently observed status of the {rt.kind}.",
                            "x-kubernetes-preserve-unknown-fields": True},
             }}
    props = s.setdefault("properties", {})
    props["apiVersion"] = {"type": "string", "description": "APIVersion defines the versioned schema of this "
                           "representation of an object."}
    props["kind"] = {"type": "string", "description": "Kind is a string value representing the REST resource this "
                     "object represents."}
    meta_ref = {"$ref": ref_prefix + _OBJECT_META_REF}
    props["metadata"] = ({"allOf": [meta_ref], "description": "Standard object's metadata."} if v3 else meta_ref)
    s["x-kubernetes-group-version-kind"] = gvk
    return s


def _list_schema(rt: ResourceType, version: str, v3: bool) -> JSON:
    ref_prefix = "#/components/schemas/" if v3 else "#/definitions/"
    return {"type": "object", "description": f"{rt.kind}List is a list of {rt.kind}",
            "required": ["items"],
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                           "items": {"type": "array", "items": {"$ref": ref_prefix + schema_name(rt, version)}},
                           "metadata": {"type": "object"}},
            "x-kubernetes-group-version-kind": [{"group": rt.group, "kind": f"{rt.kind}List", "version": version}]}


def _operations(rt: ResourceType, version: str, prefix: str, v3: bool) -> dict[str, JSON]:
    ref = ("#/components/schemas/" if v3 else "#/definitions/") + schema_name(rt, version)
    gvk = {"group": rt.group, "kind": rt.kind, "version": version}
    fv: JSON = {
        "name": "fieldValidation",
        "in": "query",
        "description": "fieldValidation instructs the server on how to "
        "handle objects in the request containing unknown or duplicate fields.",
        "schema": {"type": "string", "uniqueItems": True},
    }
    dry: JSON = {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
    if not v3:
        fv = {"name": "fieldValidation", "in": "query", "type": "string", "uniqueItems": True}
        dry = {"name": "dryRun", "in": "query", "type": "string", "uniqueItems": True}

    def op(action: str, params: list[JSON] | None = None, body: list[str] | None = None) -> JSON:
        o: JSON = {"operationId": f"{action}{rt.kind}", "x-kubernetes-action": action,
                   "x-kubernetes-group-version-kind": gvk, "parameters": params or [],
                   "responses": {"200": {"description": "OK"}}}
        if v3:
            o["responses"]["200"]["content"] = {"application/json": {"schema": {"$ref": ref}}}
            if body:
                o["requestBody"] = {"content": {ct: {"schema": {"$ref": ref} if ct == "*/*" else {"type": "object"}}
                                                for ct in body}, "required": True}
        else:
            o["responses"]["200"]["schema"] = {"$ref": ref}
            if body:
                o["consumes"] = body
        return o

    patch_types = ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]
    ns_part = "namespaces/{namespace}/" if rt.namespaced else ""
    collection = f"{prefix}/{ns_part}{rt.plural}"
    item = collection + "/{name}"
    paths = {
        collection: {"get": op("list"), "post": op("post", [fv, dry], ["*/*"])},
        item: {"get": op("get"), "put": op("put", [fv, dry], ["*/*"]), "patch": op("patch", [fv, dry], patch_types),
               "delete": op("delete", [dry])},
    }
    if rt.status_subresource:
        paths[item + "/status"] = {"get": op("get"), "put": op("put", [fv, dry], ["*/*"]),
                                   "patch": op("patch", [fv, dry], patch_types)}
    return paths


def gv_document(registry: Registry, group: str, version: str) -> JSON:
    schemas: JSON = {_OBJECT_META_REF: _OBJECT_META}
    paths: JSON = {}
    prefix = "/api/v1" if not group else f"/apis/{group}/{version}"
    for rt in registry.all():
        if rt.group != group or version not in rt.versions:
            continue
        schemas[schema_name(rt, version)] = _kind_schema(rt, version, True)
        schemas[schema_name(rt, version) + "List"] = _list_schema(rt, version, True)
        paths.update(_operations(rt, version, prefix, True))
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.34.0"}, "paths": paths,
            "components": {"schemas": schemas}}


def v2_document(registry: Registry) -> JSON:
    definitions: JSON = {_OBJECT_META_REF: _OBJECT_META}
    paths: JSON = {}
    for rt in registry.all():
        for version in rt.versions:
            prefix = "/api/v1" if not rt.group else f"/apis/{rt.group}/{version}"
            definitions[schema_name(rt, version)] = _kind_schema(rt, version, False)
            definitions[schema_name(rt, version) + "List"] = _list_schema(rt, version, False)
            paths.update(_operations(rt, version, prefix, False))
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.34.0"}, "paths": paths,
            "definitions": definitions}


def _gv_keys(registry: Registry) -> list[tuple[str, str]]:
    out = [("", "v1")]
    for group, versions in registry.groups().items():
        out.extend((group, v) for v in versions)
    return out


def handle(registry: Registry, request: web.Request, segs: list[str]) -> web.Response:
    if segs == ["v2"]:
        if "protobuf" in request.headers.get("Accept", "") and "json" not in request.headers.get("Accept", ""):
            # An empty protobuf message is a valid, empty OpenAPI v2 Document.
            return web.Response(body=b"", content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        return web.json_response(v2_document(registry))
    if segs == ["v3"]:
        paths = {}
        for group, version in _gv_keys(registry):
            key = "api/v1" if not group else f"apis/{group}/{version}"
            doc = json.dumps(gv_document(registry, group, version), sort_keys=True).encode()
            digest = hashlib.sha512(doc).hexdigest()[:64].upper()
            paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest}"}
        return web.json_response({"paths": paths})
    if len(segs) >= 3 and segs[0] == "v3":
        rest = segs[1:]
        if rest[:2] == ["api", "v1"] and len(rest) == 2:
            return web.json_response(gv_document(registry, "", "v1"))
        if rest[0] == "apis" and len(rest) == 3 and rest[2] in registry.groups().get(rest[1], []):
            return web.json_response(gv_document(registry, rest[1], rest[2]))
    raise APIError(404, "the server could not find the requested resource", reason="NotFound")
