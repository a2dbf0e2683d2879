"""The embedded API server answers every exchange of a real Kueue v0.13.1 with an operator that
creates its own Workloads (kueue-v0.13-workload/README.md) the way the real kube-apiserver did:
Kueue's six kinds served from their vendored CRDs (defaults, CEL, list-map keys, printer columns),
the owner's TrainingJobs and pods, the owner's server-side applies and merge patches on a
Workload's ``/status`` beside Kueue's own, the Events list by involved object, the garbage
collection of a deleted owner's Workload (background and foreground), and the Tables of
``kubectl get workloads``.

What Kueue decided between exchanges is not the server's to decide: the replay plays Kueue's
writes (``Kueue``) from the record's own answers, with Kueue's field managers and operations, so
the server's part of each answer (storage, merge, managed fields, resource versions, Tables) is
what is compared. What only Kueue's webhooks do inside a request cannot be played that way; each
such difference is named in ``KUEUE_WEBHOOKS`` with its reason. Kept differences of the server:
``allowlist-kueue.txt``.
"""

from __future__ import annotations

import copy
import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.operator.fake_kueue import KUEUE_KINDS, kueue_crd
from tests.waiting import wait_until

from railyard_local.apiserver.process import start_server_process

from .replay import (
    WAIT_S,
    Client,
    Exchange,
    Replay,
    allowlist_problems,
    differences,
    load_allowlist,
    load_corpus,
    normalise,
    replay,
)

HERE = Path(__file__).parent
CORPUS = HERE / "kueue-v0.13-workload"
ALLOWLIST = HERE / "allowlist-kueue.txt"
TRAININGJOB_CRD = HERE.parents[1] / "crds" / "trainingjob.yaml"
NAMESPACE = "kq-wl"
KUEUE = "/apis/kueue.x-k8s.io/v1beta1"
WORKLOADS = f"{KUEUE}/namespaces/{NAMESPACE}/workloads"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CASES = load_corpus(CORPUS)

#: Kueue's field managers (record README): ``kueue-admission`` applies a Workload's status, ``kueue``
#: updates the queues' status, writes its Events and ungates pods.
KUEUE_MANAGERS = ("kueue-admission", "kueue")

#: Exchanges Kueue's validating webhook answers, not the API server: the request is not sent (the
#: embedded server runs no Kueue webhook and would accept it, changing the object for every later
#: answer); the test says so rather than passing.
KUEUE_WEBHOOK_REFUSALS = {
    "017": "Kueue's validating webhook (vworkload.kb.io) refuses a change of an admitted Workload's "
           "podSets with 403; the CRD's schema allows it, so a server without Kueue's webhook accepts it",
}

#: What Kueue's mutating webhooks add inside a request, which no write between exchanges can
#: play (a write would add a field manager the record does not show): left out of both sides.
KUEUE_WEBHOOKS = (
    "metadata.finalizers kueue.x-k8s.io/resource-in-use: Kueue's ResourceFlavor and ClusterQueue webhooks add it "
    "on create",
    "spec.podSets[].template.metadata {}: Kueue's Workload defaulting webhook round-trips the pod template "
    "through Go, which writes an empty metadata",
)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _must(answer: tuple[int, Any], what: str) -> Any:
    if answer[0] not in (200, 201):
        raise RuntimeError(f"{what}: {answer[0]} {json.dumps(answer[1])[:600]}")
    return answer[1]


def project(value: Any, fields: dict[str, Any]) -> Any:
    """The part of ``value`` a managed-fields set (``fieldsV1``) names: what its manager wrote."""
    if not fields:
        return copy.deepcopy(value)
    if isinstance(value, dict):
        return {k[2:]: project(value[k[2:]], sub) for k, sub in fields.items()
                if k.startswith("f:") and k[2:] in value}
    if isinstance(value, list):
        out = []
        for item in value:
            for k, sub in fields.items():
                if k.startswith("k:") and isinstance(item, dict) and \
                        all(item.get(a) == b for a, b in json.loads(k[2:]).items()):
                    out.append({**json.loads(k[2:]), **project(item, sub)})
                elif k.startswith("v:") and json.loads(k[2:]) == item:
                    out.append(copy.deepcopy(item))
        return out
    return copy.deepcopy(value)


_TIMES = ("<timestamp>", "<lastTransitionTime>", "<firstTimestamp>", "<lastTimestamp>", "<startTime>",
          "<creationTimestamp>", "<time>", "<eventTime>")


def denormalise(value: Any) -> Any:
    """A recorded (normalised) value made writable again: times are now, resourceVersions go."""
    if isinstance(value, dict):
        return {k: denormalise(v) for k, v in value.items() if v != "<resourceVersion>"}
    if isinstance(value, list):
        return [denormalise(v) for v in value]
    if value in _TIMES:
        return _now()
    return value


