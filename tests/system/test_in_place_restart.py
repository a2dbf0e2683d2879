"""In-place restart end to end: the REAL trainer under the operator on the local cluster, each
fault in its own job, all in parallel, one cluster and one operator for the module.

| job | pool | fault | expected |
|---|---|---|---|
| nodefail | p (3 nodes, 1 hot spare) | pod 1's node fails after step 13 (alone: the other jobs start once it has resumed) | pod 0 kept, pod 1 replaced on the spare; restored from the memory tier, which lives in the pods (``medium: Pod``, in a namespace enforcing the baseline Pod Security Standard): pod 1's shard from pod 0's replica; the time from the failure to training resumed is reported |
| crash | q (2 nodes) | ``crash`` on rank 1 at step 12 | both pods kept, their launchers restart the workers |
| hang | r (3 nodes) | ``hang`` on rank 1 at step 15 | hang verdict: pod 1's node quarantined, pod 1 replaced, pod 0 kept |
| deaf | s (2 nodes) | ``crash`` on rank 1, launchers ignore restart orders | no launcher restarts in time: a full restart (``RestartNotAnswered``) |

Measured numbers are printed (``-s``) and kept in ``RESULTS``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.system.conftest import (
    SYSTEM_NS,
    Api,
    OperatorProcess,
    base_spec,
    cluster_nodes,
    pod_events,
    unique,
    wait_status,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(480)]

POOL = "e2e.railyard.dev/pool"
POOLS = {"p": 3, "q": 2, "r": 3, "s": 2}
FAIL = "local.railyard.dev/fail"
MEMORY_INTERVAL = 5
#: A namespace that enforces the baseline Pod Security Standard (as a real API server does).
BASELINE_NS = "railyard-baseline-e2e"
RESULTS: dict[str, dict[str, Any]] = {}
#: Set when the module's jobs are done with: the watchers stop polling the API server (a given
#: one outlives the module; nothing of the module should still be talking to it then).
STOP = threading.Event()


@pytest.fixture(scope="module")
def operator(api: Api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The module's operator, watching the baseline namespace too."""
    from kubernetes.client.rest import ApiException

    try:
        api.core.create_namespace({"metadata": {"name": BASELINE_NS, "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    except ApiException as exc:
        if exc.status != 409:
            raise
        api.core.patch_namespace(BASELINE_NS, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(api.kubeconfig, log, [SYSTEM_NS, BASELINE_NS])
    try:
        yield op
    finally:
        op.stop()


@dataclass
class Job:
    name: str
    namespace: str
    spec: dict[str, Any]
    notes: dict[str, Any] = field(default_factory=dict)
    driver: threading.Thread | None = None
    #: gang pod name -> (node, when first seen Running): every pod the job ever had
    pods: dict[str, tuple[str, float | None]] = field(default_factory=dict)
    watcher: threading.Thread | None = None


def _terminal(s: dict[str, Any]) -> dict[str, Any] | None:
    return s if s.get("phase") in ("Succeeded", "Failed") else None


def make(kind: str, pool: str, namespace: str = SYSTEM_NS, **overrides: Any) -> Job:
    return Job(unique(kind), namespace, base_spec(nodeSelector={POOL: pool}, **overrides))


def _status(api: Api, job: Job) -> dict[str, Any]:
    return api.status(job.namespace, job.name)


def _wait(api: Api, job: Job, what: str, pred: Any, timeout: float, op: OperatorProcess) -> Any:
    if job.namespace == SYSTEM_NS:
        return wait_status(api, job.name, what, pred, timeout, op)
    return wait_until(lambda: pred(_status(api, job)), timeout=timeout, interval=0.2, message=what,
                      explain=lambda: f"{json.dumps(_status(api, job))[:2000]}\n{op.log_tail(40)}")


def resumed_at(events: list[dict[str, Any]], attempt: int) -> tuple[float, int] | None:
    """(time, step) of the first step the workers of ``attempt`` made."""
    started = False
    for e in events:
        if e.get("event") == "launch" and int(e.get("attempt", -1)) == attempt:
            started = True
        elif started and e.get("event") == "step":
            return float(e["time"]), int(e["step"])
    return None


def _watch_pods(api: Api, job: Job) -> None:
    """Record every gang pod of the job and when it first ran, until the job ends."""
    deadline = time.monotonic() + 460
    while time.monotonic() < deadline and not STOP.is_set():
        try:
            pods = api.core.list_namespaced_pod(job.namespace, label_selector=f"railyard.dev/job={job.name}").items
            for p in pods:
                if (p.metadata.labels or {}).get("railyard.dev/spare") == "true":
                    continue
                node, seen = job.pods.get(p.metadata.name, (p.spec.node_name or "", None))
                if seen is None and p.status.phase == "Running":
                    seen = time.time()
                job.pods[p.metadata.name] = (p.spec.node_name or node, seen)
            if _terminal(_status(api, job)):
                return
        except Exception:  # an API hiccup: try again
            pass
        time.sleep(0.2)


def pod_names(api: Api, job: Job) -> dict[str, str]:
    """Gang pod name -> node (placeholders apart)."""
    pods = api.core.list_namespaced_pod(job.namespace, label_selector=f"railyard.dev/job={job.name}").items
    return {p.metadata.name: p.spec.node_name for p in pods
            if (p.metadata.labels or {}).get("railyard.dev/spare") != "true" and not p.metadata.deletion_timestamp}


@pytest.fixture(scope="module")
def jobs(local_cluster: Any, api: Api, operator: OperatorProcess) -> Iterator[dict[str, Job]]:
    nodes = cluster_nodes(local_cluster)
    assert len(nodes) >= sum(POOLS.values())
    i = 0
    for pool, count in POOLS.items():
        for n in nodes[i:i + count]:
            api.core.patch_node(n, {"metadata": {"labels": {POOL: pool}}})
        i += count
    pod_memory = {"memory": {"intervalSteps": MEMORY_INTERVAL, "keep": 2, "medium": "Pod", "sizeLimit": "1Gi"},
                  "local": {"enabled": False}, "shared": {"enabled": False}}
    nodefail = make("nodefail", "p", BASELINE_NS, trainer={"steps": 60}, checkpoint=pod_memory,
                    gang={"scheduleTimeoutSeconds": 180, "hotSpares": 1})
    others = {
        "crash": make("crash", "q", trainer={"steps": 30, "faults": [{"kind": "crash", "rank": 1, "step": 12}]}),
        "hang": make("hang", "r", trainer={"steps": 30, "faults": [{"kind": "hang", "rank": 1, "step": 15}]}),
        "deaf": make("deaf", "s", trainer={"steps": 30, "faults": [{"kind": "crash", "rank": 1, "step": 12}]},
                     env=[{"name": "RAILYARD_CONTROL_IGNORE_ORDERS", "value": "1"}]),
    }
    others["deaf"].spec["restartPolicy"]["inPlaceTimeoutSeconds"] = 10
    out = {"nodefail": nodefail, **others}

    def start(job: Job) -> None:
        api.create_job(job.namespace, job.name, job.spec)
        job.watcher = threading.Thread(target=_watch_pods, args=(api, job), daemon=True)
        job.watcher.start()

    def drive() -> None:
        # the node failure is timed alone: on a 2-core machine, other gangs starting torch at the
        # same moment would be what it measures; the other faults start once it has resumed
        try:
            _fail_a_node_mid_run(api, nodefail, operator)
            _wait(api, nodefail, "the failed node's gang resumed", lambda s: s if (s.get("attempt", 0) >= 1 and s.get("phase") == "Running"
                                                                                    and (s.get("restore") or {}).get("tier")) else _terminal(s), 240, operator)
        except Exception as exc:
            nodefail.notes.setdefault("error", repr(exc))
        finally:
            for job in others.values():
                start(job)

    start(nodefail)
    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    nodefail.driver = driver
    yield out
    STOP.set()
    for job in out.values():
        if job.watcher is not None:
            job.watcher.join(10)


def _fail_a_node_mid_run(api: Api, job: Job, op: OperatorProcess) -> None:
    try:
        s = _wait(api, job, "a memory checkpoint and step 13",
                  lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 13 and any(c["tier"] == "memory" for c in s.get("checkpoints") or [])
                  else _terminal(s), 300, op)
        if s.get("phase") != "Running":
            job.notes["error"] = f"the job ended before the node could fail: {s.get('phase')} at step {s.get('step')}"
            return
        job.notes.update(before=s["placement"]["nodes"], spares=s["placement"]["spares"], pods_before=pod_names(api, job),
                         spares_held=s.get("sparesHeld"),
                         committed_at_fail=max(c["step"] for c in s["checkpoints"] if c["tier"] == "memory"))
        victim = s["placement"]["nodes"][1]
        job.notes.update(victim=victim, t_fail=time.time())
        api.annotate_node(victim, {FAIL: "true"})
        job.notes["step_at_fail"] = int(_status(api, job).get("step", 0))
    except Exception as exc:  # reported by the test
        job.notes["error"] = repr(exc)


def _started(jobs: dict[str, Job]) -> None:
    """The other fault jobs start once the node failure's restart is measured."""
    driver = jobs["nodefail"].driver
    assert driver is not None
    driver.join(420)
    assert not driver.is_alive(), "the node-failure driver did not finish"


def _report(name: str, **values: Any) -> None:
    RESULTS.setdefault(name, {}).update(values)
    print(f"\n[in-place] {name}: " + json.dumps(values))


def test_the_baseline_namespace_is_enforced(api: Api, operator: OperatorProcess) -> None:
    """The API server enforces the namespace's Pod Security label: a hostPath pod is refused
    there (so the next test's pods, which run there, pass baseline for real)."""
    from kubernetes.client.rest import ApiException

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": unique("hostpath")},
           "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"]}],
                    "volumes": [{"name": "h", "hostPath": {"path": "/tmp"}}]}}
    with pytest.raises(ApiException) as refused:
        api.core.create_namespaced_pod(BASELINE_NS, pod)
    assert refused.value.status == 403 and "hostPath" in str(refused.value.body), refused.value.body


