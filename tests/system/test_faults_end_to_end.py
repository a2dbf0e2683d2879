"""End to end on the local cluster with the REAL trainer: each fault the system claims to handle
is injected into its own job, all jobs run in parallel on one cluster and one operator, and each
test checks what the operator did about it (status, restarts, quarantine, restore) and how fast.

Jobs and their node pools (nodeSelector on a pool label, so a slowed, failed or quarantined node
never touches another job):

| job | pool | fault |
|---|---|---|
| straggler | a (2 nodes) | pod 1's node slowed (``local.railyard.dev/slow-factor`` 1.3) from step 20 |
| clean | b (2 nodes) | none: nothing may be flagged |
| sdc | d (4 nodes) | ``bitflip`` grad on rank 1 at step 12 (attempt 0), param on rank 0 at step 32 (attempt 1) |
| nodefail | e (3 nodes, 1 hot spare) | ``local.railyard.dev/fail=true`` on pod 1's node after step 13 |

A real crash and a real hang through the launcher and heartbeats are tests/system/
test_in_place_restart.py's; what the operator decides about them is in-process
(tests/operator/test_reconcile_state_machine.py, tests/health/test_detecting_dead_and_hung_ranks.py).

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
    BASE,
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
POOLS = {"a": 2, "b": 2, "d": 4, "e": 3}
#: Set when the module's jobs are done with: the watchers stop polling the API server (a given
#: one outlives the module; nothing of the module should still be talking to it then).
STOP = threading.Event()
SLOW = "local.railyard.dev/slow-factor"
FAIL = "local.railyard.dev/fail"
MEMORY_INTERVAL = 5
SLOW_FROM = 20
SLOW_FACTOR = 1.3
PARAM_FLIP = 32
CLEAN_STEPS = 200
RESULTS: dict[str, dict[str, Any]] = {}


@dataclass
class Job:
    name: str
    spec: dict[str, Any]
    #: every distinct status seen by the watcher (phase, attempt, step, stragglers)
    notes: dict[str, Any] = field(default_factory=dict)
    driver: threading.Thread | None = None
    watcher: threading.Thread | None = None
    #: attempt -> the first status.restore it showed
    restores: dict[int, dict[str, Any]] = field(default_factory=dict)


def _terminal(s: dict[str, Any]) -> dict[str, Any] | None:
    return s if s.get("phase") in ("Succeeded", "Failed") else None


@pytest.fixture(scope="module")
def jobs(local_cluster: Any, api: Api, operator: OperatorProcess) -> Iterator[dict[str, Job]]:
    """The fault jobs, all at once; the straggler and clean jobs start when they are done
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
        # 60 steps: the node fails once the status says step 13, as in test_in_place_restart.py's
        # node failure; the 47 steps after it are the margin for the status's lag (150 before)
        "nodefail": make("nodefail", "e", trainer={"steps": 60}, gang={"scheduleTimeoutSeconds": 180, "hotSpares": 1}),
    }
    for job in out.values():
        api.create_job(SYSTEM_NS, job.name, job.spec)
    for job in out.values():  # every restore each attempt shows, from the start
        job.watcher = threading.Thread(target=_watch_restores, args=(api, job), daemon=True)
        job.watcher.start()
    driver = threading.Thread(target=_fail_a_node_mid_run, args=(api, out["nodefail"]), daemon=True)
    driver.start()
    out["nodefail"].driver = driver
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


def _fail_a_node_mid_run(api: Api, job: Job) -> None:
    """Runs beside the other tests: once the job is past step 13 with a memory checkpoint, fail
    the node of pod 1 (``local.railyard.dev/fail=true``) and note what the status said then."""
    try:
        s = wait_status(api, job.name, "a memory checkpoint and step 13",
                        lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 13 and any(c["tier"] == "memory" for c in s.get("checkpoints") or []) else _terminal(s),
                        240)
        if s.get("phase") != "Running":
            job.notes["error"] = f"the job ended before the node could fail: {s.get('phase')} at step {s.get('step')}"
            return
        victim = s["placement"]["nodes"][1]
        committed = max(c["step"] for c in s.get("checkpoints") or [] if c["tier"] == "memory")
        api.annotate_node(victim, {FAIL: "true"})
        job.notes.update(t_fail=time.time(), before=s["placement"]["nodes"], spares=s["placement"]["spares"], victim=victim,
                         committed_at_fail=committed, step_at_fail=int(api.status(SYSTEM_NS, job.name).get("step", 0)))
    except Exception as exc:  # reported by the test
        job.notes["error"] = repr(exc)


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
    """The straggler and clean jobs, together, each on its own pool, once the fault jobs are done
    (their verdicts do not depend on the machine's load; their step counts do, and 16 ranks on
    2 cores would make the 200-step clean run long)."""
    for job in jobs.values():
        wait_status(api, job.name, "the fault jobs to end first", _terminal, 400, operator)
    out = {
        "straggler": straggler_job("straggler", "a", steps=70),
        # BASE's shorter steps: the clean run measures no delay, and the probe (what the rule
        # judges) is the same work at any step length: cheaper steps, the same verdict (alone, the
        # module took 20 s and about 10% of its CPU less)
        "clean": straggler_job("clean", "b", steps=CLEAN_STEPS, seqLen=BASE["trainer"]["seqLen"]),
    }
    for job in out.values():
        api.create_job(SYSTEM_NS, job.name, job.spec)
    return out


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


