"""The embedded API server, with the local scheduler running against it, answers the recorded
exchanges of a real v1.36.2 control plane about disruptions (kube-v1.36-disruption/README.md) the
way it did: PodDisruptionBudget status as the disruption controller computes it (UnmanagedPods
for ``maxUnavailable`` over bare pods, the scale of the pods' controller otherwise), the eviction
subresource (429 with the DisruptionBudget cause, 500 for two budgets, 201 with the
DisruptionTarget condition, no check for terminating, unselected or Pending pods), cordons, a
lost node and preemption.

What the recorded cluster did between exchanges (its recorder's nodes, its waits, its deletes) is
played by ``Recorder.hooks``. Kept differences: ``allowlist-disruption.txt``; exchanges that need
what the embedded cluster does not do yet: ``NOT_YET``.
"""

from __future__ import annotations

import json
import secrets
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
    Exchange,
    Replay,
    allowlist_problems,
    differences,
    load_allowlist,
    load_corpus,
    replay,
)
from .test_replaying_dynamic_resource_allocation import register_nodes

CORPUS = Path(__file__).parent / "kube-v1.36-disruption"
ALLOWLIST = Path(__file__).parent / "allowlist-disruption.txt"
NAMESPACE = "golden-disruption"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
PDBS = f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CASES = load_corpus(CORPUS)

#: Exchanges the embedded cluster does not answer as recorded yet, each failing strictly so that
#: the day it matches it must leave this list. A lost node's NotReady/unreachable taints and the
#: taint manager's eviction are kube-controller-manager's node lifecycle controller (issue 46
#: item 1, apiserver/nodelifecycle.py, another branch); preemption is the scheduler's.
NOT_YET = {
    "040": "the local scheduler's Unschedulable message for a cordoned node differs from kube-scheduler's",
    "047": "a lost node: NotReady/Unknown conditions and unreachable taints need the node lifecycle controller",
    "048": "taint-based eviction (DisruptionTarget DeletionByTaintManager) needs the node lifecycle controller",
    "049": "pods of a lost node marked Ready=False by the node lifecycle controller",
    "050": "the taint manager's events",
    "051": "the node lifecycle controller's node events",
    "052": "the node back: the recorder's heartbeat takes back the conditions kcm had set Unknown (after 047)",
    "059": "preemption by priority: the local scheduler does not preempt (DisruptionTarget PreemptionByScheduler)",
    "060": "the preemptor's status.nominatedNodeName",
    "061": "the scheduler's Preempted event",
    "062": "the preemptor bound once the victim is gone",
}


