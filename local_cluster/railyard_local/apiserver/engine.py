"""The API semantics, independent of HTTP: create, update, patch, apply, delete, get, list.

Every method that changes state computes the new object and hands it to the store without
awaiting in between, so the check-then-write sequences (resourceVersion preconditions, name
uniqueness) are atomic on the event loop. Durability is awaited afterwards.

A write goes through the stages kube-apiserver runs, in its order: decode (pruning unknown
fields, time formats), defaulting, field management (``metadata.managedFields``; server-side
apply merges here), the kind's strategy (status reset, generation), mutating admission
(admission.py: service-account token volume, default tolerations, priority), validation, then
validating admission (Pod Security).
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from railyard_local import jsonexact

from . import admission, builtins, fieldmanager, patch, typeinfo
from .errors import APIError, Cause, already_exists, bad_request, conflict, invalid, not_found
from .registry import CRD_KEY, LEASE_KEY, Registry, ResourceType
from .selectors import Matcher, field_matcher, label_matcher
from .store import Entry, Store, dumps

JSON = dict[str, Any]

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"

#: Kinds whose strategy keeps metadata.generation (the others have none).
_GENERATION = frozenset({"pods", CRD_KEY, "deployments.apps", "statefulsets.apps", "daemonsets.apps", "jobs.batch",
                         "poddisruptionbudgets.policy", "networkpolicies.networking.k8s.io",
                         "deviceclasses.resource.k8s.io", "resourceslices.resource.k8s.io",
                         "priorityclasses.scheduling.k8s.io"})


_LAST_SECOND: list[Any] = [None, ""]


def rfc3339(ts: float) -> str:
    second = int(ts)
    if _LAST_SECOND[0] != second:  # one strftime per second, not one per write
        _LAST_SECOND[:] = [second, datetime.datetime.fromtimestamp(second, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")]
    text: str = _LAST_SECOND[1]
    return text


_RANDOM_POOL = bytearray()


def new_uid() -> str:
    """A random (version 4) UUID, as ``str(uuid.uuid4())``, from urandom read 4 KiB at a time
    (one system call per 256 objects, not one per create)."""
    if len(_RANDOM_POOL) < 16:
        _RANDOM_POOL.extend(os.urandom(4096))
    b = _RANDOM_POOL[-16:]
    del _RANDOM_POOL[-16:]
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def random_suffix(n: int = 5) -> str:
    """apimachinery's utilrand.String: lower-case consonants and digits that spell no words."""
    return "".join(random.choices(_NAME_CHARS, k=n))


@dataclass
class Ctx:
    """Per-request options that change how a write is processed."""

    dry_run: bool = False
    field_validation: str = "Warn"
    warnings: list[str] = field(default_factory=list)
    manager: str | None = None
    """The field manager (``fieldManager``, else the User-Agent's first word); None for the
    server's own writes, which leave managedFields as they are."""
    force: bool = False


@dataclass
class DeleteOptions:
    grace_period_seconds: int | None = None
    propagation_policy: str | None = None
    precondition_uid: str | None = None
    precondition_rv: str | None = None


def strip_for_generation(obj: JSON, status_subresource: bool) -> JSON:
    return {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")
            and not (status_subresource and k == "status")}


