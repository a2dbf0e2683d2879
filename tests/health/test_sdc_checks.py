"""Trainer-side SDC checks: the pieces, and a reduced bit-flip harness run."""

from __future__ import annotations

import math
import random

import pytest
import torch

from railyard_trainer.health.checks import (
    known_answer_checksum,
    magnitude_jumps,
    odd_ones_out,
    tensor_checksum,
)
from railyard_trainer.health.harness import run
from railyard_trainer.health.spike import SpikeDetector


def test_any_single_bit_flip_changes_the_checksum() -> None:
    rng = random.Random(0)
    t = torch.randn(1000)
    base = tensor_checksum([t])
    for _ in range(200):
        x = t.clone()
        i, bit = rng.randrange(x.numel()), rng.randrange(32)
        x.view(torch.int32)[i] ^= 1 << bit if bit < 31 else -(1 << 31)
        assert tensor_checksum([x]) != base
    assert tensor_checksum([t.clone()]) == base


def test_swapped_elements_change_the_checksum() -> None:
    t = torch.randn(64)
    s = t.clone()
    s[[3, 40]] = s[[40, 3]]
    assert tensor_checksum([s]) != tensor_checksum([t])


def test_the_known_answer_is_reproducible() -> None:
    dev = torch.device("cpu")
    assert known_answer_checksum(dev) == known_answer_checksum(dev)
    assert known_answer_checksum(dev, seed=1) != known_answer_checksum(dev)


@pytest.mark.parametrize(
    ("values", "bad", "majority"),
    [([5, 5, 5, 5], [], True), ([5, 5, 9, 5], [2], True), ([5, 9], [0, 1], False), ([1, 2, 3], [0, 1, 2], False)],
)
def test_the_majority_names_the_odd_rank_and_a_tie_names_nobody(values: list[int], bad: list[int], majority: bool) -> None:
    assert odd_ones_out(values) == (bad, majority)


def test_magnitude_jumps_flag_what_no_optimizer_step_can_do() -> None:
    assert magnitude_jumps([0.3, 1.0, 0.2], [0.31, 1.01, 0.2]) == []
    assert magnitude_jumps([0.3, 1.0, 0.2], [0.3, math.nan, 3e36]) == [1, 2]


def test_the_spike_detector_ignores_noise_and_flags_jumps_and_non_finite() -> None:
    rng = random.Random(1)
    d = SpikeDetector()
    for _ in range(200):
        v = 1.0 * math.exp(rng.gauss(0, 0.1))
        assert not d.check(v).spike
        d.accept(v)
    assert d.check(1e30).spike
    assert d.check(math.inf).spike and d.check(math.nan).spike
    assert not d.check(0.5).spike, "one-sided: a drop is not corruption"
    d.accept(math.nan)
    assert len(d.history) == 128


def test_reduced_harness_catches_every_flip_and_raises_no_false_alarm() -> None:
    res = run(flips=24, clean_steps=100, seed=3, tier2_interval=12, sdc_interval=6, warmup=30)
    assert res.flips == 24
    # Every flip that grew a value was caught; the only escapes are MSB flips of |x| >= 2,
    # which shrink the value to ~1e-38 (rare; benign to the arithmetic; see docs/health.md).
    assert all(abs(m["after"]) < abs(m["before"]) for m in res.missed), res.missed
    assert res.caught >= 22
    assert set(res.by_target) == {"grad", "param_after_update", "param_at_rest"}
    assert res.clean_false_sdc == 0 and res.clean_failed_checks == 0
    assert max(res.latency_steps) <= 1
