"""The seeded failure trace both policies live through.

Each cause is a Poisson process with the rate of its Llama 3 count (scaled by GPUs and
``failure_scale``). Every cause draws from its own random stream, and a scaled-down trace is a
thinning of a stream ``MAX_FAILURE_SCALE`` times denser, so the trace at a lower scale is a
subset of the trace at a higher one (what the monotonicity tests rely on). Random draws a policy
may need later (heartbeat phase, how long an unchecked corruption stays hidden) are attached to
the event, so the two policies see the same luck.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from railyard.sim.model import MAX_FAILURE_SCALE, PLANNED_CAUSE, STRAGGLER_CAUSE, Cause, Scenario

EventKind = Literal["fault", "sdc", "straggler", "planned"]
Scope = Literal["node", "leaf"]
#: The Table 5 cause of which ``Scenario.switch_fraction`` takes a whole leaf.
SWITCH_CAUSE = "Network switch/cable"


@dataclass(frozen=True, slots=True)
class Event:
    #: Index in the trace (events are sorted by time, then index).
    id: int
    time: float
    kind: EventKind
    cause: Cause
    #: Pod index (slot of the gang) the event hits.
    pod: int
    #: The earlier hardware event on the same pod this one repeats (-1: none).
    repeat_of: int = -1
    #: For a straggler's final hard failure: the straggler event's id (-1: none).
    straggler_of: int = -1
    #: Uniform draws in [0, 1) for the policies' phases and latencies.
    u1: float = 0.5
    u2: float = 0.5
    #: What the fault takes: the node, or every node under its leaf switch (a correlated failure,
    #: ``Scenario.switch_fraction`` of the network switch/cable faults).
    scope: Scope = "node"


def _poisson_times(rng: random.Random, rate_per_s: float, horizon_s: float) -> list[float]:
    out: list[float] = []
    if rate_per_s <= 0:
        return out
    t = rng.expovariate(rate_per_s)
    while t < horizon_s:
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def _stream(scn: Scenario, key: str) -> random.Random:
    return random.Random(f"railyard-sim:{scn.seed}:{key}")


def cause_rate_per_s(scn: Scenario, cause: Cause) -> float:
    """Interruptions per second of ``cause`` at this scenario's size and scale."""
    if cause.detect == "sdc" and scn.sdc_per_day is not None:
        base = scn.sdc_per_day / 86400.0
    else:
        base = cause.count / (scn.reference_days * 86400.0) * scn.gpus / scn.reference_gpus
    return base * scn.failure_scale


def generate_trace(scn: Scenario) -> tuple[Event, ...]:
    """All events of the run, sorted by time. Deterministic for a scenario (seed included)."""
    horizon = scn.wall_s
    raw: list[tuple[float, str, EventKind, Cause, int, bool, float, float, int]] = []
    leaf_faults: set[tuple[float, str]] = set()
    keep_p = scn.failure_scale / MAX_FAILURE_SCALE
    for cause in scn.causes:
        rng = _stream(scn, cause.name)
        # a stream of its own, one draw per dense event: the other draws (and the traces at a
        # lower failure scale, subsets of this one) are the same with or without leaf faults
        scope_rng = _stream(scn, f"{cause.name}:scope")
        dense = (
            cause_rate_per_s(scn, cause) / scn.failure_scale * MAX_FAILURE_SCALE
            if scn.failure_scale > 0
            else 0.0
        )
        for t in _poisson_times(rng, dense, horizon):
            kept = rng.random() < keep_p
            pod = rng.randrange(scn.nodes)
            repeat = rng.random() < scn.repeat_fraction
            u1, u2 = rng.random(), rng.random()
            leaf = cause.name == SWITCH_CAUSE and scope_rng.random() < scn.switch_fraction
            if kept:
                kind: EventKind = "sdc" if cause.detect == "sdc" else "fault"
                raw.append((t, cause.name, kind, cause, pod, repeat and cause.hardware and not leaf, u1, u2, -1))
                if leaf:
                    leaf_faults.add((t, cause.name))
    rng = _stream(scn, "planned")
    for t in _poisson_times(rng, scn.planned / (scn.reference_days * 86400.0), horizon):
        raw.append(
            (
                t,
                PLANNED_CAUSE.name,
                "planned",
                PLANNED_CAUSE,
                0,
                False,
                rng.random(),
                rng.random(),
                -1,
            )
        )
    rng = _stream(scn, "straggler")
    for n, t in enumerate(_poisson_times(rng, scn.stragglers_per_day / 86400.0, horizon)):
        pod = rng.randrange(scn.nodes)
        lead = (
            rng.expovariate(1.0 / (scn.straggler_lead_h * 3600.0))
            if scn.straggler_lead_h > 0
            else 0.0
        )
        u1, u2 = rng.random(), rng.random()
        raw.append((t, STRAGGLER_CAUSE.name, "straggler", STRAGGLER_CAUSE, pod, False, u1, u2, n))
        if t + lead < horizon:
            raw.append(
                (
                    t + lead,
                    STRAGGLER_CAUSE.name,
                    "fault",
                    STRAGGLER_CAUSE,
                    pod,
                    False,
                    u1,
                    u2,
                    -2 - n,
                )
            )
    raw.sort(key=lambda r: (r[0], r[1], r[4]))

    events: list[Event] = []
    last_hw_on: dict[int, int] = {}
    last_hw: int = -1
    straggler_ids: dict[int, int] = {}
    for i, (t, _name, kind, cause, pod, repeat, u1, u2, tag) in enumerate(raw):
        repeat_of = -1
        if repeat and last_hw >= 0:
            # a bad node put back into service: the same pod slot as the most recent hardware fault
            pod = events[last_hw].pod
            repeat_of = last_hw_on.get(pod, -1)
        straggler_of = -1
        if kind == "straggler":
            straggler_ids[tag] = i
        elif tag <= -2:
            straggler_of = straggler_ids.get(-2 - tag, -1)
        scope: Scope = "leaf" if (t, _name) in leaf_faults else "node"
        ev = Event(i, t, kind, cause, pod, repeat_of, straggler_of, u1, u2, scope)
        events.append(ev)
        if cause.hardware and kind in ("fault", "sdc") and scope == "node":
            last_hw_on[pod] = i
            last_hw = i
    return tuple(events)


def expected_interruptions(scn: Scenario) -> float:
    """Mean number of unexpected interruptions in the run (Table 5 causes only)."""
    return sum(cause_rate_per_s(scn, c) for c in scn.causes) * scn.wall_s


def exp_from_uniform(u: float, mean: float) -> float:
    """An exponential draw of ``mean`` from a uniform ``u`` in [0, 1)."""
    return -math.log(1.0 - u) * mean