def test_a_lost_node_replaces_one_pod_and_the_rest_restart_in_place(local_cluster: Any, api: Api, operator: OperatorProcess, jobs: dict[str, Job]) -> None:
    job = jobs["nodefail"]
    assert job.driver is not None
    job.driver.join(420)
    notes = job.notes
    assert "error" not in notes, notes.get("error")
    s = _wait(api, job, "the new attempt restored", lambda s: s if s.get("attempt", 0) >= 1 and (s.get("restore") or {}).get("tier") else _terminal(s), 240, operator)
    after = s["placement"]["nodes"]
    restore = s.get("restore") or {}
    last = s.get("lastRestart") or {}
    pods_after = pod_names(api, job)
    s = _wait(api, job, "the job to finish", _terminal, 300, operator)
    before, victim = notes["before"], notes["victim"]
    kept = [n for n in notes["pods_before"] if n in pods_after]
    events = pod_events(local_cluster, job.namespace, kept[0]) if kept else []
    resumed = resumed_at(events, 1)
    t0 = notes["t_fail"]
    resumed_s = round(resumed[0] - t0, 2) if resumed else None
    new = [n for n in pods_after if n not in notes["pods_before"]]
    new_events = pod_events(local_cluster, job.namespace, new[0]) if new else []
    from railyard.logic.conditions import parse_time

    def at(events: list[dict[str, Any]], name: str, **match: Any) -> float | None:
        got = [e for e in events if e.get("event") == name and all(e.get(k) == v for k, v in match.items())]
        return round(float(got[0]["time"]) - t0, 2) if got else None

    told = parse_time(last.get("startedTime"))
    running = job.pods.get(new[0], ("", None))[1] if new else None
    timeline = {
        "operator_told_launchers": round(told - t0, 2) if told else None,
        "replacement_running": round(running - t0, 2) if running else None,
        "kept_workers_launched": at(events, "launch", attempt=1),
        "replacement_launched": at(new_events, "launch"),
        "process_group_up": (lambda r: r[-1] if r else None)([round(float(e["time"]) - t0, 2) for e in events if e.get("event") == "start"]),
        "restored": (lambda r: r[-1] if r else None)([round(float(e["time"]) - t0, 2) for e in events if e.get("event") == "restored"]),
        "first_step": resumed_s,
    }
    committed = notes["committed_at_fail"]
    _report("nodefail", failed_node=victim, step_at_fail=notes["step_at_fail"], committed_at_fail=committed, restore=restore,
            before=before, after=after,
            pods_before=notes["pods_before"], pods_after=pods_after, fail_to_resumed_s=resumed_s, timeline_s=timeline, last_restart=last,
            spares_held_before=notes.get("spares_held"), restarts=s["restarts"])
    # (an assert's message is built only when it fails: the pods' logs are read only then)
    assert s["phase"] == "Succeeded", f"{s.get('message')}\n{_post_mortem(local_cluster, job, operator)}"
    assert s["restarts"]["infrastructure"] == 1 and s["restarts"]["total"] == 1, f"{s['restarts']}\n{_post_mortem(local_cluster, job, operator)}"
    assert last.get("mode") == "InPlace" and last.get("replaced") == [1], f"{last}\n{_post_mortem(local_cluster, job, operator)}"
    assert len(kept) == 1 and kept[0].endswith("-0"), f"pod 0 is the same pod object: {notes['pods_before']} -> {pods_after}"
    assert after[0] == before[0] and after[1] in notes["spares"] and victim not in after, f"sticky on the spare: {before} -> {after}"
    assert notes.get("spares_held") == 1, "the spare was held by a placeholder before the failure"
    assert restore.get("tier") == "memory", f"resumes from the memory tier in the pods (the lost shard from pod 0's replica): {restore}"
    assert 0 <= restore["stepsLost"] <= MEMORY_INTERVAL, restore
    # Nothing committed before the failure is lost: the restore is that checkpoint or a newer one
    # (folded in from test_faults_end_to_end.py's node failure, which this test covers)
    assert restore["step"] >= committed and restore["step"] % MEMORY_INTERVAL == 0, (restore, committed)
    assert resumed is not None, "the kept pod's workers of attempt 1 trained"
    # how long from the failure to training resumed is reported above (``fail_to_resumed_s``),
    # not asserted: a speed target is a benchmark's (bench/inplace.py), and this machine's load
    # is not the test's to control


