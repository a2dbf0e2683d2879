"""What the hot-spare pool changes in the simulator (issue 47 item 4): a pod moved after a fault
lands on a held spare (its placeholder ran the image) while one is left, else on a free node and
starts as a new pod does; the sweep ``railyard simulate --hot-spares 0,8,16,64`` reads goodput
against the pool's size on one trace.

More spares never lower goodput for faults of one node: where a moved pod lives changes no cost,
and a larger pool only turns cold starts into warm ones. With correlated events (a leaf switch,
a drained leaf) it can: the pool decides where moved pods live, so which pods, and with replica
groups how many groups, a later leaf event takes; the rows below therefore hold node faults.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from railyard.cli import main
from railyard.sim.engine import simulate
from railyard.sim.model import our_policy
from railyard.sim.report import compare, format_spare_sweep
from railyard.sim.trace import Event

from .sim_builders import cause, tiny

SWEEP = (0, 1, 2, 4)


def node_faults(*pods: int, every_s: float = 3600.0) -> tuple[Event, ...]:
    """One GPU fault per pod, an hour apart (each node quarantined for the rest of the day)."""
    return tuple(Event(i, every_s * (i + 1), "fault", cause("Faulty GPU"), p, u1=0.5, u2=0.5)
                 for i, p in enumerate(pods))


#: (mode, replica groups, pods hit): faults of one node each, in place and with groups
ROWS = [
    ("in place, one fault", 0, (3,)),
    ("in place, three faults", 0, (3, 5, 1)),
    ("two groups, three faults", 2, (3, 5, 1)),
    ("in place, faults back to back", 0, (0, 1, 2, 3)),
]


@pytest.mark.parametrize(("groups", "pods"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_more_spares_never_lower_goodput_for_node_faults(groups: int, pods: tuple[int, ...]) -> None:
    s = tiny(extra_nodes_fraction=0.5)  # four free nodes: no fault waits for a repair at any size
    trace = node_faults(*pods, every_s=60.0 if len(pods) == 4 else 3600.0)
    runs = [simulate(s, our_policy(hot_spares=n, replica_groups=groups), trace) for n in SWEEP]
    goodputs = [r.goodput for r in runs]
    assert goodputs == sorted(goodputs), f"goodput against spares {SWEEP}: {goodputs}"
    # with no spare every move is cold; with one per fault none is (the pool is topped up too)
    assert runs[0].cold_moves == len(pods)
    assert runs[-1].cold_moves == 0
    assert runs[0].goodput < runs[-1].goodput, "a cold start costs more than a warm one"
    for r in runs:
        assert r.waits_for_repair == 0
        assert r.useful_s + r.lost_total_s() == pytest.approx(s.wall_s, rel=1e-9)


def test_a_cold_start_costs_the_pod_start_in_place() -> None:
    s = tiny()
    cold, warm = (simulate(s, our_policy(hot_spares=n), node_faults(3)) for n in (0, 1))
    lost = {r.cold_moves: r.lost["Faulty GPU"]["restart"] for r in (cold, warm)}
    assert lost[1] - lost[0] == pytest.approx(
        s.in_place_restart_s(node_lost=True, on_spare=False) - s.in_place_restart_s(node_lost=True))
    assert lost[1] - lost[0] == pytest.approx(s.pod_start_s - max(s.spare_container_start_s + s.replacement_s,
                                                                  s.process_restart_s) + s.replacement_s)


def test_the_sweep_has_a_row_per_pool_size_in_place_and_with_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = tiny(failure_scale=2.0, days=3.0)
    c = compare(s, our_policy(hot_spares=2), replica_groups=2, spare_sweep=(0, 2, 4), extras=False)
    assert [n for n, _, _ in c.spare_sweep] == [0, 2, 4]
    assert all(g is not None and g.policy.endswith("2 replica groups") for _, _, g in c.spare_sweep)
    assert c.spare_sweep[1][1] is c.ours and c.spare_sweep[1][2] is c.groups, "the default runs once"
    text = format_spare_sweep(c, 2)
    assert [line.split()[0] for line in text.splitlines()[3:6]] == ["0", "2", "4"]
    assert text.splitlines()[4].endswith("<- the default")
    assert "without in-place restart spares change nothing" in text

    out = tmp_path / "sim.json"
    rc = main(["simulate", "--gpus", "64", "--pp", "1", "--days", "2", "--failure-scale", "2",
               "--hot-spares", "0,1,4", "--replica-groups", "2", "--out", str(out), "--no-plot"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "goodput against the hot-spare pool" in printed
    rows = json.loads(out.read_text())["hot_spare_sweep"]
    assert [r["hot_spares"] for r in rows] == [0, 1, 4, 32], "the default pool (32) beside the sizes asked for"
    assert all({"goodput", "lost_gpu_hours", "cold_moves", "goodput_replica_groups"} <= set(r) for r in rows)


def test_a_negative_pool_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--gpus", "64", "--pp", "1", "--hot-spares", "0,-1", "--out", "/dev/null"]) == 2
    assert "--hot-spares: must be >= 0" in capsys.readouterr().err
    assert main(["simulate", "--gpus", "64", "--pp", "1", "--hot-spares", "0,4", "--seeds", "0-1"]) == 2
    assert "with --seeds give one size" in capsys.readouterr().err