class Engine:
    def __init__(self, store: Store, registry: Registry, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.on_write: list[Callable[[ResourceType, Entry, bool], None]] = []
        """Hooks run synchronously after every non-dry-run write (controllers, CRD registration)."""
        self.after_namespace_created: list[Callable[[str], list[JSON]]] = []
        """Objects to create in a new namespace in the same turn as it (ServiceAccount, CA bundle)."""

    def now(self) -> str:
        return rfc3339(self.clock())

    # ---- helpers ---------------------------------------------------------------------------

    def _commit(self, rt: ResourceType, obj: JSON, ctx: Ctx, *, delete: bool = False) -> tuple[Entry, Any]:
        if ctx.dry_run:
            return Entry(obj, dumps(obj)), None
        entry, fut = self.store.write(rt.key, obj, delete=delete)
        for hook in self.on_write:
            hook(rt, entry, delete)
        return entry, fut

    async def _write(self, rt: ResourceType, obj: JSON, ctx: Ctx, *, delete: bool = False) -> Entry:
        entry, fut = self._commit(rt, obj, ctx, delete=delete)
        if fut is not None:
            await fut
        return entry

    def get(self, rt: ResourceType, ns: str, name: str) -> Entry:
        entry = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if entry is None:
            raise not_found(rt.group, rt.plural, name)
        return entry

    def matchers(self, rt: ResourceType, label_selector: str | None, field_selector: str | None) -> list[Matcher]:
        out = []
        lm = label_matcher(label_selector)
        if lm:
            out.append(lm)
        allowed = rt.field_selectors
        if rt.is_custom and rt.crd is not None:
            extra = set()
            for v in rt.crd["spec"].get("versions", []):
                for sf in v.get("selectableFields") or []:
                    extra.add(sf["jsonPath"].lstrip("."))
            allowed = (allowed or frozenset()) | frozenset(extra)
        fm = field_matcher(field_selector, allowed, rt.kind, custom_labels=rt.field_label_conversion)
        if fm:
            out.append(fm)
        return out

    def list(self, rt: ResourceType, ns: str | None, matchers: list[Matcher]) -> tuple[list[Entry], int]:
        rv = self.store.rv
        entries = self.store.items(rt.key, ns if rt.namespaced else None)
        result = [e for e in entries if all(m(e.obj) for m in matchers)] if matchers else list(entries)
        result.sort(key=lambda e: (e.obj["metadata"].get("namespace", ""), e.obj["metadata"]["name"]))
        return result, rv

    def _check_namespace(self, rt: ResourceType, ns: str) -> None:
        if not rt.namespaced:
            return
        ns_entry = self.store.get("namespaces", "", ns)
        if ns_entry is None:
            raise not_found("", "namespaces", ns)
        if ns_entry.obj["metadata"].get("deletionTimestamp"):
            raise APIError(
                403,
                f"{rt.plural} \"...\" is forbidden: unable to create new content in namespace {ns} "
                "because it is being terminated",
                reason="Forbidden",
                details={"causes": [{"reason": "NamespaceTerminating", "field": "metadata.namespace",
                                      "message": f"namespace {ns} is being terminated"}]},
            )

    def _check_type(self, rt: ResourceType, obj: Any, version: str) -> JSON:
        if not isinstance(obj, dict):
            raise bad_request("the request body must be a JSON object")
        api_version = obj.get("apiVersion")
        kind = obj.get("kind")
        if kind and kind != rt.kind:
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        if api_version and api_version != rt.api_version(version):
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rt.api_version(version)})"
            )
        meta = obj.get("metadata")
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        return {"apiVersion": rt.api_version(version), "kind": rt.kind, "metadata": meta, **rest}

    def to_storage(self, rt: ResourceType, obj: JSON, version: str) -> JSON:
        if rt.storage_key == "events":
            return builtins.event_from_events_v1(obj)
        obj["apiVersion"] = rt.api_version(rt.storage_version)
        return obj

    def from_storage(self, rt: ResourceType, entry: Entry, version: str) -> bytes:
        """The stored object as served at ``version`` (CR versions differ only in apiVersion)."""
        if rt.storage_key == "events":
            return dumps(builtins.event_to_events_v1(entry.clone()))
        if version == rt.storage_version:
            return entry.raw
        obj = entry.clone()
        obj["apiVersion"] = rt.api_version(version)
        return dumps(obj)

    def type_of(self, rt: ResourceType, version: str) -> typeinfo.TypeNode:
        """The shape server-side apply merges by (CRD schema, or the built-in kind's)."""
        if rt.is_custom:
            cached = rt.types.get(version)
            if cached is None:
                schema = rt.schemas.get(version) or rt.schemas.get(rt.storage_version)
                cached = typeinfo.from_schema(schema.raw if schema is not None else {}, root=True)
                rt.types[version] = cached
            return cached
        return typeinfo.builtin(rt.key)

    @staticmethod
    def _reset_fields(rt: ResourceType, subresource: str | None, obj: JSON) -> fieldmanager.Trie | None:
        """Fields an operation cannot own: status on the main resource (when it has a status
        subresource), everything but status on /status."""
        if subresource == "status":
            return {f"f:{k}": {fieldmanager.MEMBER: {}} for k in obj if k not in ("status", "apiVersion", "kind")}
        if rt.status_subresource and rt.resets_status:
            return {"f:status": {fieldmanager.MEMBER: {}}}
        return None

    def _decode(self, rt: ResourceType, obj: JSON, version: str, ctx: Ctx) -> None:
        """What decoding does: prune unknown fields of a custom resource (warning or, with
        ``fieldValidation=Strict``, refusing), parse time formats, apply the defaults."""
        if rt.is_custom:
            schema = rt.schemas.get(version) or rt.schemas.get(rt.storage_version)
            if schema is not None:
                pruned = schema.prune(obj)
                if pruned:
                    msgs = [f'unknown field "{p}"' for p in pruned]
                    if ctx.field_validation == "Strict":
                        raise bad_request(f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: '
                                          "strict decoding error: " + ", ".join(msgs))
                    if ctx.field_validation == "Warn":
                        ctx.warnings.extend(msgs)
                schema.default(obj)
        else:
            builtins.decode(rt, obj, version)
            builtins.default(rt, obj, self)

    def _validate(self, rt: ResourceType, obj: JSON, old: JSON | None, version: str) -> None:
        causes: list[Cause] = []
        if rt.is_custom:
            schema = rt.schemas.get(version) or rt.schemas.get(rt.storage_version)
            if schema is not None:
                causes.extend(schema.validate(obj, old))
        causes.extend(builtins.validate_meta(rt, obj, old))
        causes.extend(builtins.validate(rt, obj, old, self))
        if causes:
            group = "" if rt.group == "events.k8s.io" else rt.group
            raise invalid(rt.kind, group, obj["metadata"].get("name", ""), causes)

    def _manage_update(self, rt: ResourceType, live: JSON | None, new: JSON, version: str, ctx: Ctx,
                       subresource: str | None, request_meta: JSON | None) -> None:
        """Record an Update operation of ``ctx.manager`` in ``new``'s managedFields."""
        meta = new["metadata"]
        live_meta = live["metadata"] if live is not None else None
        managers = fieldmanager.managers_for_request(live_meta, request_meta, subresource)
        meta.pop("managedFields", None)
        if ctx.manager is not None:
            base = {k: v for k, v in live.items()} if live is not None else typeinfo.zero_object(rt.key, rt.group)
            base = dict(base)
            if "metadata" in base:
                base["metadata"] = {k: v for k, v in base["metadata"].items() if k != "managedFields"}
            me = fieldmanager.Manager(ctx.manager, "Update", rt.api_version(version), subresource or "")
            managers = fieldmanager.update(managers, base, new, self.type_of(rt, version), me,
                                           self._reset_fields(rt, subresource, new), self.now())
        encoded = fieldmanager.encode(managers)
        if encoded:
            meta["managedFields"] = encoded

    # ---- create ----------------------------------------------------------------------------

    async def create(self, rt: ResourceType, ns: str, body: Any, ctx: Ctx, version: str | None = None, *,
                     managed: bool = False) -> Entry:
        """Create ``body``. ``managed``: its managedFields are already computed (apply)."""
        version = version or rt.storage_version
        obj = self._check_type(rt, body, version)
        meta = obj["metadata"]
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if not isinstance(meta.get("name", ""), str) or not isinstance(meta.get("generateName", ""), str):
            raise invalid(rt.kind, rt.group, "", [Cause("metadata.name", "FieldValueInvalid",
                                                       "Invalid value: name and generateName must be strings")])
        if not meta.get("name") and not meta.get("generateName"):
            raise invalid(rt.kind, rt.group, "", [
                Cause("metadata.name", "FieldValueRequired", "Required value: name or generateName is required")])
        self._check_namespace(rt, ns)
        if rt.crd is not None:
            crd = self.store.get(CRD_KEY, "", rt.crd["metadata"]["name"])
            if crd is not None and crd.obj["metadata"].get("deletionTimestamp"):
                raise APIError(405, "create not allowed while custom resource definition is terminating",
                               reason="MethodNotAllowed")
        for k in ("labels", "annotations"):
            if meta.get(k) == {}:  # empty maps are omitted (omitempty), and own no field
                del meta[k]
        request_meta = dict(meta)
        for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "uid", "creationTimestamp",
                  "generation", "selfLink"):
            meta.pop(k, None)
        self._decode(rt, obj, version, ctx)
        if not managed:
            self._manage_update(rt, None, obj, version, ctx, None, request_meta)
        obj = self.to_storage(rt, obj, version)
        meta = obj["metadata"]
        if not meta.get("name"):
            meta["name"] = meta["generateName"] + random_suffix()
        meta["uid"] = new_uid()
        meta["creationTimestamp"] = self.now()
        if rt.key in _GENERATION or rt.is_custom:
            meta["generation"] = 1
        if rt.status_subresource and rt.is_custom:
            obj.pop("status", None)
        builtins.prepare_create(rt, obj, self)
        admission.mutate(self, rt, obj, None, ctx)
        self._validate(rt, obj, None, version)
        admission.validate(self, rt, obj, None, ctx)
        if self.store.get(rt.key, meta.get("namespace", ""), meta["name"]) is not None:
            if meta.get("generateName") and not body.get("metadata", {}).get("name"):
                raise APIError(409, f'{rt.plural} "{meta["name"]}" already exists, the server was not able to '
                               "generate a unique name for the object", reason="AlreadyExists")
            raise already_exists(rt.group, rt.plural, meta["name"])
        if rt.key == "namespaces" and not ctx.dry_run:
            return await self._create_namespace(rt, obj, ctx)
        return await self._write(rt, obj, ctx)

    async def _create_namespace(self, rt: ResourceType, obj: JSON, ctx: Ctx) -> Entry:
        """A namespace, and in the same turn what its controllers would add (so that no client
        sees a namespace without its ``default`` ServiceAccount)."""
        entry, fut = self._commit(rt, obj, ctx)
        futures = [fut]
        for hook in self.after_namespace_created:
            for child in hook(obj["metadata"]["name"]):
                crt = self.registry.by_key(child.pop("_rkey"))
                manager = child.pop("_manager", None)
                if crt is None or self.store.get(crt.key, child["metadata"]["namespace"],
                                                 child["metadata"]["name"]) is not None:
                    continue
                if manager:
                    self._manage_update(crt, None, child, crt.storage_version, Ctx(manager=manager), None, None)
                child["metadata"].setdefault("uid", new_uid())
                child["metadata"].setdefault("creationTimestamp", self.now())
                futures.append(self._commit(crt, child, Ctx())[1])
        for f in futures:
            if f is not None:
                await f
        return entry

    # ---- update ----------------------------------------------------------------------------

    def _prepare_update(self, rt: ResourceType, old_entry: Entry, new: JSON, subresource: str | None,
                        ctx: Ctx, version: str, *, managed: bool = False) -> JSON | None:
        """The object to store, or None when nothing changed. Raises on conflicts and invalid objects."""
        old = old_entry.obj
        meta = new["metadata"]
        name = old["metadata"]["name"]
        if meta.get("name") and meta["name"] != name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise conflict(
                rt.group,
                rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        if meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
            raise conflict(rt.group, rt.plural, name, "Precondition failed: UID in precondition does not match")
        request_meta = dict(meta)
        self._decode(rt, new, version, ctx)
        # the live object as the request's version sees it (read only: no copy when it is stored so)
        live_view = old_entry.obj if rt.storage_key is None and version == rt.storage_version else \
            json.loads(self.from_storage(rt, old_entry, version))
        if not managed:
            self._manage_update(rt, live_view, new, version, ctx, subresource, request_meta)
        managed_fields = new["metadata"].get("managedFields")
        new = self.to_storage(rt, new, version)
        if subresource == "status":
            if rt.is_custom:
                result = old_entry.clone()
                if "status" in new:
                    result["status"] = new["status"]
                else:
                    result.pop("status", None)
                new = result
            else:
                # The stored spec itself: stored objects are never mutated, and nothing below
                # changes a built-in's spec in place (a JSON round trip of the whole object
                # for one field was most of a status write).
                result = dict(new)
                for k in ("spec",):
                    if k in old:
                        result[k] = old[k]
                    else:
                        result.pop(k, None)
                new = result
        elif rt.status_subresource:
            if "status" in old:
                new["status"] = old["status"]  # shared, read only (as the spec above)
            else:
                new.pop("status", None)
        meta = new["metadata"]
        for k in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                  "deletionGracePeriodSeconds", "generation"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
            else:
                meta.pop(k, None)
        meta.pop("resourceVersion", None)
        if managed_fields:
            meta["managedFields"] = managed_fields
        else:
            meta.pop("managedFields", None)
        if subresource != "status" and old["metadata"].get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old["metadata"].get("finalizers") or [])
            if added:
                raise invalid(rt.kind, rt.group, name, [Cause(
                    "metadata.finalizers", "FieldValueForbidden",
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new "
                    f"finalizers {sorted(added)}")])
        builtins.prepare_update(rt, new, old, subresource, self)
        admission.mutate(self, rt, new, old, ctx)
        self._validate(rt, new, old, version)
        admission.validate(self, rt, new, old, ctx)
        if "generation" in old["metadata"] and \
                strip_for_generation(new, rt.status_subresource) != strip_for_generation(old, rt.status_subresource):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        old_cmp = dict(old)
        old_cmp["metadata"] = {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}
        if new == old_cmp:
            return None
        return new

    @staticmethod
    def _should_remove(obj: JSON) -> bool:
        """Deleting, no finalizers left, grace period over (and, for a namespace, emptied)."""
        meta = obj["metadata"]
        if obj.get("kind") == "Namespace" and (obj.get("spec") or {}).get("finalizers"):
            return False
        return bool(meta.get("deletionTimestamp")) and not meta.get("finalizers") and \
            not meta.get("deletionGracePeriodSeconds")

    async def _store_update(self, rt: ResourceType, new: JSON, ctx: Ctx) -> Entry:
        if self._should_remove(new):
            return await self._write(rt, new, ctx, delete=True)
        return await self._write(rt, new, ctx)

    async def update(self, rt: ResourceType, ns: str, name: str, body: Any, ctx: Ctx,
                     subresource: str | None = None, version: str | None = None) -> Entry:
        version = version or rt.storage_version
        new = self._check_type(rt, body, version)
        old_entry = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if old_entry is None:
            if rt.key in (LEASE_KEY, "events", "nodes") and subresource is None:
                new["metadata"].setdefault("name", name)
                return await self.create(rt, ns, body, ctx, version)
            raise not_found(rt.group, rt.plural, name)
        if rt.namespaced and new["metadata"].get("namespace") not in (None, "", ns):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        prepared = self._prepare_update(rt, old_entry, new, subresource, ctx, version)
        if prepared is None:
            return old_entry
        return await self._store_update(rt, prepared, ctx)

    async def patch(self, rt: ResourceType, ns: str, name: str, content_type: str, data: bytes, ctx: Ctx,
                    subresource: str | None = None, version: str | None = None) -> Entry:
        version = version or rt.storage_version
        old_entry = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if old_entry is None:
            raise not_found(rt.group, rt.plural, name)
        current = jsonexact.loads(self.from_storage(rt, old_entry, version))  # the server's compact JSON
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise bad_request(f"error decoding patch: {exc}") from exc
        ctype = content_type.split(";")[0].strip()
        if ctype == "application/merge-patch+json":
            result = patch.merge_patch(current, doc)
        elif ctype == "application/json-patch+json":
            result = patch.json_patch(current, doc)
        elif ctype == "application/strategic-merge-patch+json":
            if rt.is_custom:
                raise APIError(415, "the body of the request was in an unknown format - accepted media types "
                               "include: application/json-patch+json, application/merge-patch+json, "
                               "application/apply-patch+yaml", reason="UnsupportedMediaType")
            result = patch.strategic_merge_patch(current, doc, rt.kind)
        else:
            raise APIError(415, "the body of the request was in an unknown format - accepted media types include: "
                           "application/json-patch+json, application/merge-patch+json, "
                           "application/strategic-merge-patch+json", reason="UnsupportedMediaType")
        if not isinstance(result, dict):
            raise bad_request("the patched object must be a JSON object")
        result.setdefault("metadata", {})
        if not isinstance(result["metadata"], dict):
            raise bad_request("metadata must be an object")
        result["metadata"].setdefault("resourceVersion", old_entry.obj["metadata"]["resourceVersion"])
        new = self._check_type(rt, result, version)
        prepared = self._prepare_update(rt, old_entry, new, subresource, ctx, version)
        if prepared is None:
            return old_entry
        return await self._store_update(rt, prepared, ctx)

    async def apply(self, rt: ResourceType, ns: str, name: str, config: Any, ctx: Ctx,
                    subresource: str | None = None, version: str | None = None) -> tuple[Entry, bool]:
        """Server-side apply of ``config`` by ``ctx.manager``; returns (entry, created)."""
        version = version or rt.storage_version
        if not isinstance(config, dict):
            raise bad_request("apply patch must be an object")
        if ctx.manager is None:
            raise invalid("PatchOptions", "meta.k8s.io", "", [Cause(
                "fieldManager", "FieldValueRequired", "Required value: is required for apply patch")])
        for key in ("apiVersion", "kind"):
            if not config.get(key):
                raise bad_request(f"{key} must be set")
        config = self._check_type(rt, config, version)
        cmeta = config["metadata"]
        if cmeta.get("name") and cmeta["name"] != name:
            raise bad_request(f"the name of the object ({cmeta['name']}) does not match the name on the URL ({name})")
        cmeta.pop("managedFields", None)
        if rt.is_custom:
            schema = rt.schemas.get(version) or rt.schemas.get(rt.storage_version)
            if schema is not None:
                pruned = schema.prune(config)
                if pruned and ctx.field_validation == "Strict":
                    raise bad_request(
                        "error strict decoding YAML: " + ", ".join(f'unknown field "{p}"' for p in pruned)
                    )
                if pruned and ctx.field_validation == "Warn":
                    ctx.warnings.extend(f'unknown field "{p}"' for p in pruned)
        live_entry = self.store.get(rt.key, ns if rt.namespaced else "", name)
        if live_entry is None and subresource is not None:
            raise not_found(rt.group, rt.plural, name)
        if live_entry is None:
            live = copy.deepcopy(typeinfo.zero_object(rt.key, rt.group))
            live.setdefault("metadata", {})
            live["metadata"] = {k: v for k, v in live["metadata"].items() if v is not None}
            managers: list[fieldmanager.Manager] = []
        else:
            live = json.loads(self.from_storage(rt, live_entry, version))
            managers = fieldmanager.decode(live["metadata"].get("managedFields") or []) or []
            live["metadata"].pop("managedFields", None)
        me = fieldmanager.Manager(ctx.manager, "Apply", rt.api_version(version), subresource or "")
        result = fieldmanager.apply(managers, live, config, self.type_of(rt, version), me, ctx.force,
                                    self._reset_fields(rt, subresource, config), self.now())
        obj = result.obj
        obj.setdefault("metadata", {})
        if live_entry is None:
            obj["metadata"]["name"] = name
        encoded = fieldmanager.encode(result.managers)
        if encoded:
            obj["metadata"]["managedFields"] = encoded
        else:
            obj["metadata"].pop("managedFields", None)
        if live_entry is None:
            return await self.create(rt, ns, obj, ctx, version, managed=True), True
        obj["metadata"]["resourceVersion"] = live_entry.obj["metadata"]["resourceVersion"]
        new = self._check_type(rt, obj, version)
        prepared = self._prepare_update(rt, live_entry, new, subresource, ctx, version, managed=True)
        if prepared is None:
            return live_entry, False
        return await self._store_update(rt, prepared, ctx), False

    # ---- delete ----------------------------------------------------------------------------

    async def delete(self, rt: ResourceType, ns: str, name: str, opts: DeleteOptions, ctx: Ctx) -> Entry:
        entry = self.get(rt, ns, name)
        cur = entry.obj
        meta = cur["metadata"]
        if opts.precondition_uid and opts.precondition_uid != meta.get("uid"):
            raise conflict(rt.group, rt.plural, name,
                           f"Precondition failed: UID in precondition: {opts.precondition_uid}, UID in object meta: "
                           f"{meta.get('uid')}")
        if opts.precondition_rv and opts.precondition_rv != meta.get("resourceVersion"):
            raise conflict(rt.group, rt.plural, name,
                           f"Precondition failed: ResourceVersion in precondition: {opts.precondition_rv}, "
                           f"ResourceVersion in object meta: {meta.get('resourceVersion')}")
        obj = entry.clone()
        meta = obj["metadata"]
        finalizers: list[str] = list(meta.get("finalizers") or [])
        policy = opts.propagation_policy
        if policy not in (None, "Background", "Foreground", "Orphan"):
            raise invalid("DeleteOptions", "", "", [Cause("propagationPolicy", "FieldValueNotSupported",
                          f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"')])
        already = bool(meta.get("deletionTimestamp"))
        if rt.key == CRD_KEY and not already and "customresourcecleanup.apiextensions.k8s.io" not in finalizers:
            # upstream adds it on the first delete, then empties the resource before removing it
            finalizers.append("customresourcecleanup.apiextensions.k8s.io")
        if policy == "Foreground" and "foregroundDeletion" not in finalizers:
            finalizers.append("foregroundDeletion")
        if policy == "Orphan" and "orphan" not in finalizers:
            finalizers.append("orphan")
        grace = builtins.grace_period(rt, obj, opts.grace_period_seconds)
        if rt.key == "pods" and not already:
            # the pod strategy stamps every deletion, an immediate one included, and counts it as a
            # change of the pod (generation), as a v1.36 server answers
            meta["generation"] = int(meta.get("generation", 1)) + 1
            meta["deletionTimestamp"] = rfc3339(self.clock() + (grace or 0))
            meta["deletionGracePeriodSeconds"] = grace or 0
        if rt.key == "namespaces" and not already:
            obj.setdefault("status", {})["phase"] = "Terminating"
        # namespaces and CRDs are emptied first by the controllers (controllers.py)
        pending_content = (rt.key == "namespaces" and bool((obj.get("spec") or {}).get("finalizers"))) or (
            rt.key == CRD_KEY and "customresourcecleanup.apiextensions.k8s.io" in finalizers)
        if not finalizers and not grace and not pending_content:
            return await self._write(rt, obj, ctx, delete=True)
        if already:
            changed = False
            if (meta.get("deletionGracePeriodSeconds") or 0) > (grace or 0):
                # a shorter grace period (0: the node agent confirms) shortens the wait
                meta["deletionGracePeriodSeconds"] = grace or 0
                meta["deletionTimestamp"] = rfc3339(self.clock() + (grace or 0))
                changed = True
            if finalizers != list(meta.get("finalizers") or []):
                meta["finalizers"] = finalizers
                changed = True
            if not changed:
                return entry
            if self._should_remove(obj):
                return await self._write(rt, obj, ctx, delete=True)
            return await self._write(rt, obj, ctx)
        meta["deletionTimestamp"] = rfc3339(self.clock() + (grace or 0))
        meta["deletionGracePeriodSeconds"] = grace or 0
        if rt.key != "pods" and int(meta.get("generation") or 0) > 0:
            # upstream's store bumps the generation of an object whose deletion starts (a change
            # its controllers must see: kueue-v0.13-workload 062, a foreground delete)
            meta["generation"] = int(meta["generation"]) + 1
        if finalizers:
            meta["finalizers"] = finalizers
        return await self._write(rt, obj, ctx)

    async def remove_finalizer(self, rt: ResourceType, entry: Entry, finalizer: str) -> None:
        """Controllers' way to drop one of their finalizers (and remove the object if that was the last)."""
        obj = entry.clone()
        fins = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]
        if fins:
            obj["metadata"]["finalizers"] = fins
        else:
            obj["metadata"].pop("finalizers", None)
        await self._store_update(rt, obj, Ctx())

    async def write_raw(self, rt: ResourceType, obj: JSON, *, delete: bool = False) -> Entry:
        """Store an object the server itself computed (controllers), bypassing validation."""
        return await self._write(rt, obj, Ctx(), delete=delete)

    # ---- pod subresources ------------------------------------------------------------------

    async def bind(self, ns: str, name: str, body: Any, ctx: Ctx) -> None:
        rt = self.registry.lookup("", "v1", "pods")
        assert rt is not None
        entry = self.get(rt, ns, name)
        if not isinstance(body, dict) or not isinstance(body.get("target"), dict):
            raise invalid("Binding", "", name, [Cause("target", "FieldValueRequired", "Required value")])
        target = body["target"].get("name")
        if not target:
            raise invalid("Binding", "", name, [Cause("target.name", "FieldValueRequired", "Required value")])
        live = entry.obj
        if live["metadata"].get("deletionTimestamp"):
            raise conflict("", "pods", name, "pod is being deleted, cannot be assigned to a host")
        if live["spec"].get("nodeName"):
            raise conflict("", "pods", name,
                           f"pod {name} is already assigned to node \"{live['spec']['nodeName']}\"")
        if live["spec"].get("schedulingGates"):
            raise conflict("", "pods", name, f"pod {name} has non-empty .spec.schedulingGates")
        # A new object sharing the live one's unchanged parts (stored objects are never mutated):
        # only metadata (the store sets its resourceVersion), spec and status are new dicts.
        pod = dict(live)
        pod["metadata"] = dict(live["metadata"])
        pod["spec"] = {**live["spec"], "nodeName": target}
        status = dict(live.get("status") or {})
        conds = [c for c in status.get("conditions", []) if c.get("type") != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                      "lastTransitionTime": self.now()})
        status["conditions"] = conds
        status.pop("nominatedNodeName", None)  # bound: the nomination is over (its owner stays recorded)
        pod["status"] = status
        await self._write(rt, pod, ctx)