def _post_mortem(local_cluster: Any, job: Job, op: OperatorProcess) -> str:
    """What to read when the node failure did not go as planned: every gang pod's launcher
    events that say why workers ended (with their last words), and the operator's log tail."""
    lines = []
    for pod in sorted(job.pods):
        for e in pod_events(local_cluster, job.namespace, pod):
            if e.get("event") not in ("step", "checkpoint", "checkpoint_saved"):
                lines.append(f"{pod}: {json.dumps(e)[:600]}")
    return "\n".join(["pods' launcher events:", *lines, "operator log:", op.log_tail(40)])


def test_a_crashed_rank_restarts_every_pod_in_place(local_cluster: Any, api: Api, operator: OperatorProcess, jobs: dict[str, Job]) -> None:
    job = jobs["crash"]
    _started(jobs)
    s = _wait(api, job, "the job to finish", _terminal, 400, operator)
    assert job.watcher is not None
    job.watcher.join(30)
    names = sorted(job.pods)
    last = s.get("lastRestart") or {}
    _report("crash", restarts=s["restarts"], restore=s.get("restore"), pods=names, last_restart=last)
    assert s["phase"] == "Succeeded", s.get("message")
    assert s["restarts"]["application"] == 1 and s["restarts"]["total"] == 1, s["restarts"]
    assert last.get("mode") == "InPlace" and last.get("replaced") == [] and last.get("kept") == 2, last
    assert names == [f"{job.name}-a0-0", f"{job.name}-a0-1"], f"both pods kept, no pod created: {names}"
    for name in names:
        launches = [e for e in pod_events(local_cluster, job.namespace, name) if e.get("event") == "launch"]
        assert [e["attempt"] for e in launches] == [0, 1], f"{name}: one launcher ran both attempts: {launches}"
    assert (s.get("restore") or {}).get("tier") == "memory", s.get("restore")


