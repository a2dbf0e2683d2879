"""HTTP front end: routing, auth, discovery, list/watch streaming and Status errors (aiohttp)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from railyard_local import podlogs
from railyard_local.podlogs import LogOptionError, parse_log_options
from railyard_local.version import KUBERNETES_VERSION, LOCAL_BUILD, version_parts

from . import discovery, fieldmanager, openapi, protobuf, table
from .controllers import Controllers, namespace_children
from .crd import register_crd_hook, restore_crds, scale_of
from .disruption import evict
from .engine import Ctx, DeleteOptions, Engine
from .errors import APIError, Cause, bad_request, forbidden, invalid, not_supported, status_object
from .nodelifecycle import DEFAULT_SETTINGS, NodeLifecycle, NodeLifecycleSettings
from .pki import ensure_certs
from .registry import Registry, ResourceType
from .selectors import Matcher
from .store import Entry, Event, Store, dumps

JSON = dict[str, Any]
LogProvider = Callable[[JSON, str, bool], Path | None]
"""(pod, container name, previous) -> path of the log file to serve, or None."""

SERVER_VERSION = {"major": version_parts()[0], "minor": version_parts()[1],
                  "gitVersion": f"{KUBERNETES_VERSION}+{LOCAL_BUILD}", "gitCommit": "railyard",
                  "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "python",
                  "compiler": "cpython", "platform": "linux/amd64"}

BOOKMARK_INTERVAL_S = 15.0
DEFAULT_WATCH_TIMEOUT_S = 1800.0
DISCONNECT_CHECK_S = 5.0
_JSON_CT = "application/json"


def int_param(request: web.Request, name: str, default: int = 0) -> int:
    value = request.query.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise bad_request(f"{name} must be an integer, got {value!r}") from None


Headers = dict[str, str] | CIMultiDict[str] | None


def _json(obj: Any, status: int = 200, headers: Headers = None, content_type: str = _JSON_CT) -> web.Response:
    if not content_type:  # the Content-Type (with parameters) is in ``headers``
        return web.Response(body=dumps(obj), status=status, headers=headers)
    return web.Response(body=dumps(obj), status=status, content_type=content_type, headers=headers)


def _raw(body: bytes, status: int = 200, headers: Headers = None) -> web.Response:
    return web.Response(body=body, status=status, content_type=_JSON_CT, headers=headers)


def warning_headers(warnings: list[str]) -> CIMultiDict[str] | None:
    """One ``Warning: 299 - "text"`` header per warning (RFC 7234 quoting), as kube-apiserver sends."""
    if not warnings:
        return None
    out: CIMultiDict[str] = CIMultiDict()
    for w in warnings[:50]:
        out.add("Warning", '299 - "' + w.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return out


def default_log_provider(state_dir: Path) -> LogProvider:
    """Logs at ``<state-dir>/pods/<namespace>/<pod>/<container>.log`` (``.previous.log`` for previous).

    Only paths under the state dir: the server never reads a path an API client could choose.
    """

    def provider(pod: JSON, container: str, previous: bool) -> Path | None:
        meta = pod["metadata"]
        return podlogs.log_file(
            state_dir / "pods", str(meta.get("namespace", "")), str(meta["name"]), container, previous
        )

    return provider


def validate_list_options(q: Any, *, watch: bool) -> None:
    """ListOptions validation (apimachinery's ValidateListOptions): sendInitialEvents only on
    watches and only with resourceVersionMatch=NotOlderThan."""
    causes: list[Cause] = []
    match = q.get("resourceVersionMatch", "")
    send_initial = q.get("sendInitialEvents")
    if watch:
        if send_initial is not None and match != "NotOlderThan":
            causes.append(forbidden("resourceVersionMatch",
                                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"))
        if match:
            if send_initial is None:
                causes.append(
                    forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    )
                )
            if match != "NotOlderThan":
                causes.append(not_supported("resourceVersionMatch", match, ["NotOlderThan"]))
    else:
        if match:
            if not q.get("resourceVersion"):
                causes.append(forbidden("resourceVersionMatch",
                                        "resourceVersionMatch is forbidden unless resourceVersion is provided"))
            if q.get("continue"):
                causes.append(
                    forbidden("resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided")
                )
            if match not in ("Exact", "NotOlderThan"):
                causes.append(not_supported("resourceVersionMatch", match, ["Exact", "NotOlderThan", ""]))
            if match == "Exact" and q.get("resourceVersion") == "0":
                causes.append(forbidden("resourceVersionMatch", 'resourceVersionMatch "exact" is forbidden for '
                                        'resourceVersion "0"'))
        if send_initial is not None:
            causes.append(forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list"))
    if causes:
        raise invalid("ListOptions", "meta.k8s.io", "", causes)


class APIServer:
    """The embedded API server; ``await start()`` then ``url``; ``await stop()`` to shut down."""

    def __init__(self, state_dir: Path | str, *, token: str, host: str = "127.0.0.1", port: int = 0,
                 log_provider: LogProvider | None = None, event_window: int = 20_000, tls: bool = True,
                 accept_token_file: Path | str | None = None, workload_api: bool = True,
                 node_lifecycle: NodeLifecycleSettings | None = DEFAULT_SETTINGS) -> None:
        self.state_dir = Path(state_dir)
        self.accept_token_file = Path(accept_token_file) if accept_token_file else None
        """More bearer tokens, re-read on every request that does not carry ``token``: one per line,
        ``TOKEN`` or ``TOKEN EXPIRES`` (Unix seconds; refused after). Tests hand out tokens that
        expire or rotate through it (exec plugins, service-account token files)."""
        self.tls = tls
        self.ca_file: Path | None = None
        """The CA that signed the serving certificate (None with ``tls=False``)."""
        self.token = token
        self.host = host
        self.port = port
        self.store = Store(self.state_dir, event_window=event_window)
        self.registry = Registry(workload_api=workload_api)
        self.engine = Engine(self.store, self.registry)
        self.controllers = Controllers(self.engine, ensure_certs(self.state_dir / "pki").ca_cert.read_text())
        self.engine.after_namespace_created.append(
            lambda ns: namespace_children(ns, self.controllers.ca_bundle))
        self.log_provider: LogProvider = log_provider or default_log_provider(self.state_dir)
        self.node_lifecycle = NodeLifecycle(self.engine, node_lifecycle) if node_lifecycle is not None else None
        """kube-controller-manager's NotReady rule for nodes whose heartbeats stop (None: off)."""
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._stopping = asyncio.Event()
        self.url = ""

    async def start(self) -> str:
        await self.store.open()
        restore_crds(self.engine)
        self.engine.on_write.append(register_crd_hook(self.engine))
        self.engine.on_write.append(self.controllers.on_write)
        await self.controllers.bootstrap()
        self.controllers.start()
        if self.node_lifecycle is not None:
            self.node_lifecycle.bootstrap()
            self.engine.on_write.append(self.node_lifecycle.on_write)
            self.node_lifecycle.start()
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        ssl_context = None
        if self.tls:
            certs = ensure_certs(self.state_dir / "pki")
            self.ca_file = certs.ca_cert
            ssl_context = certs.server_context()
        self._site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, ssl_context=ssl_context)
        await self._site.start()
        server: Any = self._site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{'https' if self.tls else 'http'}://{host}:{self.port}"
        return self.url

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (watches end), then commit and close."""
        self._stopping.set()
        self.store.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.controllers.stop()
        if self.node_lifecycle is not None:
            await self.node_lifecycle.stop()
        await self.store.close()

    # ---- middleware ------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request,
                          handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        expected = f"Bearer {self.token}"
        if not hmac.compare_digest(auth.encode(), expected.encode()) and not self._accepted(auth):
            return _json(status_object(401, "Unauthorized", "Unauthorized"), 401)
        try:
            return await handler(request)
        except APIError as exc:
            return _json(exc.status(), exc.code)
        except web.HTTPException:
            raise
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as exc:  # the apiserver answers 500 with a Status, never a bare trace
            import traceback

            traceback.print_exc()
            return _json(status_object(500, f"Internal error occurred: {exc!r}", "InternalError"), 500)

    def _accepted(self, auth: str) -> bool:
        if self.accept_token_file is None or not auth.startswith("Bearer "):
            return False
        try:
            lines = self.accept_token_file.read_text().splitlines()
        except OSError:
            return False
        given, now, ok = auth[len("Bearer "):].encode(), time.time(), False
        for line in lines:
            token, _, expires = line.strip().partition(" ")
            if token and hmac.compare_digest(given, token.encode()) and (not expires or now < float(expires)):
                ok = True
        return ok

    # ---- routing ---------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        segs = [s for s in request.path.split("/") if s]
        if not segs:
            return _json({"paths": sorted({"/api", "/api/v1", "/apis", "/version", "/healthz", "/openapi/v2",
                                           "/openapi/v3"} | {f"/apis/{g}" for g in self.registry.groups()})})
        head = segs[0]
        if head in ("healthz", "livez", "readyz"):
            return web.Response(text="ok")
        if head == "version":
            return _json(SERVER_VERSION)
        if head == "openapi":
            return openapi.handle(self.registry, request, segs[1:])
        accept = request.headers.get("Accept", "")
        if head == "api":
            if len(segs) == 1:
                if discovery.wants_aggregated(accept):
                    return _json(discovery.aggregated(self.registry, core=True),
                                 headers={"Content-Type": discovery.AGGREGATED_CT}, content_type="")
                return _json({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}]})
            if segs[1] != "v1":
                raise APIError(404, "the server could not find the requested resource", reason="NotFound")
            if len(segs) == 2:
                return _json(discovery.resource_list(self.registry, "", "v1"))
            return await self._resource(request, "", "v1", segs[2:])
        if head == "apis":
            groups = self.registry.groups()
            if len(segs) == 1:
                if discovery.wants_aggregated(accept):
                    return _json(discovery.aggregated(self.registry, core=False),
                                 headers={"Content-Type": discovery.AGGREGATED_CT}, content_type="")
                return _json(discovery.group_list(self.registry))
            group = segs[1]
            if group not in groups:
                raise APIError(404, "the server could not find the requested resource", reason="NotFound")
            if len(segs) == 2:
                return _json(dict(discovery.group_entry(group, groups[group]), kind="APIGroup", apiVersion="v1"))
            version = segs[2]
            if version not in groups[group]:
                raise APIError(404, "the server could not find the requested resource", reason="NotFound")
            if len(segs) == 3:
                return _json(discovery.resource_list(self.registry, group, version))
            return await self._resource(request, group, version, segs[3:])
        raise APIError(404, "the server could not find the requested resource", reason="NotFound")

    def _parse_resource_path(self, group: str, version: str, rest: list[str]) -> tuple[ResourceType, str | None,
                                                                                        str | None, str | None]:
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            candidate = self.registry.lookup(group, version, rest[2])
            if candidate is not None and candidate.namespaced:
                ns = rest[1]
                rest = rest[2:]
        plural = rest[0]
        rt = self.registry.lookup(group, version, plural)
        if rt is None or len(rest) > 3:
            raise APIError(404, "the server could not find the requested resource", reason="NotFound")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if sub is not None and sub not in rt.subresources:
            raise APIError(404, "the server could not find the requested resource", reason="NotFound")
        if ns is None and rt.namespaced and name is not None:
            raise APIError(404, "the server could not find the requested resource", reason="NotFound")
        return rt, ns, name, sub

    async def _body(self, request: web.Request) -> Any:
        data = await request.read()
        ctype = request.headers.get("Content-Type", _JSON_CT).split(";")[0].strip()
        if ctype == "application/vnd.kubernetes.protobuf":
            return protobuf.decode_body(data)
        if "protobuf" in ctype or "cbor" in ctype:
            raise APIError(415, "the body of the request was in an unknown format - accepted media types "
                           "include: application/json, application/yaml", reason="UnsupportedMediaType")
        if ctype in ("application/yaml", "application/apply-patch+yaml"):
            import yaml

            try:
                return yaml.safe_load(data)
            except yaml.YAMLError as exc:
                raise bad_request(f"error decoding YAML request body: {exc}") from exc
        try:
            return json.loads(data) if data else None
        except ValueError as exc:
            raise bad_request(f"error decoding request body: {exc}") from exc

    @staticmethod
    def _ctx(request: web.Request, *, apply: bool = False) -> Ctx:
        q = request.query
        fv = q.get("fieldValidation", "Warn")
        if fv not in ("Strict", "Warn", "Ignore"):
            raise bad_request(f'fieldValidation must be one of "Strict", "Warn", "Ignore": got {fv!r}')
        manager = q.get("fieldManager") or None
        if manager is not None and len(manager) > 128:
            raise invalid("PatchOptions" if request.method == "PATCH" else "UpdateOptions", "meta.k8s.io", "", [Cause(
                "fieldManager", "FieldValueTooLong", "Too long: may not be more than 128 bytes")])
        force = q.get("force")
        if force is not None and not apply:
            raise invalid("PatchOptions", "meta.k8s.io", "", [Cause(
                "force", "FieldValueForbidden", "Forbidden: may not be specified for non-apply patch")])
        if manager is None and not apply:
            manager = fieldmanager.manager_from_user_agent(request.headers.get("User-Agent", "")) or None
        return Ctx(dry_run="All" in q.getall("dryRun", []), field_validation=fv, manager=manager,
                   force=force in ("true", "True", "1"))

    def _respond(self, request: web.Request, rt: ResourceType, version: str, entry: Entry, ctx: Ctx,
                 status: int = 200) -> web.Response:
        headers = warning_headers(ctx.warnings)
        if table.wants_table(request):
            return _json(table.render(self.engine, rt, [entry], self.store.rv, request), status, headers)
        return _raw(self.engine.from_storage(rt, entry, version), status, headers)

    async def _resource(self, request: web.Request, group: str, version: str, rest: list[str]) -> web.StreamResponse:
        rt, ns, name, sub = self._parse_resource_path(group, version, rest)
        method = request.method
        eng = self.engine
        if name is None:
            if method == "GET":
                if request.query.get("watch") in ("1", "true", "True"):
                    return await self._watch(request, rt, version, ns)
                return self._list(request, rt, version, ns)
            if method == "POST":
                if rt.namespaced and ns is None:
                    raise APIError(404, "the server could not find the requested resource", reason="NotFound")
                if rt.group == "authorization.k8s.io":
                    return _json(self._review(rt, await self._body(request)), 201)
                ctx = self._ctx(request)
                entry = await eng.create(rt, ns or "", await self._body(request), ctx, version)
                return self._respond(request, rt, version, entry, ctx, 201)
            if method == "DELETE":
                return await self._delete_collection(request, rt, version, ns)
            raise APIError(405, "the server does not allow this method on the requested resource",
                           reason="MethodNotAllowed")
        ns_ = ns or ""
        if sub == "log":
            if method != "GET":
                raise APIError(405, "the server does not allow this method on the requested resource",
                               reason="MethodNotAllowed")
            return await self._log(request, rt, ns_, name)
        if sub == "scale":
            if method != "GET":  # reading is what the disruption controller needs; writes are not served
                raise APIError(405, "the server does not allow this method on the requested resource",
                               reason="MethodNotAllowed")
            return _json(scale_of(rt, eng.get(rt, ns_, name).obj))
        if sub in ("binding", "eviction"):
            if method != "POST":
                raise APIError(405, "the server does not allow this method on the requested resource",
                               reason="MethodNotAllowed")
            ctx = self._ctx(request)
            body = await self._body(request)
            if sub == "binding":
                await eng.bind(ns_, name, body, ctx)
            else:
                await evict(eng, ns_, name, body, ctx)
            return _json(status_object(201, "", "", success=True), 201)
        if method == "GET":
            entry = eng.get(rt, ns_, name)
            return self._respond(request, rt, version, entry, Ctx())
        if method == "PUT":
            ctx = self._ctx(request)
            entry = await eng.update(rt, ns_, name, await self._body(request), ctx, sub, version)
            return self._respond(request, rt, version, entry, ctx)
        if method == "PATCH":
            ctype = request.headers.get("Content-Type", "")
            if ctype.startswith("application/apply-patch"):
                ctx = self._ctx(request, apply=True)
                entry, created = await self._apply(request, rt, version, ns_, name, sub, ctx)
                return self._respond(request, rt, version, entry, ctx, 201 if created else 200)
            ctx = self._ctx(request)
            entry = await eng.patch(rt, ns_, name, ctype, await request.read(), ctx, sub, version)
            return self._respond(request, rt, version, entry, ctx)
        if method == "DELETE" and sub is None:
            ctx = self._ctx(request)
            opts = await self._delete_options(request)
            entry = await eng.delete(rt, ns_, name, opts, ctx)
            if not rt.return_deleted_object and not ctx.dry_run and self.store.get(rt.key, ns_ or "", name) is None:
                # gone at once: these kinds answer with a Status, as their upstream stores do
                details = {"name": name, "kind": rt.plural, "uid": entry.obj["metadata"].get("uid", "")}
                if rt.group:
                    details["group"] = rt.group
                gone = status_object(200, "", "", details, success=True)
                del gone["code"]
                return _json(gone, 200, warning_headers(ctx.warnings))
            return self._respond(request, rt, version, entry, ctx)
        raise APIError(405, "the server does not allow this method on the requested resource",
                       reason="MethodNotAllowed")

    @staticmethod
    def _review(rt: ResourceType, body: Any) -> JSON:
        """Access reviews: the one token may do everything (there is no RBAC here)."""
        out: JSON = dict(body) if isinstance(body, dict) else {}
        out.update(apiVersion="authorization.k8s.io/v1", kind=rt.kind)
        out.setdefault("metadata", {})
        if rt.plural == "selfsubjectaccessreviews":
            out["status"] = {"allowed": True, "reason": "the railyard local API server has a single admin token"}
        else:
            out["status"] = {"resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                             "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}], "incomplete": False}
        return out

    async def _apply(self, request: web.Request, rt: ResourceType, version: str, ns: str, name: str,
                     sub: str | None, ctx: Ctx) -> tuple[Entry, bool]:
        """Server-side apply (fieldmanager.py): field ownership, conflicts, force."""
        body = await self._body(request)
        return await self.engine.apply(rt, ns, name, body, ctx, sub, version)

    async def _delete_options(self, request: web.Request) -> DeleteOptions:
        q = request.query
        opts = DeleteOptions()
        body = await self._body(request) if request.can_read_body else None
        if body is not None and not isinstance(body, dict):
            raise bad_request("DeleteOptions must be a JSON object")
        if isinstance(body, dict):
            opts.grace_period_seconds = body.get("gracePeriodSeconds")
            opts.propagation_policy = body.get("propagationPolicy")
            if body.get("orphanDependents") is True and not opts.propagation_policy:
                opts.propagation_policy = "Orphan"
            pre = body.get("preconditions") or {}
            opts.precondition_uid = pre.get("uid")
            opts.precondition_rv = pre.get("resourceVersion")
        if "gracePeriodSeconds" in q:
            opts.grace_period_seconds = int_param(request, "gracePeriodSeconds")
        if "propagationPolicy" in q:
            opts.propagation_policy = q["propagationPolicy"]
        if q.get("orphanDependents") == "true" and not opts.propagation_policy:
            opts.propagation_policy = "Orphan"
        return opts

    def _matchers(self, request: web.Request, rt: ResourceType) -> list[Matcher]:
        return self.engine.matchers(rt, request.query.get("labelSelector"), request.query.get("fieldSelector"))

    def _list(self, request: web.Request, rt: ResourceType, version: str, ns: str | None) -> web.Response:
        validate_list_options(request.query, watch=False)
        entries, rv = self.engine.list(rt, ns, self._matchers(request, rt))
        q = request.query
        meta: JSON = {"resourceVersion": str(rv)}
        cont = q.get("continue")
        if cont:
            try:
                start = json.loads(base64.urlsafe_b64decode(cont.encode()))
                start_key = (start["ns"], start["name"])
            except (ValueError, KeyError, TypeError) as exc:
                raise bad_request("continue key is not valid") from exc
            entries = [e for e in entries
                       if (e.obj["metadata"].get("namespace", ""), e.obj["metadata"]["name"]) > start_key]
        limit = int_param(request, "limit")
        if limit > 0 and len(entries) > limit:
            last = entries[limit - 1].obj["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(dumps(
                {"ns": last.get("namespace", ""), "name": last["name"], "rv": rv})).decode()
            meta["remainingItemCount"] = len(entries) - limit
            entries = entries[:limit]
        if table.wants_table(request):
            return _json(table.render(self.engine, rt, entries, rv, request, meta))
        head = dumps({"kind": f"{rt.kind}List", "apiVersion": rt.api_version(version), "metadata": meta})
        # one join of every piece: the items are not copied into an intermediate list body
        prefix = self._typed_prefix(rt, version)
        parts: list[bytes | memoryview] = [head[:-1], b',"items":[']
        for i, e in enumerate(entries):
            if i:
                parts.append(b",")
            parts.extend(self._list_item(rt, e, version, prefix))
        parts.append(b"]}")
        return _raw(b"".join(parts))

    @staticmethod
    def _typed_prefix(rt: ResourceType, version: str) -> bytes | None:
        """What a stored built-in object starts with and a typed list item leaves out (None for
        custom resources, whose list items keep apiVersion and kind)."""
        if rt.is_custom:
            return None
        return b'{"apiVersion":' + dumps(rt.api_version(version)) + b',"kind":' + dumps(rt.kind) + b","

    def _list_item(self, rt: ResourceType, entry: Entry, version: str,
                   prefix: bytes | None) -> tuple[bytes | memoryview, ...]:
        """An item of a list, as pieces to join: built-in kinds' lists are typed, their items
        carry no apiVersion and kind (custom resources' items do)."""
        raw = self.engine.from_storage(rt, entry, version)
        if prefix is None:
            return (raw,)
        if raw.startswith(prefix):
            return (b"{", memoryview(raw)[len(prefix):])
        obj = json.loads(raw)
        obj.pop("apiVersion", None)
        obj.pop("kind", None)
        return (dumps(obj),)

    async def _delete_collection(self, request: web.Request, rt: ResourceType, version: str,
                                 ns: str | None) -> web.Response:
        entries, _ = self.engine.list(rt, ns, self._matchers(request, rt))
        opts = await self._delete_options(request)
        ctx = self._ctx(request)
        out = []
        for e in entries:
            m = e.obj["metadata"]
            with contextlib.suppress(APIError):
                out.append(await self.engine.delete(rt, m.get("namespace", ""), m["name"], opts, ctx))
        items = b",".join(self.engine.from_storage(rt, e, version) for e in out)
        head = dumps({"kind": f"{rt.kind}List", "apiVersion": rt.api_version(version),
                      "metadata": {"resourceVersion": str(self.store.rv)}})
        return _raw(head[:-1] + b',"items":[' + items + b"]}")

    # ---- watch -----------------------------------------------------------------------------

    async def _watch(self, request: web.Request, rt: ResourceType, version: str, ns: str | None) -> web.StreamResponse:
        q = request.query
        validate_list_options(q, watch=True)
        matchers = self._matchers(request, rt)
        bookmarks = q.get("allowWatchBookmarks") in ("1", "true", "True")
        send_initial = q.get("sendInitialEvents") in ("1", "true", "True")
        timeout = float(int_param(request, "timeoutSeconds")) or DEFAULT_WATCH_TIMEOUT_S
        want_table = table.wants_table(request)
        rv_param = q.get("resourceVersion", "")
        scope = ns if rt.namespaced else None
        initial: list[Entry] = []
        if rv_param in ("", "0") or send_initial:
            initial, start = self.engine.list(rt, scope, matchers)
            watcher = self.store.subscribe(rt.key, scope, None)
        else:
            try:
                start = int(rv_param)
            except ValueError as exc:
                raise bad_request(f"invalid resource version {rv_param!r}") from exc
            try:
                watcher = self.store.subscribe(rt.key, scope, start)
            except LookupError:
                watcher = None
        resp = web.StreamResponse(headers={"Content-Type": _JSON_CT, "Cache-Control": "no-cache, private"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if watcher is None:
            st = status_object(410, f"too old resource version: {rv_param} ({self.store.oldest_rv() + 1})",
                               "Expired")
            await resp.write(dumps({"type": "ERROR", "object": st}) + b"\n")
            return resp
        last_rv = start

        def render(etype: str, entry: Entry) -> bytes:
            if want_table:
                obj = table.render(self.engine, rt, [entry], int(entry.obj["metadata"]["resourceVersion"]), request)
                return dumps({"type": etype, "object": obj}) + b"\n"
            return b'{"type":"' + etype.encode() + b'","object":' + self.engine.from_storage(rt, entry, version) \
                + b"}\n"

        def bookmark(rv: int, extra: JSON | None = None) -> bytes:
            meta: JSON = {"resourceVersion": str(rv)}
            if extra:
                meta["annotations"] = extra
            return dumps({"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version(version),
                                                          "metadata": meta}}) + b"\n"

        try:
            if initial:
                await resp.write(b"".join(render("ADDED", e) for e in initial))
            if send_initial and bookmarks:
                await resp.write(bookmark(start, {"k8s.io/initial-events-end": "true"}))
            deadline = time.monotonic() + timeout
            next_bookmark = time.monotonic() + BOOKMARK_INTERVAL_S
            while not self._stopping.is_set():
                now = time.monotonic()
                if now >= deadline:
                    break
                # wake at least every few seconds to notice clients that went away
                wait = min(deadline, next_bookmark, now + DISCONNECT_CHECK_S) - now
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, wait)):
                        await watcher.wake.wait()
                watcher.wake.clear()
                if watcher.overflowed or request.transport is None or request.transport.is_closing():
                    break
                chunks: list[bytes] = []
                while watcher.queue:
                    ev = watcher.queue.popleft()
                    if ev.rv <= last_rv:
                        continue
                    last_rv = ev.rv
                    line = self._filter_event(ev, matchers, render, rt, want_table)
                    if line is not None:
                        chunks.append(line)
                if chunks:
                    await resp.write(b"".join(chunks))
                if bookmarks and time.monotonic() >= next_bookmark:
                    await resp.write(bookmark(max(last_rv, self.store.committed_rv)))
                    next_bookmark = time.monotonic() + BOOKMARK_INTERVAL_S
            if bookmarks and not self._stopping.is_set():
                await resp.write(bookmark(max(last_rv, self.store.committed_rv)))
        except (ConnectionResetError, RuntimeError):
            pass
        finally:
            self.store.unsubscribe(watcher)
        return resp

    def _filter_event(self, ev: Event, matchers: list[Matcher], render: Callable[[str, Entry], bytes],
                      rt: ResourceType, want_table: bool) -> bytes | None:
        plain = not want_table and rt.storage_key is None and not rt.is_custom
        if not matchers:
            return ev.line() if plain else render(ev.type, ev.entry)
        new_ok = all(m(ev.entry.obj) for m in matchers)
        if ev.type == "ADDED":
            return (ev.line() if plain else render("ADDED", ev.entry)) if new_ok else None
        old_ok = ev.prev is not None and all(m(ev.prev) for m in matchers)
        if ev.type == "DELETED":
            return (ev.line() if plain else render("DELETED", ev.entry)) if (new_ok or old_ok) else None
        if new_ok and old_ok:
            return ev.line() if plain else render("MODIFIED", ev.entry)
        if new_ok:
            return render("ADDED", ev.entry)
        if old_ok:
            return render("DELETED", ev.entry)
        return None

    # ---- logs ------------------------------------------------------------------------------

    async def _log(self, request: web.Request, rt: ResourceType, ns: str, name: str) -> web.StreamResponse:
        pod = self.engine.get(rt, ns, name).obj
        q = request.query
        containers = [c["name"] for c in pod["spec"].get("containers") or []]
        container = q.get("container")
        if not container:
            if len(containers) != 1:
                raise bad_request(f"a container name must be specified for pod {name}, choose one of: "
                                  f"[{' '.join(containers)}]")
            container = containers[0]
        elif container not in containers + [c["name"] for c in pod["spec"].get("initContainers") or []]:
            raise bad_request(f"container {container} is not valid for pod {name}")
        try:
            opts = parse_log_options(q)
        except LogOptionError as exc:
            raise bad_request(str(exc)) from None
        path = self.log_provider(pod, container, opts.previous)
        if path is None or not path.exists():
            if opts.previous:
                raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
            if not opts.follow:
                return web.Response(body=b"", content_type="text/plain")

        def done() -> bool:
            cur = self.store.get("pods", ns, name)
            if cur is None or cur.obj["metadata"].get("uid") != pod["metadata"].get("uid"):
                return True
            statuses = (cur.obj.get("status") or {}).get("containerStatuses") or []
            return any(s.get("name") == container and "terminated" in (s.get("state") or {}) for s in statuses)

        return await podlogs.respond(request, path, opts, current=lambda: self.log_provider(pod, container, False),
                                     done=done, stopping=self._stopping)


async def serve(state_dir: Path | str, *, token: str, host: str = "127.0.0.1", port: int = 0,
                ready_file: Path | str | None = None, stop: asyncio.Event | None = None,
                log_provider: LogProvider | None = None, tls: bool = True, event_window: int = 20_000,
                workload_api: bool = True, node_lifecycle: NodeLifecycleSettings | None = DEFAULT_SETTINGS) -> None:
    """Run the server until ``stop`` is set.

    Once serving, writes ``{"url", "pid", "ca"}`` to ``ready_file`` (``ca``: the CA certificate
    path to trust, null without TLS).
    """
    import os

    server = APIServer(state_dir, token=token, host=host, port=port, log_provider=log_provider, tls=tls,
                       event_window=event_window, workload_api=workload_api, node_lifecycle=node_lifecycle)
    url = await server.start()
    if ready_file is not None:
        rf = Path(ready_file)
        tmp = rf.with_suffix(rf.suffix + ".tmp")
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid(),
                                   "ca": str(server.ca_file) if server.ca_file else None}))
        tmp.replace(rf)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await server.stop()
