"""The checkpoint bench's tokens/s overhead: tokens over time across all the rounds, so that a
save whose cost lands on a few windows is counted in full (a median of per-round ratios would
report the typical round and leave it out), with an interval over the rounds resampled."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "checkpoint.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("railyard_bench_checkpoint", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rounds(pairs: list[tuple[float, float]]) -> list[dict[str, Any]]:
    return [{"base": b, "ck": c} for b, c in pairs]


def test_the_overhead_is_tokens_over_time_of_all_rounds(bench: ModuleType) -> None:
    windows = _rounds([(10.0, 10.0), (10.0, 10.0), (12.0, 15.0)])
    # 32 s of baseline against 35 s with saves, for the same tokens.
    assert bench._pooled_overhead(windows, "ck") == pytest.approx(1 - 32 / 35)
    # The median round says nothing was lost; tokens/s says 8.6% was.
    assert sorted(1 - w["base"] / w["ck"] for w in windows)[1] == 0.0


def test_a_steady_cost_has_no_spread_and_noise_widens_the_interval(bench: ModuleType) -> None:
    steady = _rounds([(10.0, 10.2)] * 12)
    lo, hi = bench._pooled_interval(steady, "ck")
    assert lo == pytest.approx(1 - 10 / 10.2) and hi == pytest.approx(lo)

    noisy = _rounds([(10.0 + (i % 3) * 0.4, 10.2 + ((i * 7) % 5) * 0.3) for i in range(12)])
    est = bench._pooled_overhead(noisy, "ck")
    lo, hi = bench._pooled_interval(noisy, "ck")
    assert lo < est < hi
    # Fixed seed: the same rounds give the same interval.
    assert bench._pooled_interval(noisy, "ck") == (lo, hi)


def test_another_window_kind_against_the_same_baseline(bench: ModuleType) -> None:
    windows = [{"base": 10.0, "ck": 11.0, "raw": 12.5}, {"base": 10.0, "ck": 9.0, "raw": 12.5}]
    assert bench._pooled_overhead(windows, "raw") == pytest.approx(0.2)
    assert bench._pooled_overhead(windows, "ck") == pytest.approx(0.0)