def _conditions_as_read(request: dict[str, Any], live: dict[str, Any], answer: dict[str, Any]) -> None:
    """The recorder's read-modify-write of a Workload's conditions (054) sent back some times and
    messages unchanged, as it had read them: the record's answer shows another manager (Kueue)
    still owning exactly those. The replay's live values differ from the record's (its clock, its
    uids), so the request carries the replay's for those fields."""
    mine = (request.get("query") or {}).get("fieldManager", "python-requests")
    others: dict[str, Any] = {}
    for entry in answer.get("metadata", {}).get("managedFields") or []:
        if entry["manager"] != mine:
            for key, fields in ((entry["fieldsV1"].get("f:status") or {}).get("f:conditions") or {}).items():
                others.setdefault(json.loads(key[2:])["type"], {}).update(fields)
    read = {c["type"]: c for c in (live.get("status") or {}).get("conditions") or []}
    for cond in (request["body"].get("status") or {}).get("conditions") or []:
        was = read.get(cond["type"])
        for key in ("lastTransitionTime", "message"):
            if was is not None and key in was and f"f:{key}" in others.get(cond["type"], {}):
                cond[key] = was[key]


def _written(obj: dict[str, Any], entry: dict[str, Any]) -> Any:
    """What ``entry``'s manager owns in ``obj`` (normalised): its fields and their values."""
    same = [m for m in obj["metadata"].get("managedFields") or []
            if (m["manager"], m["operation"], m.get("subresource")) ==
            (entry["manager"], entry["operation"], entry.get("subresource"))]
    return normalise([(m["fieldsV1"], project(obj, m["fieldsV1"])) for m in same])


def _object_path(path: str) -> str:
    return path.removesuffix("/status")


