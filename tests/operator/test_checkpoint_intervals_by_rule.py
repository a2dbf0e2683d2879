"""Checkpoint intervals chosen by rule (logic/intervals.py), table-driven and pure: Daly's optimum
from the save stall and the failures each tier is restored after, the floors, the cap and the
alignment, the spec's value winning, replica groups lengthening the memory tier's interval, and
the operator writing the chosen intervals into config.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.intervals import (
    FAILURES_PER_GPU_HOUR,
    GROUP_OUTAGE_S,
    SAVE_DURATION_S,
    SAVE_STALL_S,
    STEP_S,
    IntervalInputs,
    Kind,
    ReplicaGroups,
    Sourced,
    Tier,
    TierCost,
    build_interval_inputs,
    compute_beyond_groups,
    compute_daly_interval,
    decide_intervals,
)
from railyard.logic.manifests.config import build_trainer_config

BENCH = Path(__file__).resolve().parents[2] / "bench" / "results"
T = "test"


def _inputs(*, stall: float = 0.5, duration: float = 0.0, tiers: tuple[Tier, ...] = ("memory",),
            rates: dict[Kind, float] | None = None, **kw: Any) -> IntervalInputs:
    """1 s steps; ``rates`` per hour of the whole job."""
    return IntervalInputs(
        step_s=Sourced(1.0, T),
        costs={t: TierCost(Sourced(stall, T), Sourced(duration, T)) for t in tiers},
        failures_per_hour={k: Sourced(v, T) for k, v in (rates or {}).items()},
        **kw,
    )


#: 0.36 failures per hour: M = 10,000 s; with C = 0.5 s, sqrt(2 C M) = 100 s (Daly adds < 0.2 %).
PER_10K_S = 0.36
#: M = 72,900 s: sqrt(2 C M) = 270 s.
PER_72900_S = 3600.0 / 72_900

ROWS = [
    pytest.param(_inputs(rates={"process": PER_10K_S}), {"memory": (100, "rule")}, id="young-daly-one-tier"),
    pytest.param(_inputs(rates={"process": PER_10K_S}, spec_steps={"memory": 7}), {"memory": (7, "spec")},
                 id="the-spec-wins"),
    pytest.param(_inputs(rates={"process": PER_10K_S}, duration=250.0), {"memory": (250, "rule")},
                 id="never-shorter-than-a-background-save"),
    pytest.param(_inputs(rates={}), {"memory": (3600, "rule")}, id="no-failure-needs-it-the-longest-interval"),
    pytest.param(_inputs(rates={"process": PER_10K_S}, max_interval_s=60.0), {"memory": (60, "rule")},
                 id="capped"),
    pytest.param(_inputs(tiers=("memory", "local", "shared"), rates={"node": PER_10K_S, "corruption": PER_72900_S}),
                 {"memory": (100, "rule"), "local": (300, "rule"), "shared": (300, "rule")},
                 id="corruptions-need-local-and-shared-aligned-to-the-memory-tier"),
    pytest.param(_inputs(tiers=("memory", "local", "shared"), rates={"node": PER_10K_S, "corruption": PER_72900_S},
                         memory_replicates=False),
                 # shared: lost nodes and corruptions, M = 3600 / (0.36 + 0.049) h = 8,794 s: Daly 93.4 s;
                 # the others multiples of 93 (memory: 39 x 93 is over the cap of 3,600, so 38 x 93)
                 {"memory": (3534, "rule"), "local": (279, "rule"), "shared": (93, "rule")},
                 id="without-a-replica-a-lost-node-is-the-shared-tiers"),
    pytest.param(_inputs(tiers=("memory", "local"), rates={"process": PER_10K_S}, memory_survives_restart=False),
                 {"memory": (3600, "rule"), "local": (100, "rule")},
                 id="memory-lost-on-restart-the-local-tier-takes-it"),
    pytest.param(_inputs(tiers=("memory", "local", "shared"), rates={"node": PER_10K_S, "corruption": PER_72900_S},
                         groups=ReplicaGroups(8, 1, Sourced(100.0, T))),
                 {"memory": (3510, "rule"), "local": (270, "rule"), "shared": (270, "rule")},
                 id="replica-groups-heal-lost-nodes-the-memory-tier-waits"),
    pytest.param(_inputs(tiers=("memory",), rates={"node": PER_10K_S},
                         groups=ReplicaGroups(8, 8, Sourced(100.0, T))),
                 {"memory": (100, "rule")},
                 id="min-replicas-all-groups-every-loss-is-the-tiers-case"),
    # SDC checks every 50 steps: the corruption's tiers save on check steps (270 -> 250), the
    # memory tier at a multiple of the most frequent interval (100)
    pytest.param(_inputs(tiers=("memory", "local", "shared"), rates={"node": PER_10K_S, "corruption": PER_72900_S},
                         sdc_interval_steps=50),
                 {"memory": (100, "rule"), "local": (250, "rule"), "shared": (250, "rule")},
                 id="corruption-tiers-save-on-the-sdc-checks-steps"),
    # with replica groups the memory tier (cap 3,600) aligns to the corruption tiers' 250
    pytest.param(_inputs(tiers=("memory", "local"), rates={"node": PER_10K_S, "corruption": PER_72900_S},
                         groups=ReplicaGroups(8, 1, Sourced(100.0, T)), sdc_interval_steps=50),
                 {"memory": (3500, "rule"), "local": (250, "rule")},
                 id="groups-memory-aligned-to-the-check-steps"),
    # an optimum far below the checks' interval is not stretched to it (20 < 300 / 2)
    pytest.param(_inputs(tiers=("local",), rates={"corruption": 0.36 * 25}, sdc_interval_steps=300),
                 {"local": (20, "rule")}, id="checks-far-apart-no-stretch"),
]


@pytest.mark.parametrize(("inputs", "want"), ROWS)
def test_each_tier_gets_its_interval(inputs: IntervalInputs, want: dict[Tier, tuple[int, str]]) -> None:
    got = {c.tier: (c.steps, c.chosen_by) for c in decide_intervals(inputs)}
    assert got == want


def test_each_choice_says_its_inputs_and_its_rule() -> None:
    (memory, local) = decide_intervals(_inputs(tiers=("memory", "local"),
                                               rates={"node": PER_10K_S, "corruption": PER_72900_S}))
    assert memory.reason.startswith("memory every 100 steps: save stall 0.5 s, protects against lost nodes every")
    assert "-> Young/Daly" in memory.reason
    assert "silent data corruptions every 20 h" in local.reason and "a multiple of 100" in local.reason
    (spec,) = decide_intervals(_inputs(rates={"process": PER_10K_S}, spec_steps={"memory": 7}))
    assert spec.reason.startswith("memory every 7 steps: set in the spec (the rule: 100;")


@pytest.mark.parametrize(("stall", "mtbf", "want"), [
    (0.5, 10_000.0, math.sqrt(2 * 0.5 * 10_000) * (1 + math.sqrt(0.5 / 20_000) / 3 + 0.5 / 20_000 / 9) - 0.5),
    (1.0, 0.4, 0.4),  # a save longer than two mean times between failures: save every M (Daly)
    (1.0, math.inf, math.inf),
])
def test_dalys_higher_order_optimum(stall: float, mtbf: float, want: float) -> None:
    assert compute_daly_interval(stall, mtbf) == pytest.approx(want)
    if math.isfinite(mtbf) and stall < mtbf:
        # within a fraction of a percent of Young's first-order sqrt(2 C M) where C << M
        assert compute_daly_interval(stall, mtbf) == pytest.approx(math.sqrt(2 * stall * mtbf), rel=0.01)


@pytest.mark.parametrize(("replicas", "min_replicas", "rate", "outage"), [
    (2, 1, 3.6, 100.0), (8, 1, 36.0, 100.0), (8, 7, 3.6, 100.0), (8, 6, 36.0, 500.0), (16, 12, 100.0, 90.0),
])
def test_the_chance_a_failure_finds_too_many_groups_down_is_the_binomial_tail(
    replicas: int, min_replicas: int, rate: float, outage: float
) -> None:
    p = rate / replicas / 3600.0 * outage
    others, k = replicas - 1, replicas - min_replicas
    tail = sum(math.comb(others, j) * p**j * (1 - p) ** (others - j) for j in range(k, others + 1))
    assert compute_beyond_groups(ReplicaGroups(replicas, min_replicas, Sourced(outage, T)), rate) == pytest.approx(
        tail, rel=1e-9)


def test_more_groups_tolerated_means_longer_memory_intervals() -> None:
    steps = [
        {c.tier: c.steps for c in decide_intervals(_inputs(rates={"node": 36.0},
                                                           groups=ReplicaGroups(8, m, Sourced(100.0, T))))}["memory"]
        for m in (8, 7, 6, 1)
    ]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    assert compute_beyond_groups(ReplicaGroups(4096, 1, Sourced(100.0, T)), 100.0) == 0.0  # no underflow error


# --------------------------------------------------------------------------- the operator's inputs


def _spec(**doc: Any) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"nodes": 2048, "procsPerNode": 8, **doc})


GROUPS = {"parallelism": {"tensor": 8, "pipeline": 16, "dataReplicas": 8}, "faultTolerance": {"mode": "ReplicaGroups"}}


def test_the_operator_writes_the_rules_intervals_and_the_spec_wins() -> None:
    spec = _spec(checkpoint={"shared": {"intervalSteps": 1000}})
    chosen = {c.tier: c.steps for c in decide_intervals(build_interval_inputs(spec))}
    config = build_trainer_config(spec, job="j", namespace="n", attempt=0)
    written = {t: config["checkpoint"][t]["intervalSteps"] for t in ("memory", "local", "shared")}
    assert written == {**chosen, "shared": 1000}
    # every attempt gets the same intervals (the pods of one job must agree on them)
    assert build_trainer_config(spec, job="j", namespace="n", attempt=5)["checkpoint"] == config["checkpoint"]


def test_replica_groups_lengthen_the_intervals_and_a_bigger_job_shortens_them() -> None:
    def memory(spec: TrainingJobSpec) -> int:
        return {c.tier: c.steps for c in decide_intervals(build_interval_inputs(spec))}["memory"]

    assert memory(_spec(**GROUPS)) > memory(_spec())
    assert memory(_spec(nodes=12_288)) <= memory(_spec())
    inputs = build_interval_inputs(_spec(**GROUPS, checkpoint={"local": {"enabled": False}}))
    assert set(inputs.costs) == {"memory", "shared"}
    assert inputs.groups == ReplicaGroups(8, 1, GROUP_OUTAGE_S)
    # per GPU: 2,048 nodes x 8 GPUs
    assert inputs.failures_per_hour["node"].value == pytest.approx(FAILURES_PER_GPU_HOUR["node"].value * 16_384)


def test_the_defaults_are_the_measured_figures_they_name() -> None:
    """The defaults are copied from the bench results they cite (a re-measured bench moves them too)."""
    results = {r["metric"]: r["value"] for r in json.loads((BENCH / "checkpoint.json").read_text())["results"]}
    for figure in (STEP_S, *SAVE_STALL_S.values(), *SAVE_DURATION_S.values()):
        assert figure.value == results[figure.source.rsplit(" ", 1)[-1]], figure.source
    groups = json.loads((BENCH / "replica_groups.json").read_text())["results"]
    # the R = 3 run's, the run the simulator's group costs come from too (its "sim: ..." rows)
    outage = [r["value"] for r in groups if r["metric"] == "R=3 replica_groups: last step before the failure -> group healed"]
    assert outage == [GROUP_OUTAGE_S.value]


def test_the_failure_split_is_the_simulators_causes_as_the_operator_classifies_them() -> None:
    from railyard.sim.checkpoints import failures_per_hour
    from railyard.sim.model import Scenario

    scn = Scenario()
    for kind, rate in failures_per_hour(scn).items():
        assert rate.value == pytest.approx(FAILURES_PER_GPU_HOUR[kind].value * scn.gpus), kind
