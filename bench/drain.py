"""Benchmark: `kubectl drain` of a node under a running job: planned moves, without them, and a node failure (issue 47).

The REAL trainer (``railyard-train``, tiny preset on the CPU) under the operator (``railyard
operator run`` in its own process, started as bench/inplace.py starts it) on the local cluster:
a job of 2 pods x 1 rank with a hot spare, every restart budget 0 (a move that spent one would
fail the job; 3 in the modes that lose a pod), in five modes, one after the other on one cluster:

- ``in_place``: no replica groups; the move waits for a just-in-time save to the memory tier, then
  restarts the gang in place with the drained node's pod on the spare, resumed from that save;
- ``replica_groups``: ``faultTolerance.mode: ReplicaGroups``, two groups of one pod; the group on
  the drained node first leaves the quorum at a step boundary, then is moved onto the spare and
  heals from the other group, which carries on;
- ``unplanned_in_place``: the behaviour before issue 47, the operator run with ``--no-planned-moves``:
  no PodDisruptionBudget, so the eviction passes at once and the job sees a pod deleted, a failure
  (a restart in place from the last memory checkpoint, one of the budget);
- ``failure_in_place`` and ``failure_replica_groups``: the same jobs as the first two, the node
  failed instead of drained (the local cluster's ``local.railyard.dev/fail``, as
  bench/replica_groups.py does): what the planned move saves, beside it.

The drain is done as ``kubectl drain`` does it, through the API: the node of pod 1 is cordoned once
the job has reached ``--drain-at`` steps, then every pod on it is evicted (the eviction API), again
every second while one is refused, until none is left (kubectl retries every 5 s; 1 s here only
sharpens the figure).
Everything else is read from what the run leaves behind: the pods' step events (``time``,
``step``, ``participants``, ``quorum_s``), ``replica_left``, the job's status. Per mode:

- rank-seconds lost: for each pod index whose rank 0 logs steps (one for the gang in place, one a
  group with ReplicaGroups), times the ranks it stands for, the waits between two new highest steps
  after the event (cordon or failure) longer than twice the median step time before it, less that
  median (a loaded machine's jitter is left out), summed; a moved group's time out counts;
- steps trained twice (target 0 for a planned move): for each pod index, step numbers its rank 0 logged more than
  once across the pod's attempts and replacements;
- restart budget spent (target 0 for a planned move) and planned moves (``status.restarts``);
- the drain's time, from the cordon until the eviction passed, and the evictions refused (429);
- in place (every mode): the gang's pause, from the last step before the move to the first step after it
  (save, restart, restore);
- replica groups: the survivors' failed steps (target 0 for a planned move); after a node failure the
  survivors' longest pause; after a planned move their pause when the moved group left
  (the time between the step the moved group left after, T, and the survivors' step T + 1, less
  the survivors' median step time before the drain) against the quorum change measured in that
  same step (``quorum_s``: the survivors' wait for their first quorum without the moved group):
  the target is one quorum change, at the resolution of one step (+ the median step time); and,
  for the record, their pause when the moved group came back (the step it healed at).

    python bench/drain.py [--steps 120] [--drain-at 10] [--modes in_place,...] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inplace import _prepare, start_operator, stop_operator
from jobs import jobs_path, wait_job
from provenance import write_results
from railyard.k8s.client import ApiError, Kube
from railyard_local import podlogs
from railyard_local.cluster import LocalCluster
from railyard_local.nodes import FAIL_ANNOTATION

#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "operator/railyard/handlers/planned.py",
    "operator/railyard/logic/planned.py",
    "operator/railyard/logic/jitsave.py",
    "operator/railyard/logic/groupleave.py",
    "operator/railyard/observe/control.py",
    "trainer_image/railyard_trainer/jitsave.py",
    "trainer_image/railyard_trainer/replicas.py",
    "trainer_image/railyard_trainer/inplace.py",
    "local_cluster/railyard_local",
)

ROOT = Path(__file__).resolve().parents[1]
NS = "bench-drain"
MODES = ("in_place", "replica_groups", "failure_in_place", "failure_replica_groups", "unplanned_in_place")
LABELS = {"in_place": "in place", "replica_groups": "replica groups", "unplanned_in_place": "unplanned, in place",
          "failure_in_place": "node failure, in place", "failure_replica_groups": "node failure, replica groups"}
#: The modes whose operator runs with planned moves off (and so no PodDisruptionBudget).
UNPLANNED = frozenset({"unplanned_in_place"})
#: The modes that fail the node instead of draining it.
FAILURE = frozenset({"failure_in_place", "failure_replica_groups"})
#: The job's ranks: 2 pods x 1 rank.
RANKS = 2
NO_BUDGET = {"limit": 0, "backoffSeconds": 0}
#: The modes that lose a pod spend the budget: 3 restarts of each kind, so the job lives to be measured.
SOME_BUDGET = {"limit": 3, "backoffSeconds": 0}
#: Upper bounds that only catch a hang.
START_S, RUN_S, DRAIN_S = 300.0, 420.0, 120.0


def job_spec(mode: str, *, steps: int, selector: dict[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodes": 2,
        "procsPerNode": 1,
        "nodeSelector": selector,
        "trainer": {"preset": "tiny", "steps": steps, "batchSize": 8, "seqLen": 64, "logEverySteps": 1, "seed": 0,
                    "collectiveTimeoutSeconds": 60, "watchdogSeconds": 40},
        "checkpoint": {"memory": {"intervalSteps": 5, "keep": 2}, "local": {"enabled": False},
                       "shared": {"intervalSteps": 1000, "keep": 1}},
        "health": {"heartbeatIntervalSeconds": 0.5, "heartbeatTimeoutSeconds": 20, "hangTimeoutSeconds": 10},
        "gang": {"hotSpares": 1, "scheduleTimeoutSeconds": 300},
        "restartPolicy": {k: dict(NO_BUDGET if mode in ("in_place", "replica_groups") else SOME_BUDGET)
                          for k in ("application", "infrastructure", "sdc", "straggler")},
    }
    if mode.endswith("replica_groups"):
        spec["parallelism"] = {"dataReplicas": 2}
        spec["faultTolerance"] = {"mode": "ReplicaGroups", "minReplicas": 1}
    return spec





async def _evict(kube: Kube, pod: str) -> int:
    """One eviction as ``kubectl drain`` asks it (no retry of a 429): the HTTP status."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": NS}}
    try:
        await kube.send("POST", f"/api/v1/namespaces/{NS}/pods/{pod}/eviction", body=body)
    except ApiError as exc:
        return exc.status
    return 201


