"""The simulated policy's checkpoint intervals: the operator's rule with the scenario's figures.

Where a policy's spec leaves a tier's interval open, :func:`railyard.logic.intervals.decide_intervals`
chooses it, as the operator does, from inputs the simulation knows better than the operator's
defaults: the scenario's step time, each tier's stall and background write as the engine books
them, the failure rates of the scenario's causes (each cause's kind by the operator's own
classification: a cause whose failure names a node takes it), and a replica group's outage as
the engine models it. The baseline sets its interval, which wins.
"""

from __future__ import annotations

from collections.abc import Mapping

from railyard.logic.intervals import (
    IntervalChoice,
    IntervalInputs,
    Kind,
    ReplicaGroups,
    Sourced,
    Tier,
    TierCost,
    decide_intervals,
)
from railyard.sim.decisions import classify
from railyard.sim.model import Cause, PolicyConfig, Scenario


def cause_kind(cause: Cause) -> Kind:
    """How a cause leaves the tiers: a corruption, a lost node (the operator quarantines the node
    its failure names), or a failure that leaves the node."""
    if cause.detect == "sdc":
        return "corruption"
    return "node" if classify(cause, "node").nodes else "process"


def failures_per_hour(scn: Scenario) -> dict[Kind, Sourced]:
    """The scenario's failures per hour of the whole job, by kind (its causes' counts over their
    period, scaled to its GPUs and ``failure_scale``; ``sdc_per_day`` where set)."""
    per_hour = scn.failure_scale * scn.gpus / scn.reference_gpus / (scn.reference_days * 24.0)
    rates: dict[Kind, float] = {"process": 0.0, "node": 0.0, "corruption": 0.0}
    for cause in scn.causes:
        rates[cause_kind(cause)] += cause.count * per_hour
    if scn.sdc_per_day is not None:
        rates["corruption"] = scn.sdc_per_day / 24.0
    source = f"the scenario's causes at {scn.gpus:,} GPUs"
    return {k: Sourced(v, source) for k, v in rates.items()}


def decide_sim_intervals(
    scn: Scenario,
    policy: PolicyConfig,
    *,
    stall_s: Mapping[Tier, float],
    duration_s: Mapping[Tier, float],
    group_outage_s: float,
) -> tuple[IntervalChoice, ...]:
    """The enabled tiers' intervals for ``policy`` on ``scn`` (the spec's where it sets them)."""
    ck = policy.checkpoint
    given = policy.intervals()
    enabled = list(given)
    engine = "the simulated save (sim/engine.py)"
    groups = None
    if policy.replica_groups > 1:
        # the simulated groups go on while at least one trains (our policy's minReplicas)
        groups = ReplicaGroups(policy.replica_groups, 1, Sourced(group_outage_s, "the simulated group repair"))
    return decide_intervals(IntervalInputs(
        step_s=Sourced(scn.step_s, "the scenario's step time"),
        costs={t: TierCost(Sourced(stall_s[t], engine), Sourced(duration_s[t], engine)) for t in enabled},
        failures_per_hour=failures_per_hour(scn),
        groups=groups,
        memory_replicates=ck.memory.replicate,
        memory_survives_restart=ck.memory.medium == "HostPath" or policy.in_place,
        spec_steps={t: v for t, v in given.items() if v is not None},
        sdc_interval_steps=policy.health.sdc.interval_steps if policy.sdc_checks else None,
    ))
