"""End to end on the local cluster with the REAL trainer: each fault the system claims to handle
is injected into its own job, all jobs run in parallel on one cluster and one operator, and each
test checks what the operator did about it (status, restarts, quarantine, restore) and how fast.

Jobs and their node pools (nodeSelector on a pool label, so a slowed, failed or quarantined node
never touches another job):

| job | pool | fault |
|---|---|---|
| straggler | a (2 nodes) | pod 1's node slowed (``local.railyard.dev/slow-factor`` 1.3) from step 20, pod 0's never |
| sdc | d (4 nodes) | ``bitflip`` grad on rank 1 at step 12 (attempt 0), param on rank 0 at step 32 (attempt 1) |

A real crash, a real hang and a failed node (sticky on the hot spare, resumed from the memory
tier) through the launcher and heartbeats are tests/system/test_in_place_restart.py's (the node
failure with the pods' memory medium); tests/system/test_your_own_program_on_the_local_cluster.py
fails a node under the SDK with the node's memory medium. What the operator decides about them is
in-process (tests/operator/test_reconcile_state_machine.py, tests/health/test_detecting_dead_and_hung_ranks.py).

Measured numbers are printed (``-s``) and kept in ``RESULTS`` for the report.
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
    unique,
    wait_status,
)

from railyard.logic.health.model import HealthPolicy

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(420)]

POOL = "e2e.railyard.dev/pool"
POOLS = {"a": 2, "d": 4}
#: Set when the module's jobs are done with: the watchers stop polling the API server (a given
#: one outlives the module; nothing of the module should still be talking to it then).
STOP = threading.Event()
SLOW = "local.railyard.dev/slow-factor"
SLOW_FROM = 20
SLOW_FACTOR = 1.3
PARAM_FLIP = 32
STRAGGLER_STEPS = 70
RESULTS: dict[str, dict[str, Any]] = {}


@dataclass
class Job:
    name: str
    spec: dict[str, Any]
    #: every distinct status seen by the watcher (phase, attempt, step, stragglers)
    notes: dict[str, Any] = field(default_factory=dict)
    watcher: threading.Thread | None = None
    #: attempt -> the first status.restore it showed
    restores: dict[int, dict[str, Any]] = field(default_factory=dict)


def _terminal(s: dict[str, Any]) -> dict[str, Any] | None:
    return s if s.get("phase") in ("Succeeded", "Failed") else None


@pytest.fixture(scope="module")
def jobs(local_cluster: Any, api: Api, operator: OperatorProcess) -> Iterator[dict[str, Job]]:
    """The fault jobs, all at once; the straggler job starts when they are done
    (:func:`quiet_jobs`)."""
    nodes = cluster_nodes(local_cluster)
    need = sum(POOLS.values())
    assert len(nodes) >= need, f"the system cluster has {len(nodes)} nodes, the pools need {need}"
    i = 0
    for pool, count in POOLS.items():
        for n in nodes[i:i + count]:
            api.core.patch_node(n, {"metadata": {"labels": {POOL: pool}}})
        i += count

    out = {
        "sdc": make("sdc", "d", trainer={"steps": 45, "faults": [
            {"kind": "bitflip", "target": "grad", "rank": 1, "step": 12, "attempt": 0},
            {"kind": "bitflip", "target": "param", "rank": 0, "step": PARAM_FLIP, "attempt": 1},
        ]}),
    }
    for job in out.values():
        api.create_job(SYSTEM_NS, job.name, job.spec)
    for job in out.values():  # every restore each attempt shows, from the start
        job.watcher = threading.Thread(target=_watch_restores, args=(api, job), daemon=True)
        job.watcher.start()
    yield out
    STOP.set()
    for job in out.values():
        if job.watcher is not None:
            job.watcher.join(10)


def _watch_restores(api: Api, job: Job) -> None:
    """Record ``status.restore`` per attempt until the job ends (the first one it shows)."""
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and not STOP.is_set():
        try:
            s = api.status(SYSTEM_NS, job.name)
        except Exception:  # an API hiccup: try again
            time.sleep(0.2)
            continue
        r, attempt = s.get("restore") or {}, int(s.get("attempt", 0))
        if r.get("tier") and attempt >= 1 and r not in job.restores.values():
            job.restores.setdefault(attempt, dict(r))
        if _terminal(s):
            return
        time.sleep(0.1)


def make(kind: str, pool: str, **overrides: Any) -> Job:
    return Job(unique(kind), base_spec(nodeSelector={POOL: pool}, **overrides))


def straggler_job(kind: str, pool: str, **trainer: Any) -> Job:
    """A job for the straggler tests. The straggler rule is the default one (threshold 0.9, its
    window from BASE): the speed probe is timed in device time (speed_probe.py), which neither
    this machine's other work nor its host's noise enters, so nothing needs widening. Longer
    steps (seqLen 256, unless ``trainer`` says otherwise) keep the heartbeat delay, counted in
    steps, small."""
    return make(kind, pool, trainer={"seqLen": 256, **trainer})


@pytest.fixture(scope="module")
def quiet_jobs(api: Api, operator: OperatorProcess, jobs: dict[str, Job]) -> dict[str, Job]:
    """The straggler job, once the fault jobs are done (its verdicts do not depend on the
    machine's load; its step counts do). It is the clean run too: its pod 0 is never slowed, and
    its pod 1 not before step 20, so a flag of anything else is a false one (a clean job of its
    own, 200 steps of 2 more pods, cost the module about a quarter of its CPU)."""
    for job in jobs.values():
        wait_status(api, job.name, "the fault jobs to end first", _terminal, 400, operator)
    out = {"straggler": straggler_job("straggler", "a", steps=STRAGGLER_STEPS)}
    for job in out.values():
        api.create_job(SYSTEM_NS, job.name, job.spec)
        job.watcher = threading.Thread(target=_watch_flags, args=(api, job), daemon=True)
        job.watcher.start()
    return out


def _watch_flags(api: Api, job: Job) -> None:
    """Record every straggler flag the job's status shows, with its step (``notes["flags"]``),
    and the highest step (``notes["max_step"]``), from its start until it ends."""
    flags: list[tuple[int, int, str]] = job.notes.setdefault("flags", [])
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and not STOP.is_set():
        try:
            s = api.status(SYSTEM_NS, job.name)
        except Exception:  # an API hiccup: try again
            time.sleep(0.2)
            continue
        step = int(s.get("step", 0))
        job.notes["max_step"] = max(job.notes.get("max_step", 0), step)
        flags.extend((step, int(f["rank"]), str(f["node"])) for f in s.get("stragglers") or [])
        if _terminal(s):
            return
        time.sleep(0.2)


def _metric(op: OperatorProcess, name: str, **labels: str) -> float | None:
    from prometheus_client.parser import text_string_to_metric_families

    total = None
    for fam in text_string_to_metric_families(op.metrics_text()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total = (total or 0.0) + s.value
    return total


def _report(name: str, **values: Any) -> None:
    RESULTS.setdefault(name, {}).update(values)
    print(f"\n[system] {name}: " + json.dumps(values))


def test_a_bit_flip_restarts_with_sdc_quarantines_and_resumes_before_the_flip(api: Api, operator: OperatorProcess, jobs: dict[str, Job]) -> None:
    job = jobs["sdc"]
    s = wait_status(api, job.name, "the job to finish", _terminal, 300, operator)
    assert job.watcher is not None
    job.watcher.join(30)
    restores = job.restores
    quarantined = [q["node"] for q in s.get("quarantinedNodes") or []]
    events = [f"{e.reason}: {e.message}" for e in api.events(SYSTEM_NS, job.name) if e.reason in ("SilentDataCorruption", "NodeQuarantined")]
    _report("sdc", restores=restores, restarts=s["restarts"], quarantined=quarantined, events=events)
    assert s["phase"] == "Succeeded", s.get("message")
    r = s["restarts"]
    assert r["sdc"] == 2 and r["total"] == 2, f"both flips (grad, then param) restart with class SDC: {r}"
    assert sorted(restores) == [1, 2], f"each new attempt restored from a checkpoint: {restores}"
    assert 0 <= restores[1]["step"] < 12, f"grad flip at step 12, restored {restores[1]}"
    assert restores[1]["step"] < restores[2]["step"] < PARAM_FLIP, f"param flip at step {PARAM_FLIP}, restored {restores[2]}"
    assert len(set(quarantined)) == 2, f"each flip quarantines its (one) node: {quarantined}"
    for n in quarantined:
        assert (api.node(n).metadata.labels or {}).get("railyard.dev/quarantined") == "true"


def test_checkpoint_and_goodput_metrics_reach_the_operator(api: Api, operator: OperatorProcess, jobs: dict[str, Job]) -> None:
    for job in jobs.values():
        wait_status(api, job.name, "the fault jobs to end", _terminal, 300, operator)
    saves = _metric(operator, "railyard_checkpoint_save_seconds_count", tier="memory")
    blocked = _metric(operator, "railyard_checkpoint_blocked_seconds_sum", tier="memory")
    restores = _metric(operator, "railyard_checkpoint_restores_total", tier="memory")
    lost_n = _metric(operator, "railyard_restart_steps_lost_count")
    written = _metric(operator, "railyard_checkpoint_written_bytes_total", job=jobs["sdc"].name, tier="memory")
    goodput = {k: _metric(operator, "railyard_job_goodput_ratio", job=j.name) for k, j in jobs.items()}
    _report("metrics", memory_saves=saves, memory_blocked_s_sum=blocked, memory_restores=restores, restarts_with_steps_lost=lost_n,
            sdc_memory_bytes=written, goodput=goodput)
    assert saves and saves >= 4 and blocked is not None and blocked > 0
    assert restores and restores >= 2, "the two bit flips each restored from memory"
    assert lost_n and lost_n >= 2
    assert written and written > 0
    for kind, value in goodput.items():
        assert value is not None and 0.0 < value <= 1.0, (kind, value)


def test_a_rank_slowed_1_3x_is_flagged_within_20_steps_and_nothing_restarts(api: Api, operator: OperatorProcess, quiet_jobs: dict[str, Job]) -> None:
    # The real mechanism: the node of pod 1 is throttled (local.railyard.dev/slow-factor). Its
    # simulated device becomes 1.3x slower (the node agent publishes it; the trainer's speed
    # probe does 1.3x the work in device time, as a throttled GPU takes longer for the same
    # work) and its processes run 1/1.3 of the time (a SIGSTOP/SIGCONT duty cycle, so the
    # whole gang slows, as it would). The probe is collective-free: forward/backward time would
    # not name the rank, since under FSDP the healthy peer waits inside its own forward/backward.
    job = quiet_jobs["straggler"]
    seen_before: list[Any] = []

    def reached_slow_step(s: dict[str, Any]) -> dict[str, Any] | None:
        seen_before.extend(s.get("stragglers") or [])
        return s if s.get("phase") == "Running" and int(s.get("step", 0)) >= SLOW_FROM else _terminal(s)

    s = wait_status(api, job.name, f"step {SLOW_FROM}", reached_slow_step, 300, operator)
    assert s.get("phase") == "Running", f"the job ended before step {SLOW_FROM}: {s.get('phase')}"
    slow_node = s["placement"]["nodes"][1]
    job.notes["slow_node"] = slow_node
    api.annotate_node(slow_node, {SLOW: str(SLOW_FACTOR)})
    slowed_at = int(api.status(SYSTEM_NS, job.name).get("step", 0))
    # Once every step of the score's window is slow, the score is the slow-down itself. At the
    # first flag it need not be: the window may still hold steps from before (the status's step
    # lags the trainer's, so the slowdown began after `slowed_at`), and its median then sits
    # between the two speeds. The margin covers that lag.
    window = HealthPolicy.from_spec(job.spec.get("health")).straggler_window_steps
    full_window = slowed_at + window + 10
    try:
        s = wait_status(api, job.name, "a straggler flagged", lambda s: s if s.get("stragglers") else _terminal(s), 300, operator)
        first = s
        if s.get("stragglers"):
            s = wait_status(api, job.name, f"a window of slow steps (step {full_window})",
                            lambda s: s if int(s.get("step", 0)) >= full_window else _terminal(s), 300, operator)
    finally:
        api.annotate_node(slow_node, {SLOW: None})
    flagged = first.get("stragglers") or []
    steps = int(first.get("step", 0)) - slowed_at
    _report("straggler", slowed_node=slow_node, slow_factor=SLOW_FACTOR, slowed_at_step=slowed_at, flagged_after_steps=steps,
            stragglers=flagged, full_window_status=s.get("stragglers"))
    assert not seen_before, f"flagged before any slowdown: {seen_before}"
    assert flagged, f"not flagged before the job ended: {first.get('phase')} at step {first.get('step')}"
    assert [(f["rank"], f["node"]) for f in flagged] == [(1, slow_node)], f"rank 1 and its node must be the ones named: {flagged}"
    assert steps <= 20, f"flagged {steps} steps after the slowdown (bound 20)"
    # the score is the slow-down itself: the probe's 16 products became round(16 x 1.3) = 21
    assert s.get("phase") == "Running" and int(s.get("step", 0)) >= full_window, f"the job ended first: {s.get('phase')} at step {s.get('step')}"
    slow = s.get("stragglers") or []
    assert [(f["rank"], f["node"]) for f in slow] == [(1, slow_node)], f"still flagged while slow: {slow}"
    assert slow[0]["score"] == pytest.approx(16 / 21, abs=0.05), slow
    s = wait_status(api, job.name, "the job to finish", _terminal, 300, operator)
    assert s["phase"] == "Succeeded" and s["restarts"]["total"] == 0, "action Report must not restart"


def test_a_rank_never_slowed_is_never_flagged(api: Api, operator: OperatorProcess, quiet_jobs: dict[str, Job]) -> None:
    """The clean run: the straggler job's pod 0 never runs slowed, its pod 1 only once the test
    above throttles its node (``notes["slow_node"]``; never if that test did not run). Over the
    whole run no other rank and no other node is flagged, and the job runs to its last step with
    no restart."""
    job = quiet_jobs["straggler"]
    s = wait_status(api, job.name, "the straggler job to finish", _terminal, 400, operator)
    assert job.watcher is not None
    job.watcher.join(30)
    flags, slow_node = job.notes.get("flags", []), job.notes.get("slow_node")
    counted = _metric(operator, "railyard_stragglers_flagged_total", job=job.name) or 0
    _report("clean", steps=s.get("step"), slow_node=slow_node, flags_seen=len(flags), flagged_total=counted,
            restarts=s["restarts"]["total"])
    assert s["phase"] == "Succeeded", s.get("message")
    max_step = job.notes.get("max_step")
    assert s["step"] == STRAGGLER_STEPS and max_step == STRAGGLER_STEPS, (s.get("step"), max_step)
    false = [f for f in flags if slow_node is None or (f[1], f[2]) != (1, slow_node)]
    assert not false, f"flagged though never slowed (step, rank, node): {false}"
    assert s["restarts"]["total"] == 0
    # the operator's counter agrees: nothing when nothing was slowed, the slowed rank's flag otherwise
    assert (counted == 0) if slow_node is None else (counted >= 1), (counted, slow_node)
