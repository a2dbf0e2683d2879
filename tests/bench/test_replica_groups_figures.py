"""bench/replica_groups.py's headline: rank-seconds lost at the ideal rate, never negative, the raw
figure beside it, and its ratio computed from non-negative figures, for every R measured (issue 49)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the script imports its sibling inplace.py
    try:
        spec = importlib.util.spec_from_file_location("railyard_bench_replica_groups", BENCH / "replica_groups.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


@pytest.mark.parametrize(
    ("elapsed", "steps", "excess", "wanted"),
    [
        (10.0, 8, 0.0, 6 * 2.0),  # 2 s of the job's time produced no kept step
        (10.0, 10, 0.0, 0.0),  # no loss
        (10.0, 12, 0.0, 0.0),  # faster than the step time before the failure: 0, not -12
        (10.0, 12, 4.0, 6 * 2.0),  # 4 steps beyond the ideal (R-1)/R rate are not credited
        (10.0, 8, -3.0, 6 * 2.0),  # a negative excess credits nothing
    ],
)
def test_rank_seconds_lost_at_the_ideal_rate_is_never_negative(
    bench: ModuleType, elapsed: float, steps: int, excess: float, wanted: float
) -> None:
    assert bench.lost_at_ideal_rate(6, elapsed, steps, 1.0, excess) == pytest.approx(wanted)


def _run(lost: float, raw: float, step_s: float = 0.5) -> dict[str, Any]:
    return {
        "phase": "Succeeded", "step_s": step_s, "rank_seconds_lost": lost, "rank_seconds_lost_raw": raw,
        "survivors_longest_pause_s": 1.7, "pods_replaced": 0, "worker_processes_replaced": 0, "steps_redone": 0,
        "final_loss_vs_no_failure": 0.0, "survivors_pods_unchanged": True, "survivors_pids_unchanged": True,
        "restarted_group_checkpoint_reads": 0, "restarted_group_healed_from_peer": True, "heal_s": 0.4,
        "failure_to_healed_s": 9.0, "degraded_step_rate": 0.8,
    }


@pytest.mark.parametrize(
    ("groups", "rg_lost", "ip_lost", "ratio", "sim"),
    [
        (2, 0.0, 40.0, 40.0 / (4 * 0.5), False),  # a 0 headline: divided by one step of the job
        (3, 12.0, 45.0, 3.75, True),
        (4, 2.0, 30.0, 30.0 / (8 * 0.5), False),  # below one step: one step
    ],
)
def test_each_r_reports_the_headline_the_raw_figure_and_a_ratio_of_non_negative_figures(
    bench: ModuleType, groups: int, rg_lost: float, ip_lost: float, ratio: float, sim: bool
) -> None:
    m = {"replica_groups": _run(rg_lost, -2.69), "in_place": _run(ip_lost, ip_lost), "full": _run(60.0, 60.0)}
    rows = {r["metric"]: r for r in bench.rows(m, {"final_loss": 1.0}, groups, sim=sim)}
    tag = f"R={groups} "
    assert rows[tag + "replica_groups: rank-seconds lost at the ideal rate"]["value"] == rg_lost
    assert rows[tag + "replica_groups: rank-seconds lost, raw (no rate correction; can be < 0)"]["value"] == -2.69
    ratio_row = rows[tag + "replica_groups: rank-seconds lost at the ideal rate, in_place / replica_groups"]
    assert ratio_row["value"] == round(ratio, 2)
    bound = rows[tag + "replica_groups: rank-seconds lost <= in_place / R + one step"]
    assert bound["target"] == round(ip_lost / groups + 2 * groups * 0.5, 2)
    assert ("sim: survivors' stall beyond the step redone" in rows) == sim


@pytest.mark.parametrize(("text", "wanted"), [("2,3,4", (2, 3, 4)), ("3", (3,)), ("4,2", (4, 2))])
def test_groups_flag_takes_r_2_to_4(bench: ModuleType, text: str, wanted: tuple[int, ...]) -> None:
    assert bench.parse_groups(text) == wanted


@pytest.mark.parametrize("text", ["1", "5", "2,2", "", "two"])
def test_groups_flag_refuses_what_the_cluster_cannot_run(bench: ModuleType, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--groups"):
        bench.parse_groups(text)


def test_the_default_is_r_2_3_and_4(bench: ModuleType) -> None:
    assert bench.GROUPS == (2, 3, 4)


@pytest.mark.parametrize(("groups", "pod"), [(2, 1), (3, 2), (4, 3)])
def test_the_lost_node_is_the_last_groups_never_pod_0s(bench: ModuleType, groups: int, pod: int) -> None:
    """Pod 0's rank 0 logs the job's steps; R = 2 has no pod 2."""
    assert bench.victim(groups) == pod