def test_a_hang_replaces_the_hung_pod_and_restarts_the_rest_in_place(api: Api, operator: OperatorProcess, jobs: dict[str, Job]) -> None:
    job = jobs["hang"]
    _started(jobs)
    s = _wait(api, job, "the job to finish", _terminal, 400, operator)
    assert job.watcher is not None
    job.watcher.join(30)
    last = s.get("lastRestart") or {}
    quarantined = [q["node"] for q in s.get("quarantinedNodes") or []]
    _report("hang", restarts=s["restarts"], last_restart=last, quarantined=quarantined, pods=sorted(job.pods))
    assert s["phase"] == "Succeeded", s.get("message")
    assert s["restarts"]["straggler"] == 1 and "HangVerdict" in s["restarts"]["lastReason"], s["restarts"]
    assert last.get("mode") == "InPlace" and last.get("kept", 0) >= 1, last
    # what moved is exactly what the hang blamed (its node quarantined) or a straggler left behind
    created = sorted(n for n in job.pods if "-a1-" in n)
    assert len(created) == len(last.get("replaced") or []) and len(job.pods) == 2 + len(created), (sorted(job.pods), last)
    moved_nodes = {job.pods[n][0] for n in job.pods if "-a0-" in n and int(n.rsplit("-", 1)[1]) in (last.get("replaced") or [])}
    assert all(n in quarantined or n in last.get("message", "") for n in moved_nodes), (moved_nodes, quarantined, last)


def test_a_launcher_that_does_not_answer_falls_back_to_a_full_restart(api: Api, operator: OperatorProcess, jobs: dict[str, Job]) -> None:
    job = jobs["deaf"]
    _started(jobs)
    s = _wait(api, job, "the job to finish", _terminal, 400, operator)
    last = s.get("lastRestart") or {}
    reasons = [f"{e.reason}: {e.message}" for e in api.events(job.namespace, job.name)]
    _report("deaf", restarts=s["restarts"], last_restart=last, attempt=s.get("attempt"))
    assert s["phase"] == "Succeeded", s.get("message")
    assert s["restarts"]["total"] == 1, "one failure, one restart, whatever way it was done"
    assert last.get("mode") == "Full" and last.get("reason") == "RestartNotAnswered", last
    assert s["attempt"] == 2, "attempt 1 was the abandoned in-place restart"
    assert any(r.startswith("RestartNotAnswered") and "did not restart their workers within 10s" in r for r in reasons), reasons
