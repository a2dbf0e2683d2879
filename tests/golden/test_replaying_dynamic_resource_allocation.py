"""The embedded API server, with the local scheduler running against it, answers the recorded
exchanges of a real kube-apiserver, kube-controller-manager and kube-scheduler v1.36.2 about
Dynamic Resource Allocation (resource.k8s.io/v1, kube-v1.36-dra/README.md) the way they did:
DeviceClass, ResourceSlice and ResourceClaimTemplate validation and defaults, the claim the
resourceclaim controller makes from a pod's template, the scheduler's finalizer, allocation and
reservation, a claim shared by two pods, and the cleanup once its pods are gone.

What the recorded cluster did between exchanges (its recorder's node, its waits, its deletes)
is played by ``BEFORE``; the claims' generated names are read from the pods, as the recorder
did. Kept differences: ``allowlist-dra.txt``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.waiting import wait_until

from railyard_local.apiserver.process import start_server_process

from .local_scheduler import SchedulerThread
from .replay import (
    WAIT_S,
    Client,
    Replay,
    allowlist_problems,
    differences,
    load_allowlist,
    load_corpus,
    rename,
    replay,
)

CORPUS = Path(__file__).parent / "kube-v1.36-dra"
ALLOWLIST = Path(__file__).parent / "allowlist-dra.txt"
NAMESPACE = "golden-dra"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CASES = load_corpus(CORPUS)


def register_nodes(c: Client, setup: Path) -> None:
    """The recorder's nodes (``setup-nodes.json``): created with their status, as a kubelet
    registers, then one heartbeat (the Ready and pressure conditions' times) through /status."""
    for node in json.loads(setup.read_text()):
        name = node["metadata"]["name"]
        status, body = c.json("POST", "/api/v1/nodes", node)
        if status != 201:
            raise RuntimeError(f"could not register {name}: {status} {body}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        beat = [{**cond, "lastHeartbeatTime": now, "lastTransitionTime": now} for cond in node["status"]["conditions"]]
        status, body = c.json("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": beat}},
                              content_type="application/strategic-merge-patch+json")
        if status != 200:
            raise RuntimeError(f"could not make {name} ready: {status} {body}")