class Recorder:
    """What the recorder knew and did between exchanges (kube-v1.36-disruption/README.md)."""

    def __init__(self, exchanges: list[Exchange]) -> None:
        self.exchanges = {e.number: e for e in exchanges}

    def resolve(self, request: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(request)
        if "<uid of x08>" in text:
            got = self.exchanges["008"].got or {}
            text = text.replace("<uid of x08>", str(((got.get("body") or {}).get("metadata") or {}).get("uid")))
        out: dict[str, Any] = json.loads(text)
        return out

    @staticmethod
    def bound(*pods: str) -> Callable[[Client], None]:
        def hook(c: Client) -> None:
            for pod in pods:
                wait_until(lambda p=pod: ((c.json("GET", f"{PODS}/{p}")[1] or {}).get("spec") or {}).get("nodeName"),
                           timeout=WAIT_S, interval=0.05, message=f"the scheduler to bind {pod}")
        return hook

    @staticmethod
    def budget(name: str, check: Callable[[dict[str, Any]], bool], what: str) -> Callable[[Client], None]:
        def hook(c: Client) -> None:
            wait_until(lambda: check((c.json("GET", f"{PDBS}/{name}")[1] or {}).get("status") or {}),
                       timeout=WAIT_S, interval=0.05, message=f"{name}'s status: {what}")
        return hook

    @staticmethod
    def unmanaged_event(c: Client) -> None:
        wait_until(lambda: (c.json("GET", f"/api/v1/namespaces/{NAMESPACE}/events",
                                   query={"fieldSelector": "involvedObject.name=pdb-zero,reason=UnmanagedPods"})[1]
                            or {}).get("items"), timeout=WAIT_S, interval=0.05, message="the UnmanagedPods event")

    @staticmethod
    def replicator_crd(c: Client) -> None:
        crd = json.loads((CORPUS / "setup-replicator-crd.json").read_text())
        status, body = c.json("POST", CRDS, crd)
        if status != 201:
            raise RuntimeError(f"could not create the Replicator CRD: {status} {body}")
        wait_until(lambda: c.json("GET", f"/apis/golden.example.com/v1/namespaces/{NAMESPACE}/replicators")[0] == 200,
                   timeout=WAIT_S, interval=0.05, message="the Replicator resource to be served")

    @staticmethod
    def gone(pod: str, then: Callable[[Client], None] | None = None) -> Callable[[Client], None]:
        """The recorder's delete with grace 0 of a pod it had shown terminating."""
        def hook(c: Client) -> None:
            if then is not None:
                then(c)
            c.json("DELETE", f"{PODS}/{pod}", {"gracePeriodSeconds": 0})
            wait_until(lambda: c.json("GET", f"{PODS}/{pod}")[0] == 404, timeout=WAIT_S, interval=0.05,
                       message=f"{pod} to go")
        return hook

    def hooks(self) -> dict[str, Callable[[Client], None]]:
        no_disrupted = self.budget("pdb-one", lambda s: "disruptedPods" not in s and s.get("currentHealthy") == 1,
                                   "disruptedPods dropped once web-0 terminates")
        return {
            "000": lambda c: register_nodes(c, CORPUS / "setup-nodes.json"),
            "003": self.bound("web-0", "web-1"),
            "005": self.budget("pdb-zero", lambda s: s.get("currentHealthy") == 2, "two healthy pods"),
            "006": self.unmanaged_event,
            "008": self.replicator_crd,
            "012": self.budget("pdb-zero", lambda s: s.get("expectedPods") == 2, "the Replicator's scale"),
            "018": self.budget("pdb-one", lambda s: s.get("observedGeneration") == 1, "computed"),
            "029": no_disrupted,
            "030": self.gone("web-0"),
            "031": self.bound("lone-0"),
            "034": self.gone("lone-0"),
            "043": self.gone("on-cordoned"),
            "045": self.bound("stale-5s", "stale-300s"),
            "057": self.bound("victim"),
        }


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    state: Path = tmp_path_factory.mktemp("golden-disruption-apiserver")
    proc = start_server_process(state, token=secrets.token_hex(16))
    sched = SchedulerThread(proc.write_kubeconfig(state / "kubeconfig"), field_manager="kube-scheduler")
    try:
        sched.start()
        exchanges = load_corpus(CORPUS)
        recorder = Recorder(exchanges)
        replay(Client(proc.url, proc.token, proc.ca_file), exchanges, namespace=NAMESPACE, before=recorder.hooks(),
               resolve=recorder.resolve)
        yield Replay(exchanges, load_allowlist(ALLOWLIST))
    finally:
        sched.stop()
        proc.stop()


def test_the_corpus_is_complete() -> None:
    """63 exchanges (000-062), each with a request and an answer."""
    assert [c.number for c in CASES] == [f"{i:03d}" for i in range(63)]
    assert all(c.request.get("method") and "status" in c.expected for c in CASES)


def test_every_allowlist_entry_names_a_case_and_a_reason() -> None:
    assert allowlist_problems(load_allowlist(ALLOWLIST), CASES) == []


def _case(name: str) -> object:
    number = name.split("-", 1)[0]
    if number in NOT_YET:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=NOT_YET[number]))
    return name


@pytest.mark.parametrize("name", [_case(c.name) for c in CASES])
def test_exchange_matches_the_record(replayed: Replay, name: str) -> None:
    ex = replayed.by_name(name)
    problems = differences(ex, replayed.allow)
    assert not problems, f"{name} ({ex.note}):\n  " + "\n  ".join(problems)