async def run_job(kubeconfig: Path, name: str, spec: dict[str, Any], drain_at: int, mode: str) -> dict[str, Any]:
    """Create the job; drain (or fail, :data:`FAILURE`) the node of pod 1 once it has ``drain_at``
    steps; wait until it ends. Returns what the API showed and the drain's own times (the cordon,
    the eviction that passed) or the failure's."""
    kube = Kube.from_config(str(kubeconfig))
    victim, failed = "", False
    try:
        await kube.create(jobs_path(NS), {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob",
                                    "metadata": {"name": name, "namespace": NS}, "spec": spec})
        s = await wait_job(kube, NS, name, f"step {drain_at} with a memory checkpoint",
                        lambda s: s.get("phase") == "Running" and s.get("step", 0) >= drain_at
                        and any(c.get("tier") == "memory" for c in s.get("checkpoints") or []), START_S)
        victim = s["placement"]["nodes"][1]
        raw: dict[str, Any] = {"job": name, "victim_node": victim}
        if mode in FAILURE:
            failed = True
            raw["cordoned_at"] = raw["drained_at"] = time.time()  # the event: the failure, no drain
            raw["evictions"] = []
            await kube.patch(f"/api/v1/nodes/{victim}", {"metadata": {"annotations": {FAIL_ANNOTATION: "true"}}})
            s = await wait_job(kube, NS, name, "the end", lambda s: s.get("phase") in ("Succeeded", "Failed"),
                               START_S + RUN_S)
            raw["status"] = {k: s.get(k) for k in ("phase", "attempt", "restarts", "lastRestart", "restore")}
            return raw
        # the budget's status is the disruption controller's: a drain is refused once it counts the gang
        deadline = time.monotonic() + (0 if mode in UNPLANNED else 60)  # unplanned: no budget to wait for
        while time.monotonic() < deadline:
            pdb = await kube.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/{name}") or {}
            if (pdb.get("status") or {}).get("currentHealthy") == 2:
                break
            await asyncio.sleep(0.2)
        raw["cordoned_at"] = time.time()
        await kube.patch(f"/api/v1/nodes/{victim}", {"spec": {"unschedulable": True}})
        answers: list[tuple[str, int]] = []
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            left = [p["metadata"]["name"] for p in await kube.list(f"/api/v1/namespaces/{NS}/pods")
                    if (p.get("spec") or {}).get("nodeName") == victim and not p["metadata"].get("deletionTimestamp")]
            got = [(pod, await _evict(kube, pod)) for pod in left]
            answers += got
            if all(a in (201, 404) for _, a in got):
                break  # every pod on the node evicted (or gone): the drain is complete
            await asyncio.sleep(1.0)
        raw["drained_at"] = time.time()
        raw["evictions"] = answers
        s = await wait_job(kube, NS, name, "the end", lambda s: s.get("phase") in ("Succeeded", "Failed"), START_S + RUN_S)
        raw["status"] = {k: s.get(k) for k in ("phase", "attempt", "restarts", "lastRestart", "restore")}
        return raw
    finally:
        if failed:
            await kube.patch(f"/api/v1/nodes/{victim}", {"metadata": {"annotations": {FAIL_ANNOTATION: None}}})
        elif victim:
            await kube.patch(f"/api/v1/nodes/{victim}", {"spec": {"unschedulable": False}})
        await kube.delete(jobs_path(NS, name))
        await kube.close()