class Recorder:
    """What the recorder knew and did between exchanges: the list's resourceVersion before 013,
    the claims' generated names (from the pods' ``status.resourceClaimStatuses``), its waits."""

    def __init__(self) -> None:
        self.list_rv = ""
        self.claims: dict[str, str] = {}  # pod -> its claim's real name

    def resolve(self, request: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(request).replace("<resourceVersion of the list before d10>", self.list_rv)
        for pod, real in self.claims.items():
            text = text.replace(f"{pod}-gpus-<random>", real)
        out: dict[str, Any] = json.loads(text)
        return out

    def names(self) -> dict[str, str]:
        return {real: f"{pod}-gpus-<random>" for pod, real in self.claims.items()}

    def take_list_rv(self, c: Client) -> None:
        self.list_rv = str(c.json("GET", CLAIMS)[1]["metadata"]["resourceVersion"])

    def claim_of(self, c: Client, pod: str) -> str:
        def made() -> str:
            _, body = c.json("GET", f"{PODS}/{pod}")
            return next((s.get("resourceClaimName", "") for s in ((body or {}).get("status") or {})
                         .get("resourceClaimStatuses") or []), "")
        self.claims[pod] = wait_until(made, timeout=WAIT_S, interval=0.05, message=f"kcm's claim for {pod}")
        return self.claims[pod]

    def wait_bound(self, *pods: str) -> Callable[[Client], None]:
        def hook(c: Client) -> None:
            for pod in pods:
                wait_until(lambda p=pod: ((c.json("GET", f"{PODS}/{p}")[1] or {}).get("spec") or {}).get("nodeName"),
                           timeout=WAIT_S, interval=0.05, message=f"the scheduler to bind {pod}")
        return hook

    def first_pod_bound(self, c: Client) -> None:
        self.claim_of(c, "dra-pod-1")
        self.wait_bound("dra-pod-1")(c)

    def second_pod_unschedulable(self, c: Client) -> None:
        self.claim_of(c, "dra-pod-2")

        def refused() -> bool:
            conds = ((c.json("GET", f"{PODS}/dra-pod-2")[1] or {}).get("status") or {}).get("conditions") or []
            return any(x.get("type") == "PodScheduled" and x.get("status") == "False" for x in conds)
        wait_until(refused, timeout=WAIT_S, interval=0.05, message="PodScheduled=False on dra-pod-2")

    def events_of(self, pod: str, reason: str) -> Callable[[Client], None]:
        def hook(c: Client) -> None:
            def seen() -> bool:
                _, body = c.json("GET", f"/api/v1/namespaces/{NAMESPACE}/events",
                                 query={"fieldSelector": f"involvedObject.name={pod}"})
                return any(e.get("reason") == reason for e in (body or {}).get("items") or [])
            wait_until(seen, timeout=WAIT_S, interval=0.05, message=f"a {reason} event about {pod}")
        return hook

    def claim_gone(self, c: Client, name: str) -> None:
        wait_until(lambda: c.json("GET", f"{CLAIMS}/{name}")[0] == 404, timeout=WAIT_S, interval=0.05,
                   message=f"claim {name} to go")

    def first_claim_gone(self, c: Client) -> None:
        self.claim_gone(c, self.claims["dra-pod-1"])

    def second_claim_allocated(self, c: Client) -> None:
        name = self.claims["dra-pod-2"]
        wait_until(lambda: ((c.json("GET", f"{CLAIMS}/{name}")[1] or {}).get("status") or {}).get("allocation"),
                   timeout=WAIT_S, interval=0.05, message="the freed devices to go to dra-pod-2's claim")
        self.wait_bound("dra-pod-2")(c)

    def force_delete(self, pod: str, then: Callable[[Client], None]) -> Callable[[Client], None]:
        def hook(c: Client) -> None:
            status, body = c.json("DELETE", f"{PODS}/{pod}", {"gracePeriodSeconds": 0})
            if status != 200:
                raise RuntimeError(f"could not delete {pod}: {status} {body}")
            then(c)
        return hook

    def second_claim_gone(self, c: Client) -> None:
        self.claim_gone(c, self.claims["dra-pod-2"])

    def one_consumer_left(self, c: Client) -> None:
        wait_until(lambda: len(((c.json("GET", f"{CLAIMS}/shared-gpu")[1] or {}).get("status") or {})
                               .get("reservedFor") or []) == 1,
                   timeout=WAIT_S, interval=0.05, message="kcm to drop share-a from reservedFor")

    def shared_claim_gone(self, c: Client) -> None:
        self.claim_gone(c, "shared-gpu")

    @staticmethod
    def nodes(c: Client) -> None:
        """rec-dra-0, and the five nodes of the disruption corpus that existed too (the scheduler's
        messages count 6 nodes)."""
        register_nodes(c, CORPUS / "setup-nodes.json")
        register_nodes(c, CORPUS.parent / "kube-v1.36-disruption" / "setup-nodes.json")

    def hooks(self) -> dict[str, Callable[[Client], None]]:
        """By exchange number, what the recorder did before it (kube-v1.36-dra/README.md)."""
        return {
            "004": self.nodes,
            "013": self.take_list_rv,
            "014": self.first_pod_bound,
            "021": self.second_pod_unschedulable,
            "023": self.events_of("dra-pod-2", "FailedScheduling"),
            "025": self.first_claim_gone,
            "026": self.second_claim_allocated,
            "027": self.force_delete("dra-pod-2", self.second_claim_gone),
            "030": self.wait_bound("share-a", "share-b"),
            "034": self.force_delete("share-a", self.one_consumer_left),
            "035": self.force_delete("share-b", self.shared_claim_gone),
            "037": self.events_of("dra-orphan", "FailedResourceClaimCreation"),
        }


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    state: Path = tmp_path_factory.mktemp("golden-dra-apiserver")
    proc = start_server_process(state, token=secrets.token_hex(16))
    sched = SchedulerThread(proc.write_kubeconfig(state / "kubeconfig"), dra=True, field_manager="kube-scheduler")
    try:
        sched.start()
        exchanges = load_corpus(CORPUS)
        recorder = Recorder()
        replay(Client(proc.url, proc.token, proc.ca_file), exchanges, namespace=NAMESPACE, before=recorder.hooks(),
               resolve=recorder.resolve)
        rename(exchanges, recorder.names())
        yield Replay(exchanges, load_allowlist(ALLOWLIST))
    finally:
        sched.stop()
        proc.stop()


def test_the_corpus_is_complete() -> None:
    """38 exchanges (000-037), each with a request and an answer."""
    assert [c.number for c in CASES] == [f"{i:03d}" for i in range(38)]
    assert all(c.request.get("method") and "status" in c.expected for c in CASES)


def test_every_allowlist_entry_names_a_case_and_a_reason() -> None:
    assert allowlist_problems(load_allowlist(ALLOWLIST), CASES) == []


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_exchange_matches_the_record(replayed: Replay, name: str) -> None:
    ex = replayed.by_name(name)
    problems = differences(ex, replayed.allow)
    assert not problems, f"{name} ({ex.note}):\n  " + "\n  ".join(problems)