class Kueue:
    """Kueue's writes between exchanges, read from the record's answers (README: what Kueue did
    between them); and the recorder's own steps (its uids, its reads before a patch, its waits)."""

    def __init__(self, exchanges: list[Exchange]) -> None:
        self.exchanges = {e.number: e for e in exchanges}
        self.uids: dict[str, str] = {}  # the record's uid -> the replay's

    # ---- the request as the recorder sent it, with this replay's uids and resourceVersions ----

    def resolve(self, c: Client, request: dict[str, Any]) -> dict[str, Any]:
        body = request.get("body")
        if isinstance(body, dict):
            meta = body.get("metadata") or {}
            for ref in meta.get("ownerReferences") or []:
                if ref.get("kind") == "TrainingJob":
                    live = _must(c.json("GET", f"/apis/railyard.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs/"
                                        f"{ref['name']}"), f"owner {ref['name']}")
                    self.uids[ref["uid"]] = live["metadata"]["uid"]
            if request["method"] == "PATCH" and ("uid" in meta or "resourceVersion" in meta):
                # the recorder read the object right before (its uid and resourceVersion in the patch)
                live = _must(c.json("GET", _object_path(request["path"])), "the object before the patch")
                if "uid" in meta:
                    self.uids[meta["uid"]] = live["metadata"]["uid"]
                answer = self._answer_to(request)
                request = copy.deepcopy(request)
                request["body"]["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
                _conditions_as_read(request, live, answer)
        text = json.dumps(request)
        for recorded, real in self.uids.items():
            text = text.replace(recorded, real)
        out: dict[str, Any] = json.loads(text)
        return out

    def _answer_to(self, request: dict[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = next(e.expected for e in self.exchanges.values() if e.request is request)["body"]
        return answer

    # ---- Kueue's writes ----------------------------------------------------------------------------

    def state_before(self, number: str) -> Callable[[Client], None]:
        """What Kueue had written on the object this exchange answers with, as the answer shows it:
        a Workload's status applied by ``kueue-admission`` (server-side apply, forced), a queue's
        status updated by ``kueue``."""
        def hook(c: Client) -> None:
            ex = self.exchanges[number]
            recorded = ex.expected["body"]
            path = _object_path(ex.request["path"])
            live = _must(c.json("GET", path), f"{number}: the object")
            for entry in recorded["metadata"]["managedFields"]:
                if entry["manager"] not in KUEUE_MANAGERS or entry.get("subresource") != "status":
                    continue
                if _written(live, entry) == _written(recorded, entry):
                    continue  # Kueue wrote nothing new since (the answer shows what the replay holds)
                status = denormalise(project(recorded, entry["fieldsV1"]).get("status") or {})
                if entry["operation"] == "Apply":
                    apply = {"apiVersion": recorded["apiVersion"], "kind": recorded["kind"],
                             "metadata": {"name": recorded["metadata"]["name"]}, "status": status}
                    _must(c.json("PATCH", f"{path}/status", apply, content_type="application/apply-patch+yaml",
                                 query={"fieldManager": entry["manager"], "force": "true"}), f"{number}: Kueue's apply")
                else:
                    _must(c.json("PUT", f"{path}/status", {**live, "status": status},
                                 query={"fieldManager": entry["manager"]}), f"{number}: Kueue's status update")
        return hook

    def events(self, number: str) -> Callable[[Client], None]:
        """Kueue's Events on a Workload (its recorder posts them, then counts repeats up)."""
        def hook(c: Client) -> None:
            for item in self.exchanges[number].expected["body"]["items"]:
                involved = item["involvedObject"]
                live = _must(c.json("GET", f"{WORKLOADS}/{involved['name']}"), f"{number}: {involved['name']}")
                event = denormalise({k: v for k, v in item.items() if k != "metadata"})
                event["involvedObject"] = {**involved, "uid": live["metadata"]["uid"],
                                           "resourceVersion": live["metadata"]["resourceVersion"]}
                name = item["metadata"]["name"]
                path = f"/api/v1/namespaces/{NAMESPACE}/events"
                status, old = c.json("GET", f"{path}/{name}")
                if status == 404:
                    _must(c.json("POST", path, {**event, "metadata": {"name": name}}, query={"fieldManager": "kueue"}),
                          f"{number}: event {name}")
                elif old.get("count") != item["count"]:
                    _must(c.json("PUT", f"{path}/{name}", {**event, "metadata": old["metadata"],
                                                            "firstTimestamp": old["firstTimestamp"]},
                                 query={"fieldManager": "kueue"}), f"{number}: event {name} again")
        return hook

    def ungater(self, c: Client) -> None:
        """Kueue's topology ungater (154): each pod's gate removed and its node selected by rank."""
        for item in self.exchanges["154"].expected["body"]["items"]:
            patch = {"spec": {"nodeSelector": item["spec"]["nodeSelector"], "schedulingGates": None}}
            _must(c.json("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{item['metadata']['name']}", patch,
                         content_type="application/merge-patch+json", query={"fieldManager": "kueue"}),
                  f"the ungater on {item['metadata']['name']}")

    # ---- the recorder's steps ------------------------------------------------------------------------

    def pod_running(self, c: Client) -> None:
        """The recorder's fake kubelet marked tj-t2-0 Running on its node before 115."""
        status = denormalise(self.exchanges["115"].expected["body"]["status"])
        _must(c.json("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/tj-t2-0/status", {"status": status},
                     content_type="application/merge-patch+json"), "tj-t2-0 Running")

    @staticmethod
    def collected(name: str) -> Callable[[Client], None]:
        """The garbage collector deletes the Workload of a deleted TrainingJob (the server's part)."""
        def hook(c: Client) -> None:
            wait_until(lambda: c.json("GET", f"{WORKLOADS}/{name}")[0] == 404, timeout=WAIT_S, interval=0.05,
                       message=f"the garbage collector to delete Workload {name}")
        return hook

    @staticmethod
    def examples_gone(c: Client) -> None:
        """The record's Table at 028 lists no tj-x-* Workload: the recorder deleted their owner
        after 024 (not an exchange); the garbage collector takes its three Workloads."""
        _must(c.json("DELETE", f"/apis/railyard.dev/v1alpha1/namespaces/{NAMESPACE}/trainingjobs/tj-x"),
              "tj-x's delete")
        for name in ("tj-x-noqueue", "tj-x-toobig", "tj-x-uncovered"):
            Kueue.collected(name)(c)

    @staticmethod
    def new_phase(c: Client) -> None:
        """README: the namespace is deleted and re-created before the TAS phase."""
        path = f"/api/v1/namespaces/{NAMESPACE}"
        _must(c.json("DELETE", path), "the namespace's delete")
        wait_until(lambda: c.json("GET", path)[0] == 404, timeout=WAIT_S, interval=0.05, message="the namespace gone")
        _must(c.json("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}), "the namespace again")

    def hooks(self) -> dict[str, Callable[[Client], None]]:
        out: dict[str, Callable[[Client], None]] = {}
        for number, ex in self.exchanges.items():
            body = ex.expected.get("body")
            if number in KUEUE_WRITES_ITSELF or not isinstance(body, dict):
                continue
            if any(m["manager"] in KUEUE_MANAGERS for m in (body.get("metadata") or {}).get("managedFields") or ()):
                out[number] = self.state_before(number)
            if body.get("kind") == "EventList":
                out[number] = self.events(number)
        chain = {"025": self.examples_gone, "060": self.collected("tj-d"), "063": self.collected("tj-b"),
                 "100": self.new_phase, "115": self.pod_running, "154": self.ungater}
        for number, hook in chain.items():
            first = out.get(number)
            out[number] = hook if first is None else _both(hook, first)
        return out


def _both(first: Callable[[Client], None], second: Callable[[Client], None]) -> Callable[[Client], None]:
    def hook(c: Client) -> None:
        first(c)
        second(c)
    return hook


#: Exchanges whose own request writes Kueue's fields (the owner's acknowledgement of an eviction,
#: 042 as Kueue's jobframework with its field manager, 054 as a merge patch): their answers show
#: the state after them, so nothing of Kueue's is played before them.
KUEUE_WRITES_ITSELF = frozenset({"042", "054"})


def _without_kueue_webhooks(response: dict[str, Any]) -> dict[str, Any]:
    """Both sides without what ``KUEUE_WEBHOOKS`` names."""
    out = copy.deepcopy(response)
    body = out.get("body")
    for obj in (body.get("items") or [body]) if isinstance(body, dict) else []:
        if not isinstance(obj, dict):
            continue
        meta = obj.get("metadata") or {}
        if "kueue.x-k8s.io/resource-in-use" in (meta.get("finalizers") or []):
            meta["finalizers"] = [f for f in meta["finalizers"] if f != "kueue.x-k8s.io/resource-in-use"]
            if not meta["finalizers"]:
                del meta["finalizers"]
        for pod_set in (obj.get("spec") or {}).get("podSets") or [] if obj.get("kind") == "Workload" else []:
            if pod_set.get("template", {}).get("metadata") == {}:
                del pod_set["template"]["metadata"]
    return out


def _crds(c: Client) -> None:
    crds = [kueue_crd(kind) for kind in KUEUE_KINDS] + [yaml.safe_load(TRAININGJOB_CRD.read_text())]
    for crd in crds:
        _must(c.json("POST", CRDS, crd), f"CRD {crd['metadata']['name']}")
    for crd in crds:
        spec = crd["spec"]
        version = spec["versions"][0]["name"]
        where = f"namespaces/{NAMESPACE}/" if spec["scope"] == "Namespaced" else ""
        path = f"/apis/{spec['group']}/{version}/{where}{spec['names']['plural']}"
        wait_until(lambda p=path: c.json("GET", p)[0] == 200, timeout=WAIT_S, interval=0.05, message=f"{path} served")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    state: Path = tmp_path_factory.mktemp("golden-kueue-apiserver")
    proc = start_server_process(state, token=secrets.token_hex(16))
    try:
        client = Client(proc.url, proc.token, proc.ca_file)
        _crds(client)
        exchanges = [e for e in load_corpus(CORPUS) if e.number not in KUEUE_WEBHOOK_REFUSALS]
        kueue = Kueue(exchanges)
        replay(client, exchanges, namespace=NAMESPACE, before=kueue.hooks(),
               resolve=lambda request: kueue.resolve(client, request))
        for ex in exchanges:
            ex.expected = _without_kueue_webhooks(ex.expected)
            if ex.got is not None:
                ex.got = _without_kueue_webhooks(ex.got)
        yield Replay(exchanges, load_allowlist(ALLOWLIST))
    finally:
        proc.stop()


def test_the_corpus_is_complete() -> None:
    """99 exchanges: 000-073 (main), 100-119 (TAS), 150-154 (Kueue's topology ungater)."""
    numbers = [f"{i:03d}" for i in (*range(74), *range(100, 120), *range(150, 155))]
    assert [c.number for c in CASES] == numbers
    assert all(c.request.get("method") and "status" in c.expected for c in CASES)


def test_every_allowlist_entry_names_a_case_and_a_reason() -> None:
    assert allowlist_problems(load_allowlist(ALLOWLIST), CASES) == []


@pytest.mark.parametrize("number", sorted(KUEUE_WEBHOOK_REFUSALS))
def test_what_is_not_sent_is_a_kueue_webhooks_answer_in_the_record(number: str) -> None:
    """The exchanges the replay leaves to Kueue were answered by Kueue's admission webhook, not by
    the API server's own validation (the record's message names the webhook)."""
    [case] = [c for c in CASES if c.number == number]
    assert case.expected["status"] == 403
    assert case.expected["body"]["message"].startswith('admission webhook "vworkload.kb.io" denied the request')


def _case(name: str) -> object:
    number = name.split("-", 1)[0]
    if number in KUEUE_WEBHOOK_REFUSALS:
        return pytest.param(name, marks=pytest.mark.skip(reason=f"Kueue's answer, not the server's: "
                                                                 f"{KUEUE_WEBHOOK_REFUSALS[number]}"))
    return name


@pytest.mark.parametrize("name", [_case(c.name) for c in CASES])
def test_exchange_matches_the_record(replayed: Replay, name: str) -> None:
    ex = replayed.by_name(name)
    problems = differences(ex, replayed.allow)
    assert not problems, f"{name} ({ex.note}):\n  " + "\n  ".join(problems)
