"""Replay the recorded kube-apiserver exchanges (kube-v1.36/, kube-v1.36-workload/,
kube-v1.36-dra/, kube-v1.36-disruption/: copies of ../shared/kube-golden) against a server and
compare.

The corpus and its rules are in kube-v1.36/README.md: files run in order, bodies are normalised
(timestamps, uids, resourceVersions, UUIDs), and the comparison covers the status code always,
the whole Status body for errors, the whole object for successful writes and reads, and the
event types (and objects) of watches. ``allowlist.txt`` names what is kept different on purpose.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from tests.waiting import wait_until

CORPUS = Path(__file__).parent / "kube-v1.36"
ALLOWLIST = Path(__file__).parent / "allowlist.txt"
WORKLOAD_CORPUS = Path(__file__).parent / "kube-v1.36-workload"
WORKLOAD_ALLOWLIST = Path(__file__).parent / "allowlist-workload.txt"
WORKLOAD_NAMESPACE = "golden-gang"
#: Upper bound on each wait for the server (it only catches a hang).
WAIT_S = 30.0
#: How long a watch that sent the recorded events is read for one more (Client.watch).
WATCH_QUIET_S = 1.0

# The corpus was recorded with python-requests; the default field manager is the User-Agent's
# first word, so the replay sends the same one.
USER_AGENT = "python-requests/2.32.3"

_NORMALISED_KEYS = frozenset({
    "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "time", "lastTransitionTime",
    "renewTime", "acquireTime", "eventTime", "firstTimestamp", "lastTimestamp", "startTime", "continue",
})
_RFC3339 = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})"
_WHOLE_TIME = re.compile(rf"^{_RFC3339}$")
_ANY_TIME = re.compile(_RFC3339)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SA_VOLUME = re.compile(r"^kube-api-access-[a-z0-9]{5}$")


def normalise(value: Any, key: str | None = None) -> Any:
    """The corpus README's normalisation, plus the service-account volume's random suffix and
    UUIDs inside map keys (managedFields' ``k:{"uid":...}``, as kueue-v0.13-workload/ records them)."""
    if isinstance(value, dict):
        return {_UUID.sub("<uuid>", k): normalise(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if isinstance(value, str):
        if key in _NORMALISED_KEYS:
            return f"<{key}>"
        if _WHOLE_TIME.match(value):
            return "<timestamp>"
        if _SA_VOLUME.match(value):
            return "kube-api-access-<random>"
        return _ANY_TIME.sub("<timestamp>", _UUID.sub("<uuid>", value))
    return value


@dataclass
class Exchange:
    name: str
    note: str
    request: dict[str, Any]
    expected: dict[str, Any]
    got: dict[str, Any] | None = None
    error: str | None = None

    @property
    def number(self) -> str:
        return self.name.split("-", 1)[0]


@dataclass
class AllowEntry:
    case: str
    path: str
    reason: str


def load_allowlist(path: Path = ALLOWLIST) -> list[AllowEntry]:
    """``<case number or *> <path> <reason...>`` per line; ``#`` starts a comment."""
    out: list[AllowEntry] = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        case, where, reason = line.split(None, 2)
        out.append(AllowEntry(case, where, reason))
    return out


def allowlist_problems(entries: list[AllowEntry], cases: list[Exchange]) -> list[str]:
    """What is wrong with an allow-list: too long, or an entry that names no case or gives no reason."""
    numbers = {c.number for c in cases}
    out = [] if len(entries) <= 12 else [f"{len(entries)} entries: keep the allow-list short, fix the server rather than allow"]
    out += [f"names no case: {e}" for e in entries if e.case not in numbers and e.case != "*"]
    out += [f"say why: {e}" for e in entries if len(e.reason.split()) < 4]
    return out


def load_corpus(corpus: Path = CORPUS) -> list[Exchange]:
    out = []
    for f in sorted(corpus.glob("[0-9][0-9][0-9]-*.json")):
        d = json.loads(f.read_text())
        out.append(Exchange(f.stem, d.get("note", ""), d["request"], d["response"]))
    return out


class Client:
    """Plain HTTP(S) requests with a bearer token, as the recorder sent them."""

    def __init__(self, url: str, token: str, ca_file: Path | None) -> None:
        self.url = url
        self.token = token
        kw: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED", "ca_certs": str(ca_file)} if ca_file else {}
        self.http = urllib3.PoolManager(**kw)
        self.ca_file = ca_file

    def send(self, method: str, path: str, query: dict[str, str] | None = None, body: Any = None,
             content_type: str | None = None, accept: str | None = None) -> tuple[int, dict[str, str], bytes]:
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Authorization": f"Bearer {self.token}", "User-Agent": USER_AGENT,
                   "Accept": accept or "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        resp = self.http.request(method, url, body=data, headers=headers, timeout=30.0, retries=False)
        return resp.status, dict(resp.headers), resp.data

    def watch(self, path: str, query: dict[str, str], events: int) -> tuple[int, dict[str, str], bytes]:
        """A watch read until the server ends it (its ``timeoutSeconds``) or, once it sent the
        ``events`` the record has, until WATCH_QUIET_S pass without another: the record's watch
        (014: 3 events, then 12 quiet seconds to its timeout) need not be waited out, and an extra
        event the record lacks, sent at once as the recorded ones were, still shows."""
        u = urllib.parse.urlsplit(self.url)
        conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(u.hostname or "", u.port, timeout=30.0,
                                        context=ssl.create_default_context(cafile=str(self.ca_file)))
            if u.scheme == "https" else http.client.HTTPConnection(u.hostname or "", u.port, timeout=30.0))
        try:
            conn.request("GET", f"{path}?{urllib.parse.urlencode(query)}",
                         headers={"Authorization": f"Bearer {self.token}", "User-Agent": USER_AGENT, "Accept": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                return resp.status, dict(resp.getheaders()), resp.read()
            lines: list[bytes] = []
            try:
                while True:
                    if len(lines) >= events and conn.sock is not None:
                        conn.sock.settimeout(WATCH_QUIET_S)
                    line = resp.readline()
                    if not line:
                        break
                    if line.strip():
                        lines.append(line)
            except TimeoutError:
                pass
            return resp.status, dict(resp.getheaders()), b"".join(lines)
        finally:
            conn.close()

    def json(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, _, data = self.send(method, path, body=body, **kw)
        return status, json.loads(data) if data else None


def _setup_gadget_crd(c: Client) -> None:
    """Case 013's precondition (README): the Gadget CRD, freshly created and served."""
    crd = json.loads((CORPUS / "setup-gadget-crd.json").read_text())
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    name = crd["metadata"]["name"]
    c.send("DELETE", f"{path}/{name}")
    wait_until(lambda: c.json("GET", f"{path}/{name}")[0] == 404, timeout=WAIT_S, interval=0.05, message="the old Gadget CRD to go")
    status, body = c.json("POST", path, crd)
    if status != 201:
        raise RuntimeError(f"could not create the Gadget CRD: {status} {body}")
    wait_until(lambda: c.json("GET", "/apis/golden.example.com/v1/namespaces/golden/gadgets")[0] == 200,
               timeout=WAIT_S, interval=0.05, message="the Gadget resource to be served")


def _scheduler_marks_p1_unschedulable(c: Client) -> None:
    """Between 040 and 042 the recorded cluster's kube-scheduler (field manager ``ksched``) found
    no node for p1 (its 520 fake nodes are tainted) and wrote the PodScheduled condition. That
    write is not an exchange of the corpus but its effect is in every later answer about p1, so
    the replay plays it: the condition as 042 shows it, patched to the status subresource."""
    status, body = c.json("GET", "/api/v1/namespaces/golden/pods/p1")
    if status != 200:
        raise RuntimeError(f"p1 missing before the scheduler's write: {status} {body}")
    patch = {"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "observedGeneration": 3,
        "message": "0/520 nodes are available: 520 node(s) had untolerated taint(s). no new claims to "
                   "deallocate, preemption: 0/520 nodes are available: 520 Preemption is not helpful "
                   "for scheduling."}]}}
    status, body = c.json("PATCH", "/api/v1/namespaces/golden/pods/p1/status", patch,
                          content_type="application/strategic-merge-patch+json",
                          query={"fieldManager": "ksched"})
    if status != 200:
        raise RuntimeError(f"the scheduler's status write failed: {status} {body}")


#: What the recorded cluster did between exchanges that the replay must do too.
BEFORE: dict[str, Callable[[Client], None]] = {"013": _setup_gadget_crd, "042": _scheduler_marks_p1_unschedulable}


# ---- kube-v1.36-workload: what its scheduler and its fake kubelet did between exchanges ----------

#: The recorder's fake kubelet (the kubernetes Python client, field manager OpenAPI-Generator)
#: marked these pods Running on their nodes before the exchange named; the replay plays the same
#: writes, verbatim. (It had not got to job-a-2 by 020, nor to qos-1 by 035.)
_KUBELET_WRITES = {"020": {"job-a-0": "127.1.0.5", "job-a-1": "127.1.0.6"}, "037": {"qos-0": "127.1.0.1"}}


def _pod(c: Client, name: str) -> dict[str, Any]:
    status, body = c.json("GET", f"/api/v1/namespaces/{WORKLOAD_NAMESPACE}/pods/{name}")
    return body if status == 200 and isinstance(body, dict) else {}


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((x for x in (obj.get("status") or {}).get("conditions") or [] if x.get("type") == kind), None)


def _kubelet_runs(number: str, bound: tuple[str, ...]) -> Callable[[Client], None]:
    def hook(c: Client) -> None:
        for name in bound:
            wait_until(lambda n=name: _pod(c, n).get("spec", {}).get("nodeName"), timeout=WAIT_S, interval=0.05,
                       message=f"the scheduler to bind {name}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for name, ip in _KUBELET_WRITES[number].items():
            patch = {"status": {
                "conditions": [{"type": "Ready", "status": "True"}], "phase": "Running", "podIP": ip,
                "podIPs": [{"ip": ip}], "startTime": now,
                "containerStatuses": [{"name": "c", "image": "x", "imageID": "", "ready": True, "restartCount": 0,
                                       "started": True, "lastState": {}, "state": {"running": {"startedAt": now}}}]}}
            status, body = c.json("PATCH", f"/api/v1/namespaces/{WORKLOAD_NAMESPACE}/pods/{name}/status", patch,
                                  content_type="application/strategic-merge-patch+json",
                                  query={"fieldManager": "OpenAPI-Generator"})
            if status != 200:
                raise RuntimeError(f"the fake kubelet's write to {name} failed: {status} {body}")
    return hook


def _podgroup_condition(name: str) -> Callable[[Client], None]:
    def hook(c: Client) -> None:
        path = f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{WORKLOAD_NAMESPACE}/podgroups/{name}"
        wait_until(lambda: _condition(c.json("GET", path)[1] or {}, "PodGroupScheduled"), timeout=WAIT_S, interval=0.05,
                   message=f"the scheduler's PodGroupScheduled condition on {name}")
    return hook


def _gang_pod_waits(c: Client) -> None:
    """The recorded scheduler saw job-b-0 alone (waiting for minCount) before 024 made it two."""
    wait_until(lambda: _condition(_pod(c, "job-b-0"), "PodScheduled"), timeout=WAIT_S, interval=0.05,
               message="the scheduler to see job-b-0 wait")


def _gang_events(c: Client) -> None:
    def notes() -> bool:
        _, body = c.json("GET", f"/api/v1/namespaces/{WORKLOAD_NAMESPACE}/events",
                         query={"fieldSelector": "involvedObject.name=job-b-0"})
        return len({e.get("message") for e in (body or {}).get("items") or []}) >= 2
    wait_until(notes, timeout=WAIT_S, interval=0.05, message="the scheduler's FailedScheduling events for job-b-0")


#: What the recorded cluster (its kube-scheduler, its fake kubelet) did before these exchanges.
WORKLOAD_BEFORE: dict[str, Callable[[Client], None]] = {
    "020": _kubelet_runs("020", ("job-a-0", "job-a-1", "job-a-2")),
    "021": _podgroup_condition("job-a-a0"),
    "024": _gang_pod_waits,
    "027": _podgroup_condition("job-b-a0"),
    "029": _gang_events,
    "037": _kubelet_runs("037", ("qos-0",)),
}


def _decode(status: int, headers: dict[str, str], data: bytes, watch: bool) -> dict[str, Any]:
    if watch and status == 200:
        events = [json.loads(line) for line in data.splitlines() if line.strip()]
        body: Any = {"watchEvents": events}
    else:
        try:
            body = json.loads(data) if data else None
        except ValueError:
            body = data.decode(errors="replace")
    keep = {k: v for k, v in headers.items() if k.lower() in ("content-type", "warning")}
    return {"status": status, "headers": keep, "body": body}


def replay(c: Client, exchanges: list[Exchange], *, namespace: str = "golden",
           before: dict[str, Callable[[Client], None]] | None = None,
           resolve: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
    """Send every exchange in order; fill in ``got`` (or ``error``). ``before``: what the
    recorded cluster did before an exchange (by its number), played first (default: BEFORE).
    ``resolve``: the request as this replay must send it, where the record names something only
    the replay knows (a generated name, a uid, a resourceVersion) by a placeholder."""
    hooks = BEFORE if before is None else before
    status, body = c.json("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
    if status != 201:
        raise RuntimeError(f"could not create namespace {namespace}: {status} {body}")
    wait_until(lambda: c.json("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] == 200,
               timeout=WAIT_S, interval=0.05, message=f"the {namespace} namespace's default ServiceAccount")
    for ex in exchanges:
        try:
            if ex.number in hooks:
                hooks[ex.number](c)
            r = resolve(ex.request) if resolve is not None else ex.request
            recorded = (ex.expected.get("body") or {}) if ex.expected.get("status") == 200 else {}
            if r.get("watch") and r["method"] == "GET" and r.get("query") and not r.get("accept") \
                    and isinstance(recorded, dict) and "watchEvents" in recorded:
                st, headers, data = c.watch(r["path"], r["query"], len(recorded["watchEvents"]))
            else:
                st, headers, data = c.send(r["method"], r["path"], query=r.get("query") or None, body=r.get("body"),
                                           content_type=r.get("contentType"), accept=r.get("accept"))
            ex.got = _decode(st, headers, data, bool(r.get("watch")))
        except Exception as exc:  # recorded per case: one failure must not hide the others
            ex.error = f"{type(exc).__name__}: {exc}"


# ---- comparison ---------------------------------------------------------------------------------


def _generated_name(ex: Exchange, body: Any) -> Any:
    """generateName's random suffix (034) compares as ``<random>``."""
    prefix = ((ex.request.get("body") or {}).get("metadata") or {}).get("generateName") \
        if isinstance(ex.request.get("body"), dict) else None
    if prefix and isinstance(body, dict) and isinstance(body.get("metadata"), dict):
        name = body["metadata"].get("name", "")
        if isinstance(name, str) and name.startswith(prefix):
            body["metadata"]["name"] = prefix + "<random>"
    return body


def _table_ages(body: Any) -> Any:
    """Age cells of a Table depend on the wall clock between create and list."""
    if isinstance(body, dict) and body.get("kind") == "Table":
        cols = [c.get("name") for c in body.get("columnDefinitions") or []]
        for row in body.get("rows") or []:
            for i, name in enumerate(cols):
                if name == "Age" and i < len(row.get("cells") or []):
                    row["cells"][i] = "<age>"
    return body


def comparable(ex: Exchange, response: dict[str, Any]) -> dict[str, Any]:
    body = _sorted_managed_fields(normalise(response["body"]))
    body = _table_ages(_generated_name(ex, body))
    headers = {k.lower(): (v.split(";")[0].strip() if k.lower() == "content-type" and "as=" not in v else v)
               for k, v in response.get("headers", {}).items()}
    return {"status": response["status"], "headers": headers, "body": body}


def _drop(doc: Any, path: list[str]) -> Any:
    """Remove ``path`` (keys, ``*`` for every list item or map value) from ``doc``; returns doc."""
    if not path:
        return doc
    head, rest = path[0], path[1:]
    if isinstance(doc, list):
        items = range(len(doc)) if head == "*" else [int(head)] if head.isdigit() and int(head) < len(doc) else []
        if not rest:
            for i in sorted(items, reverse=True):
                doc.pop(i)
        else:
            for i in items:
                _drop(doc[i], rest)
    elif isinstance(doc, dict):
        keys = list(doc) if head == "*" else [head] if head in doc else []
        for k in keys:
            if rest:
                _drop(doc[k], rest)
            else:
                del doc[k]
    return doc


def _first_line(doc: Any, path: list[str]) -> None:
    """Keep only the first line of the string at ``path``."""
    for p in path[:-1]:
        if isinstance(doc, list) and p.isdigit() and int(p) < len(doc):
            doc = doc[int(p)]
        elif isinstance(doc, dict) and p in doc:
            doc = doc[p]
        else:
            return
    last = path[-1]
    if isinstance(doc, list) and last.isdigit() and int(last) < len(doc) and isinstance(doc[int(last)], str):
        doc[int(last)] = doc[int(last)].split("\n", 1)[0]
    elif isinstance(doc, dict) and isinstance(doc.get(last), str):
        doc[last] = doc[last].split("\n", 1)[0]


def _sorted_managed_fields(value: Any) -> Any:
    """managedFields are ordered by operation, then time (seconds), then manager: with times
    normalised away, compare them in (operation, manager, subresource) order."""
    if isinstance(value, dict):
        out = {k: _sorted_managed_fields(v) for k, v in value.items()}
        mf = out.get("managedFields")
        if isinstance(mf, list) and all(isinstance(e, dict) for e in mf):
            out["managedFields"] = sorted(mf, key=lambda e: (str(e.get("operation")), str(e.get("manager")),
                                                             str(e.get("subresource", ""))))
        return out
    if isinstance(value, list):
        return [_sorted_managed_fields(v) for v in value]
    return value


def _subset_discovery(want: Any, got: Any) -> tuple[Any, Any]:
    """Aggregated discovery: keep in the record only the resources (and subresources) the
    replayed server serves; each of those must then be described exactly as the record does."""
    if not (isinstance(want, dict) and isinstance(got, dict)):
        return want, got
    served: dict[tuple[str, str, str], set[str]] = {
        (g["metadata"]["name"], v["version"], r["resource"]): {s["subresource"] for s in r.get("subresources") or []}
        for g in got.get("items") or [] for v in g.get("versions") or [] for r in v.get("resources") or []}
    items = []
    for g in want.get("items") or []:
        versions = []
        for v in g.get("versions") or []:
            res = []
            for r in v.get("resources") or []:
                subs = served.get((g["metadata"]["name"], v["version"], r["resource"]))
                if subs is None:
                    continue
                r = dict(r)
                kept = [s for s in r.pop("subresources", []) if s["subresource"] in subs]
                if kept:
                    r["subresources"] = kept
                res.append(r)
            if res:
                versions.append({**v, "resources": res})
        if versions:
            items.append({**g, "versions": versions})
    return {**want, "items": items}, got


def _distinct_notes(body: Any) -> Any:
    """An event list as the set of different things it says (who, about what, which reason,
    action, type and message): how many times each was said, and in how many Event objects
    (series), depends on the scheduler's retry timing."""
    if not isinstance(body, dict):
        return body
    notes = {json.dumps([e.get("reportingComponent"), (e.get("involvedObject") or {}).get("name"), e.get("reason"),
                         e.get("action"), e.get("type"), e.get("message")]) for e in body.get("items") or []}
    return {**body, "items": sorted(notes)}


def differences(ex: Exchange, allow: list[AllowEntry]) -> list[str]:
    """What differs between the record and the replay, after normalisation and the allow-list."""
    if ex.error is not None:
        return [f"replay failed: {ex.error}"]
    assert ex.got is not None
    want, got = comparable(ex, ex.expected), comparable(ex, ex.got)
    if want["status"] != got["status"]:
        return [f"status {got['status']} != recorded {want['status']}; body: {json.dumps(got['body'])[:2000]}"]
    for entry in allow:
        if entry.case not in (ex.number, "*"):
            continue
        if entry.path == "body.items:served-subset":
            want["body"], got["body"] = _subset_discovery(want["body"], got["body"])
            continue
        if entry.path == "body.items:distinct-notes":
            want["body"], got["body"] = _distinct_notes(want["body"]), _distinct_notes(got["body"])
            continue
        if entry.path.endswith("~first-line"):
            parts = entry.path.removesuffix("~first-line").split(".")
            _first_line(want, parts)
            _first_line(got, parts)
            continue
        parts = entry.path.split(".")
        _drop(want, parts)
        _drop(got, parts)
    out = []
    if want["headers"] != got["headers"]:
        out.append(f"headers {got['headers']} != recorded {want['headers']}")
    if want["body"] != got["body"]:
        out.extend(_diff(want["body"], got["body"], "body"))
    return out


def _diff(want: Any, got: Any, path: str) -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got)):
            if k not in got:
                out.append(f"{path}.{k}: missing (recorded {json.dumps(want[k])[:300]})")
            elif k not in want:
                out.append(f"{path}.{k}: unexpected {json.dumps(got[k])[:300]}")
            else:
                out.extend(_diff(want[k], got[k], f"{path}.{k}"))
        return out
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        out = []
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            out.extend(_diff(w, g, f"{path}[{i}]"))
        return out
    if want != got:
        return [f"{path}: {json.dumps(got)[:600]} != recorded {json.dumps(want)[:600]}"]
    return []


def rename(exchanges: list[Exchange], names: dict[str, str]) -> None:
    """Write each generated name of the replay (``names``: real -> as the record reads it, e.g.
    ``dra-pod-1-gpus-<random>``) into the answers, as the recorder did to its own."""
    for ex in exchanges:
        if ex.got is None or not names:
            continue
        text = json.dumps(ex.got)
        for real, recorded in names.items():
            text = text.replace(real, recorded)
        ex.got = json.loads(text)


@dataclass
class Replay:
    exchanges: list[Exchange]
    allow: list[AllowEntry] = field(default_factory=list)

    def by_name(self, name: str) -> Exchange:
        return next(e for e in self.exchanges if e.name == name)