def test_a_failed_node_restarts_sticky_on_the_spare_from_the_memory_tier(api: Api, operator: OperatorProcess, jobs: dict[str, Job]) -> None:
    job = jobs["nodefail"]
    assert job.driver is not None
    job.driver.join(300)
    notes = job.notes
    assert "error" not in notes, notes.get("error")
    assert notes["spares"], "hotSpares: 1 holds a spare"
    s = wait_status(api, job.name, "the new gang restored", lambda s: s if s.get("attempt", 0) >= 1 and (s.get("restore") or {}).get("tier") else _terminal(s), 240, operator)
    t_restored = time.time()
    after = s["placement"]["nodes"]
    restore = s.get("restore") or {}
    s = wait_status(api, job.name, "the job to finish", _terminal, 300, operator)
    before, victim, spares = notes["before"], notes["victim"], notes["spares"]
    _report("nodefail", failed_node=victim, step_at_fail=notes["step_at_fail"], committed_at_fail=notes["committed_at_fail"],
            restore=restore, before=before, after=after,
            fail_to_restored_s=round(t_restored - notes["t_fail"], 1), restarts=s["restarts"])
    assert s["phase"] == "Succeeded", s.get("message")
    assert s["restarts"]["infrastructure"] == 1 and s["restarts"]["total"] == 1, s["restarts"]
    assert after[0] == before[0] and after[1] in spares and victim not in after, f"sticky on the spare: {before} -> {after}"
    assert restore.get("tier") == "memory", f"resumes from the memory tier (the lost shard from its replica): {restore}"
    # Nothing committed before the failure is lost: the restore is that checkpoint or a newer
    # one. (How many steps that loses depends on whether the next save was still in flight when
    # the node died, i.e. on timing: up to one interval plus the save's own steps.)
    assert restore["step"] >= notes["committed_at_fail"], (restore, notes["committed_at_fail"])
    assert restore["step"] % MEMORY_INTERVAL == 0 and restore["stepsLost"] >= 0, restore


def test_checkpoint_and_goodput_metrics_reach_the_operator(api: Api, operator: OperatorProcess, jobs: dict[str, Job]) -> None:
    for job in jobs.values():
        wait_status(api, job.name, "the fault jobs to end", _terminal, 300, operator)
    saves = _metric(operator, "railyard_checkpoint_save_seconds_count", tier="memory")
    blocked = _metric(operator, "railyard_checkpoint_blocked_seconds_sum", tier="memory")
    restores = _metric(operator, "railyard_checkpoint_restores_total", tier="memory")
    lost_n = _metric(operator, "railyard_restart_steps_lost_count")
    written = _metric(operator, "railyard_checkpoint_written_bytes_total", job=jobs["nodefail"].name, tier="memory")
    goodput = {k: _metric(operator, "railyard_job_goodput_ratio", job=j.name) for k, j in jobs.items()}
    _report("metrics", memory_saves=saves, memory_blocked_s_sum=blocked, memory_restores=restores, restarts_with_steps_lost=lost_n,
            nodefail_memory_bytes=written, goodput=goodput)
    assert saves and saves >= 4 and blocked is not None and blocked > 0
    assert restores and restores >= 3, "two bit flips and the node failure each restored from memory"
    assert lost_n and lost_n >= 3
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


def test_a_clean_run_flags_nothing(api: Api, operator: OperatorProcess, quiet_jobs: dict[str, Job]) -> None:
    job = quiet_jobs["clean"]
    flagged: list[Any] = []
    max_step = 0

    def watch(s: dict[str, Any]) -> dict[str, Any] | None:
        nonlocal max_step
        flagged.extend(s.get("stragglers") or [])
        max_step = max(max_step, int(s.get("step", 0)))
        return _terminal(s)

    s = wait_status(api, job.name, "the clean job to finish", watch, 400, operator)
    _report("clean", steps=s.get("step"), stragglers_seen=len(flagged), restarts=s["restarts"]["total"])
    assert s["phase"] == "Succeeded", s.get("message")
    assert s["step"] == CLEAN_STEPS and max_step == CLEAN_STEPS
    assert not flagged, f"a clean run flagged {flagged}"
    assert s["restarts"]["total"] == 0
    assert (_metric(operator, "railyard_stragglers_flagged_total", job=job.name) or 0) == 0
