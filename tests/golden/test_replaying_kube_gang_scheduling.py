"""The embedded API server, with the local scheduler running against it, answers the recorded
exchanges of a real kube-apiserver + kube-scheduler v1.36 with the gang scheduling gates
(kube-v1.36-workload/README.md) the way they did: Workloads, PodGroups and their validation,
pods in groups, all-or-nothing placement inside one leaf, the PodGroup's status and the
scheduler's events, and the ``status.qosClass`` rules a node agent meets.

The record was made on six nodes of 8 GPUs in one spine and two leaves; the replay registers the
same nodes and runs the local scheduler (field manager ``sched``, as the recorded one wrote)
in a thread. What the recorded cluster's fake kubelet wrote between exchanges is played by
``replay.WORKLOAD_BEFORE``. Kept differences: ``allowlist-workload.txt``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from railyard_local.apiserver.process import start_server_process

from .local_scheduler import SchedulerThread
from .replay import (
    WORKLOAD_ALLOWLIST,
    WORKLOAD_BEFORE,
    WORKLOAD_CORPUS,
    WORKLOAD_NAMESPACE,
    Client,
    Replay,
    allowlist_problems,
    differences,
    load_allowlist,
    load_corpus,
    replay,
)

CASES = load_corpus(WORKLOAD_CORPUS)
NODES = {f"fake-{i:04d}": f"leaf-{i // 3}" for i in range(6)}


def _register_nodes(c: Client) -> None:
    for name, leaf in NODES.items():
        labels = {"kubernetes.io/hostname": name, "railyard.dev/leaf": leaf, "railyard.dev/spine": "spine-0"}
        status, body = c.json("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": labels}})
        if status != 201:
            raise RuntimeError(f"could not register {name}: {status} {body}")
        alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
        status, body = c.json("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
            "allocatable": alloc, "capacity": alloc, "conditions": [{"type": "Ready", "status": "True"}]}},
            content_type="application/merge-patch+json")
        if status != 200:
            raise RuntimeError(f"could not make {name} ready: {status} {body}")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    state: Path = tmp_path_factory.mktemp("golden-gang-apiserver")
    proc = start_server_process(state, token=secrets.token_hex(16))
    sched = SchedulerThread(proc.write_kubeconfig(state / "kubeconfig"))
    try:
        client = Client(proc.url, proc.token, proc.ca_file)
        _register_nodes(client)
        sched.start()
        exchanges = load_corpus(WORKLOAD_CORPUS)
        # The recorded scheduler never saw job-a's gang incomplete (no pod of it was marked waiting)
        # and had not got to qos-1 (034) when 035 wrote its status: the replay's holds its
        # decisions over the same exchanges.
        def resume_and_run(c: Client) -> None:
            sched.resume(c)
            WORKLOAD_BEFORE["020"](c)

        before = {**WORKLOAD_BEFORE, "014": sched.pause, "020": resume_and_run, "034": sched.pause,
                  "036": sched.resume}
        replay(client, exchanges, namespace=WORKLOAD_NAMESPACE, before=before)
        yield Replay(exchanges, load_allowlist(WORKLOAD_ALLOWLIST))
    finally:
        sched.stop()
        proc.stop()


def test_the_corpus_is_complete() -> None:
    """38 exchanges (000-037), each with a request and an answer."""
    assert [c.number for c in CASES] == [f"{i:03d}" for i in range(38)]
    assert all(c.request.get("method") and "status" in c.expected for c in CASES)


def test_every_allowlist_entry_names_a_case_and_a_reason() -> None:
    assert allowlist_problems(load_allowlist(WORKLOAD_ALLOWLIST), CASES) == []


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_exchange_matches_the_record(replayed: Replay, name: str) -> None:
    ex = replayed.by_name(name)
    problems = differences(ex, replayed.allow)
    assert not problems, f"{name} ({ex.note}):\n  " + "\n  ".join(problems)


def test_the_gang_shares_one_leaf(replayed: Replay) -> None:
    """What 020's allow-listed nodeNames leave out: all three pods bound, on three nodes of one leaf."""
    got = replayed.by_name("020-w30-gang-scheduled-pods").got
    assert got is not None
    items: list[dict[str, Any]] = got["body"]["items"]
    gang = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in items if p["metadata"]["name"].startswith("job-a")}
    assert len(gang) == 3 and all(gang.values()), gang
    assert len(set(gang.values())) == 3
    assert len({NODES[n] for n in gang.values() if n}) == 1, gang
    orphan = next(p for p in items if p["metadata"]["name"] == "orphan-0")
    assert not orphan["spec"].get("nodeName"), "a pod naming a missing PodGroup stays Pending"


def test_the_gang_that_cannot_fit_binds_nothing(replayed: Replay) -> None:
    got = replayed.by_name("028-w46-gang-pod-pending").got
    assert got is not None and not got["body"]["spec"].get("nodeName")
