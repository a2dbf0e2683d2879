"""Same seed, same answer; more failures never buy goodput; the trace follows the Llama 3 rates."""

from __future__ import annotations

import itertools
import json

import pytest

from railyard.sim.engine import simulate
from railyard.sim.model import (
    LLAMA3_CAUSES,
    LLAMA3_DAYS,
    LLAMA3_GPUS,
    Scenario,
    baseline_policy,
    our_policy,
)
from railyard.sim.report import compare, to_json
from railyard.sim.trace import expected_interruptions, generate_trace

from .sim_builders import tiny


def small(**changes: object) -> Scenario:
    base: dict[str, object] = dict(
        step_time_s=None, failure_scale=1.0, planned=47, stragglers_per_day=0.3, sdc_per_day=None
    )
    base.update(changes)
    return tiny(gpus=1024, days=54.0, **base)


def test_the_table_reproduces_llama3_419_unexpected_interruptions_78_percent_hardware() -> None:
    total = sum(c.count for c in LLAMA3_CAUSES)
    hardware = sum(c.count for c in LLAMA3_CAUSES if c.hardware)
    assert total == 419
    assert hardware / total == pytest.approx(0.78, abs=0.01)
    assert expected_interruptions(Scenario()) == pytest.approx(419.0)
    assert (LLAMA3_DAYS, LLAMA3_GPUS) == (54.0, 16_384)


def test_a_full_scale_trace_has_about_the_paper_count_and_cause_mix() -> None:
    trace = generate_trace(Scenario(stragglers_per_day=0.0))
    unexpected = [e for e in trace if e.kind in ("fault", "sdc")]
    # Poisson(419): within ~3 sigma
    assert abs(len(unexpected) - 419) < 3 * 419**0.5
    gpu = sum(1 for e in unexpected if e.cause.name == "Faulty GPU")
    assert abs(gpu - 148) < 3 * 148**0.5
    assert all(0 <= e.pod < 2048 for e in trace)
    assert [e.time for e in trace] == sorted(e.time for e in trace)


def test_same_seed_same_result_and_another_seed_another_trace() -> None:
    a = to_json(compare(small(seed=7)))
    b = to_json(compare(small(seed=7)))
    for d in (a, b):
        d["results"] = [r for r in d["results"] if r["metric"] != "simulate_seconds"]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    t7 = generate_trace(small(seed=7))
    t8 = generate_trace(small(seed=8))
    assert [(e.time, e.cause.name) for e in t7] != [(e.time, e.cause.name) for e in t8]


def test_a_lower_failure_scale_is_a_subset_of_a_higher_one() -> None:
    low = {
        (e.time, e.cause.name)
        for e in generate_trace(small(failure_scale=1.0))
        if e.kind in ("fault", "sdc")
    }
    high = {
        (e.time, e.cause.name)
        for e in generate_trace(small(failure_scale=3.0))
        if e.kind in ("fault", "sdc")
    }
    assert low < high
    assert len(high) > 2 * len(low)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("which", ["ours", "baseline"])
def test_more_failures_never_increase_goodput(seed: int, which: str) -> None:
    # repeats off: with them, a quarantine triggered by an added failure can remove a later one
    policy = our_policy(hot_spares=4) if which == "ours" else baseline_policy()
    goodputs = []
    for scale in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0):
        s = small(seed=seed, failure_scale=scale, repeat_fraction=0.0)
        goodputs.append(simulate(s, policy, generate_trace(s)).goodput)
    assert all(a >= b for a, b in itertools.pairwise(goodputs)), goodputs
    assert goodputs[0] > goodputs[-1]


def test_ours_beats_the_baseline_on_the_same_trace() -> None:
    c = compare(small())
    assert c.ours.goodput > c.baseline.goodput
    assert c.ours.lost_total_s() < c.baseline.lost_total_s()