def pod_events(log_dir: Path, job: str) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """(attempt, pod index) -> the JSON events its containers printed (the node agent's logs)."""
    out: dict[tuple[int, int], list[dict[str, Any]]] = {}
    pat = re.compile(rf"^{re.escape(job)}-a(\d+)-(\d+)$")
    base = log_dir / NS
    for d in sorted(base.iterdir()) if base.exists() else []:
        m = pat.match(d.name)
        if m:
            out[(int(m.group(1)), int(m.group(2)))] = podlogs.pod_events(log_dir, NS, d.name)
    return out


def _of(events: dict[tuple[int, int], list[dict[str, Any]]], index: int, kind: str) -> list[dict[str, Any]]:
    """Events of one kind of every pod with ``index``, across attempts, in time order."""
    evs = [e for (_, i), es in events.items() if i == index for e in es if e.get("event") == kind]
    return sorted(evs, key=lambda e: float(e["time"]))


def _median_step_s(steps: list[dict[str, Any]], before: float) -> float:
    times = [float(e["time"]) for e in steps if float(e["time"]) < before]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return statistics.median(gaps) if gaps else 0.0


def measure(mode: str, raw: dict[str, Any], events: dict[tuple[int, int], list[dict[str, Any]]]) -> dict[str, Any]:
    restarts = raw["status"].get("restarts") or {}
    twice = 0
    for index in sorted({i for _, i in events}):
        numbers = [int(e["step"]) for e in _of(events, index, "step")]
        twice = max(twice, len(numbers) - len(set(numbers)))
    survivor = _of(events, 0, "step")
    median = _median_step_s(survivor, raw["cordoned_at"])
    indices = sorted({i for _, i in events})
    end = max((float(e["time"]) for i in indices for e in _of(events, i, "step")), default=0.0)  # the last step
    # the trainer's rank 0 logs the steps (each group's, with ReplicaGroups): its waits are those of
    # every rank it stands for (a gang in place waits as one; a group as one)
    logging = [i for i in indices if _of(events, i, "step")]
    per_log = RANKS / max(len(logging), 1)
    lost = per_log * sum(_lost_s(_of(events, i, "step"), raw["cordoned_at"], median, end) for i in logging)
    out: dict[str, Any] = {
        "phase": raw["status"].get("phase"),
        "steps_trained_twice": twice,
        "budget_spent": int(restarts.get("total", 0)),
        "planned_moves": int(restarts.get("planned", 0)),
        "drain_s": round(raw["drained_at"] - raw["cordoned_at"], 2),
        "evictions_refused": sum(1 for _, a in raw["evictions"] if a == 429),
        "median_step_s": round(median, 3),
        "rank_seconds_lost": round(lost, 1),
        "last_restart": (raw["status"].get("lastRestart") or {}).get("message", ""),
    }
    if mode.endswith("in_place"):
        # the gang's pause: the longest wait between two new highest steps on pod 0 after the cordon
        out["gang_pause_s"] = round(_longest_wait(survivor, raw["cordoned_at"]), 2)
        out["restored"] = raw["status"].get("restore")
        return out
    left = [int(e["step"]) for e in events.get((0, 1), []) if e.get("event") == "replica_left"]
    failed = [e for e in events.get((0, 0), []) if e.get("event") in ("step_not_committed", "replica_collective_failed")]
    out["survivor_failed_steps"] = len(failed)
    if mode in FAILURE:
        out["survivor_longest_pause_s"] = round(max(_longest_wait(survivor, raw["cordoned_at"]) - median, 0.0), 2)
    out["left_after_step"] = left[0] if left else None
    by_step = {int(e["step"]): e for e in survivor}
    if left and left[0] in by_step and left[0] + 1 in by_step:
        after = by_step[left[0] + 1]
        gap = float(after["time"]) - float(by_step[left[0]]["time"])
        out["survivor_pause_at_leave_s"] = round(max(gap - median, 0.0), 3)
        out["quorum_change_s"] = float(after.get("quorum_s", 0.0))
        out["participants_after_leave"] = after.get("participants")
    healed = [e for e in _of(events, 1, "replica_healed") if float(e["time"]) > raw["cordoned_at"]]
    if healed and int(healed[0]["to_step"]) + 1 in by_step and int(healed[0]["to_step"]) in by_step:
        k = int(healed[0]["to_step"])
        gap = float(by_step[k + 1]["time"]) - float(by_step[k]["time"])
        out["survivor_pause_at_rejoin_s"] = round(max(gap - median, 0.0), 3)
        out["healed_at_step"] = k
    return out


def _lost_s(steps: list[dict[str, Any]], since: float, median: float, end: float) -> float:
    """One rank's seconds lost after ``since``: each wait between two new highest steps longer
    than twice ``median``, less ``median`` (what that step would have taken); a wait still open at
    the job's ``end`` (a group that never came back before the others finished) runs until then."""
    lost, top, t_top = 0.0, -1, None
    for e in steps:
        t, k = float(e["time"]), int(e["step"])
        if k <= top:
            continue  # a step trained again: inside the wait for the next new one
        if t >= since and t_top is not None and t - t_top > 2 * median:
            lost += t - t_top - median  # a wait across the event counts whole: that step was lost too
        top, t_top = k, t
    if t_top is not None and end - t_top > 2 * median:
        lost += end - t_top - median
    return max(lost, 0.0)


def _longest_wait(steps: list[dict[str, Any]], since: float) -> float:
    best, top, t_top = 0.0, -1, None
    for e in steps:
        t, k = float(e["time"]), int(e["step"])
        if t < since:
            top, t_top = max(top, k), t
            continue
        if k > top:
            if t_top is not None:
                best = max(best, t - t_top)
            top, t_top = k, t
    return best


def rows(m: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def row(metric: str, value: Any, unit: str, target: Any, meets: bool | None) -> None:
        out.append({"metric": metric, "value": value, "unit": unit, "target": target, "meets": meets})

    for mode in MODES:
        r, label = m.get(mode), LABELS[mode]
        if r is None:
            continue
        planned = mode in ("in_place", "replica_groups")  # the targets are the planned move's

        def target(want: Any, value: Any, planned: bool = planned) -> tuple[Any, bool | None]:
            return (want, value == want) if planned else (None, None)

        ok = 1 if r["phase"] == "Succeeded" else 0
        row(f"{label}: job Succeeded", ok, "", *target(1, ok))
        what = "every planned move" if planned else "from the last memory checkpoint on"
        row(f"{label}: steps trained twice ({what})", r["steps_trained_twice"], "steps",
            *target(0, r["steps_trained_twice"]))
        row(f"{label}: restart budget spent", r["budget_spent"], "restarts", *target(0, r["budget_spent"]))
        row(f"{label}: planned moves", r["planned_moves"], "moves", *target(1, r["planned_moves"]))
        row(f"{label}: rank-seconds lost (waits > 2 median steps after the event)", r["rank_seconds_lost"],
            "rank-s", None, None)
        if mode not in FAILURE:
            row(f"{label}: drain completed after the cordon", r["drain_s"], "s", None, None)
            row(f"{label}: evictions refused (429) before that", r["evictions_refused"], "evictions", None, None)
        if mode.endswith("in_place"):
            why = "save, restart in place, restore" if planned else "restart in place from the last checkpoint"
            row(f"{label}: the gang's pause ({why})", r["gang_pause_s"], "s", None, None)
            continue
        row(f"{label}: survivors' failed steps", r["survivor_failed_steps"], "steps",
            *target(0, r["survivor_failed_steps"]))
        if mode in FAILURE:
            row(f"{label}: survivors' longest pause (less the median step)", r["survivor_longest_pause_s"], "s",
                None, None)
            continue
        pause, quorum = r.get("survivor_pause_at_leave_s"), r.get("quorum_change_s")
        if pause is not None and quorum is not None:
            bound = round(quorum + r["median_step_s"], 3)
            row(f"{label}: quorum change when the moved group left (survivors' quorum wait)", quorum, "s", None, None)
            row(f"{label}: survivors' pause when the moved group left (<= one quorum change, +1 step)", pause, "s",
                bound, pause <= bound)
        else:
            row(f"{label}: survivors' pause when the moved group left", None, "s", None, False)
        if r.get("survivor_pause_at_rejoin_s") is not None:
            row(f"{label}: survivors' pause when the moved group came back (healed)", r["survivor_pause_at_rejoin_s"],
                "s", None, None)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120, help="steps per run (default 120)")
    ap.add_argument("--drain-at", type=int, default=10, help="drain once the job has this many steps (default 10)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--smoke", action="store_true", help="the test suite's size: replica groups only, 60 steps")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "drain.json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.steps, args.modes = 60, "replica_groups"
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES) or not 0 < args.drain_at < args.steps - 20:
        ap.error(f"--modes: a subset of {MODES}; --drain-at: between 1 and --steps - 20")
    started = time.time()
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # the gang's 2 nodes, its spare, the Lighthouse's and one to spare (the drained node is
        # uncordoned after each run)
        nodes = 5
        cluster = LocalCluster(Path(tmp) / "cluster", nodes=nodes, gpus_per_node=2, topology="spine=1,leaf=2",
                               lease_interval=1.0, node_prefix="drb-")
        kubeconfig = cluster.start(timeout=120)
        op = None
        flags: tuple[str, ...] = ()
        try:
            asyncio.run(_prepare(kubeconfig, NS))
            op, _ = start_operator(kubeconfig, Path(tmp) / "operator.log", NS)
            print("local cluster and operator up", flush=True)
            # the modes of today's operator first, then those of one run with --no-planned-moves
            for mode in sorted(modes, key=lambda m: m in UNPLANNED):
                if mode in UNPLANNED and "--no-planned-moves" not in flags:
                    stop_operator(op)
                    op = None
                    flags = ("--no-planned-moves",)
                    op, _ = start_operator(kubeconfig, Path(tmp) / "operator.log", NS, extra=flags)
                    print("operator restarted with --no-planned-moves", flush=True)
                name = f"drb-{mode.replace('_', '')}"
                spec = job_spec(mode, steps=args.steps, selector=cluster.node_selector)
                raw = asyncio.run(run_job(kubeconfig, name, spec, args.drain_at, mode))
                measured[mode] = measure(mode, raw, pod_events(cluster.log_dir, name))
                print(f"{mode}: {json.dumps(measured[mode])}", flush=True)
        except BaseException:
            if op is not None:
                tail = (Path(tmp) / "operator.log").read_text(errors="replace").splitlines()[-40:]
                print("--- operator log ---\n" + "\n".join(tail), file=sys.stderr)
            raise
        finally:
            if op is not None:
                stop_operator(op)
            cluster.stop()
    results = rows(measured)
    print(f"\n{'metric':<90}{'value':>10}  {'unit':<10}{'target':>8}  meets")
    for r in results:
        t = "" if r["target"] is None else str(r["target"])
        meets = "" if r["meets"] is None else ("yes" if r["meets"] else "NO")
        print(f"{r['metric']:<90}{r['value']!s:>10}  {r['unit']:<10}{t:>8}  {meets}")
    doc = {
        "bench": "drain",
        "conditions": {
            "modes": modes, "steps": args.steps, "drain_at": args.drain_at,
            "job": "2 pods x 1 rank, tiny preset, CPU (gloo), batch 8, seq 64, memory checkpoints every 5 steps, "
                   "1 hot spare, every restart budget 0 (3 in the unplanned and failure modes)",
            "drain": "cordon, then the eviction API for every pod on the node, every 1 s until none is refused",
            "failure": f"the node annotated {FAIL_ANNOTATION}=true (the local cluster's node failure)",
            "unplanned": "the operator run with --no-planned-moves (no planned moves, no PodDisruptionBudget)",
            "cluster": f"local cluster, embedded API server, {nodes} nodes",
            "seconds": round(time.time() - started, 1),
            "load_average_1m_at_end": round(os.getloadavg()[0], 1), "cpus": os.cpu_count(),
        },
        "results": results,
        "raw": measured,
    }
    write_results(args.out, doc, MEASURES, indent=1)
    print(f"wrote {args.out}")
    return 1 if any(r["meets"] is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
