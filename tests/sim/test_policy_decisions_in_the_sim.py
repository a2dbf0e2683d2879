"""The simulator's calls into the project's policy code give the answers the policies define."""

from __future__ import annotations

import random

import pytest

from railyard.api.trainingjob import Checkpoint, Health, MemoryTier
from railyard.protocol.exitcodes import FailureClass
from railyard.sim.decisions import Cluster, Detector, Saved, choose_restore, classify
from railyard.sim.model import STRAGGLER_CAUSE, baseline_policy, our_policy

from .sim_builders import cause, ours_every, tiny


@pytest.mark.parametrize("u1", [0.0, 0.3, 0.99])
@pytest.mark.parametrize("u2", [0.0, 0.7])
def test_dead_and_hung_ranks_are_found_within_the_health_rules_bounds(u1: float, u2: float) -> None:
    s = tiny()
    pol = our_policy(hot_spares=1)
    d = Detector(s, pol)
    h = pol.health
    dead = d.latency(cause("Host maintenance"), u1, u2)
    assert (
        h.heartbeat_timeout_seconds - h.heartbeat_interval_seconds
        <= dead
        <= h.heartbeat_timeout_seconds + s.eval_period_s
    )
    hang = d.latency(cause("Network switch/cable"), u1, u2)
    timeout = max(h.hang_p99_multiplier * s.step_s, h.hang_timeout_seconds)
    assert d.hang_timeout_s == pytest.approx(timeout)
    assert timeout - s.step_s <= hang <= timeout + s.eval_period_s
    assert d.latency(cause("Software bug"), u1, u2) == s.pod_exit_detect_s


def test_the_baseline_waits_for_the_collective_timeout() -> None:
    s = tiny()
    d = Detector(s, baseline_policy(collective_timeout_s=321.0))
    assert d.latency(cause("Host maintenance"), 0.5, 0.5) == 321.0
    assert d.latency(cause("NIC"), 0.5, 0.5) == 321.0


def test_a_rank_10_percent_slower_is_flagged_within_20_steps_and_a_normal_one_never() -> None:
    d = Detector(tiny(), our_policy(hot_spares=1))
    assert d.straggler_steps(1.3) <= 20
    assert d.straggler_steps(1.12) <= 20
    assert d.straggler_steps(1.0) >= 10**9


@pytest.mark.parametrize(
    ("name", "cls", "blamed"),
    [
        ("Faulty GPU", FailureClass.INFRASTRUCTURE, True),
        ("Software bug", FailureClass.APPLICATION, False),
        ("Silent data corruption", FailureClass.SDC, True),
        ("Network switch/cable", FailureClass.STRAGGLER, True),
        ("Dependency", FailureClass.INFRASTRUCTURE, False),
    ],
)
def test_causes_map_to_the_operators_failure_classes(
    name: str, cls: FailureClass, blamed: bool
) -> None:
    f = classify(cause(name), "node-7")
    assert f.cls is cls
    assert bool(f.nodes) is blamed
    assert classify(STRAGGLER_CAUSE, "n").cls is FailureClass.STRAGGLER


def saved(*items: tuple[str, int]) -> list[Saved]:
    return [Saved(tier, step, 0.0) for tier, step in items]


def test_restore_uses_the_peer_replica_when_the_node_is_lost() -> None:
    s = tiny()
    ck = saved(("memory", 100), ("memory", 90), ("local", 100), ("shared", 100))
    kw = dict(scn=s, failed_pod=3, replica_peer=4, clean_up_to=float("inf"))
    assert choose_restore(ck, replicate=True, node_lost=True, **kw) == ("memory", 100)  # type: ignore[arg-type]
    # without a replica the lost node's memory and local copies are gone: fall back to shared
    assert choose_restore(ck, replicate=False, node_lost=True, **kw) == ("shared", 100)  # type: ignore[arg-type]
    assert choose_restore(ck, replicate=False, node_lost=False, **kw) == ("memory", 100)  # type: ignore[arg-type]


def test_restore_skips_checkpoints_after_the_last_passing_sdc_check() -> None:
    s = tiny()
    ck = saved(("memory", 120), ("memory", 110), ("local", 100), ("local", 50), ("shared", 100))
    got = choose_restore(
        ck, scn=s, replicate=True, node_lost=False, failed_pod=0, replica_peer=1, clean_up_to=100
    )
    assert got == ("local", 100)
    got = choose_restore(
        ck, scn=s, replicate=True, node_lost=True, failed_pod=0, replica_peer=1, clean_up_to=100
    )
    assert got == ("shared", 100)
    assert (
        choose_restore(
            [], scn=s, replicate=True, node_lost=True, failed_pod=0, replica_peer=1, clean_up_to=1
        )
        is None
    )


def test_quarantine_moves_only_the_failed_pod_to_a_spare_and_repairs_bring_nodes_back() -> None:
    s = tiny()
    c = Cluster(s, hot_spares=2)
    before = c.nodes
    spares = c.spares
    assert len(spares) == 2
    bad = before[3]
    assert c.quarantine_and_replace([bad], now=0.0, repair_s=100.0)
    after = c.nodes
    assert after[3] in spares
    assert [a for i, a in enumerate(after) if i != 3] == [b for i, b in enumerate(before) if i != 3]
    assert c.quarantined == {bad: 100.0}
    assert c.next_repair() == 100.0
    c.release_repaired(100.0)
    assert c.quarantined == {}


def test_the_policies_are_the_api_defaults_plus_what_a_long_run_sets() -> None:
    ours = our_policy()
    assert ours.checkpoint == Checkpoint()
    assert ours.health.heartbeat_timeout_seconds == Health().heartbeat_timeout_seconds
    assert ours.health.straggler.action == "Restart"
    # the spec leaves every interval open: the operator's rule chooses them (tests/sim: the sim's are its)
    assert ours.intervals() == {"memory": None, "local": None, "shared": None}
    base = baseline_policy(interval_steps=300)
    assert base.intervals() == {"shared": 300}
    assert not (base.quarantine or base.sticky or base.straggler_restart or base.sdc_checks)
    assert MemoryTier().replicate


@pytest.mark.parametrize("failed", [(0,), (5,), (17, 40), (63,)])
def test_the_sims_replacement_is_the_operators_decision(failed: tuple[int, ...]) -> None:
    """The simulator re-places through the operator's input builder and decision: the same
    answer as building the input from the same job and nodes directly."""
    from railyard.logic.placement import Placement, build_placement_input, plan_placement

    s = tiny(gpus=512, pp=4)  # 64 nodes, dp 16
    c = Cluster(s, hot_spares=4)
    first = c.initial
    victims = [c.nodes[p] for p in failed]
    assert c.quarantine_and_replace(victims, now=0.0, repair_s=3600.0)
    direct = plan_placement(build_placement_input(
        c.job, nodes=c.node_objects(), attempt=1, previous_nodes=first.nodes,
        previous_spares=first.spares, failed=victims,
    ))
    assert isinstance(direct, Placement)
    moved = tuple(p for p, (a, b) in enumerate(zip(first.nodes, c.nodes, strict=True)) if a != b)
    assert (c.nodes, c.spares, moved) == (direct.nodes, direct.spares, direct.moved)
    assert moved == tuple(sorted(failed)) and c.replacements == len(failed)
    assert not set(victims) & set(c.nodes)


@pytest.mark.parametrize(
    ("gpus", "spares", "nvlink", "sizes"),
    [
        (1024, 4, 0, (1, 1, 2, 5)),  # 128 of 160 nodes: spares run out, waits for repairs
        (2048, 32, 0, (1, 1, 1, 3)),
        (2048, 4, 4, (1, 2)),  # NVLink-domain labels on the nodes, tp inside a node
    ],
)
def test_the_reduced_replacement_decides_as_the_whole_cluster_failure_by_failure(
    gpus: int, spares: int, nvlink: int, sizes: tuple[int, ...]
) -> None:
    """The simulator decides a sticky re-placement on a reduced cluster (Cluster._replace_reduced);
    driven through the same failures as a twin that decides on every node, the nodes, spares,
    replacements and refusals agree at every step."""
    s = tiny(gpus=gpus, pp=4, nodes_per_leaf=20, nvlink_domain_nodes=nvlink)
    fast, full = Cluster(s, hot_spares=spares), Cluster(s, hot_spares=spares)
    assert fast._reduced
    full._reduced = False
    rng = random.Random(gpus + spares)
    now, refused = 0.0, 0
    for _ in range(60):
        now += rng.uniform(0.0, 4 * 3600.0)
        victims = [fast.node_of(p) for p in rng.sample(range(s.nodes), rng.choice(sizes))]
        ok = fast.quarantine_and_replace(victims, now, 72 * 3600.0)
        assert full.quarantine_and_replace(victims, now, 72 * 3600.0) == ok
        refused += not ok
        assert (fast.nodes, fast.spares, fast.replacements) == (full.nodes, full.spares, full.replacements)
    assert fast.replacements > 0 and (refused > 0 or gpus != 1024)  # the refusal path was taken


def _tp_domains(cluster: Cluster, nvlink_key: str) -> list[set[str]]:
    """The NVLink domain labels of each tensor-parallel group's nodes (pods in rank order)."""
    labels = {str(n["metadata"]["name"]): n["metadata"]["labels"] for n in cluster.node_objects()}
    k = cluster.job.spec.parallelism.tensor // cluster.job.spec.procs_per_node
    nodes = list(cluster.nodes)
    return [{labels[n].get(nvlink_key, "") for n in nodes[i:i + k]} for i in range(0, len(nodes), k)]


def test_rack_scale_nvlink_tensor_groups_stay_in_one_domain_through_a_replacement() -> None:
    """tp 16 on 4-GPU trays of 8-tray NVLink domains: the simulator places (and re-places) the
    gang as the operator does, each tensor-parallel group's 4 trays inside one domain."""
    from railyard.logic.topology import NVLINK_LABEL

    s = tiny(gpus=128, gpus_per_node=4, tp=16, nodes_per_leaf=16, nvlink_domain_nodes=8)
    assert s.problems() == []
    cluster = Cluster(s, hot_spares=4)
    before = _tp_domains(cluster, NVLINK_LABEL)
    assert len(before) == 8 and all(len(d) == 1 and "" not in d for d in before)
    lost = cluster.nodes[5]
    assert cluster.quarantine_and_replace([lost], now=0.0, repair_s=3600.0)
    assert lost not in cluster.nodes and cluster.replacements
    after = _tp_domains(cluster, NVLINK_LABEL)
    assert all(len(d) == 1 and "" not in d for d in after)


@pytest.mark.parametrize(
    ("changes", "wanted"),
    [
        ({"tp": 16, "gpus_per_node": 4, "gpus": 128}, "set nvlink_domain_nodes (--nvlink-domain-nodes) to at least 4"),
        ({"tp": 6, "gpus_per_node": 4, "gpus": 96, "pp": 1}, "neither divides gpus_per_node 4"),
        ({"tp": 16, "gpus_per_node": 4, "gpus": 128, "nvlink_domain_nodes": 5, "nodes_per_leaf": 32}, "nvlink_domain_nodes: must be 0 (none) or divide nodes_per_leaf (32)"),
    ],
)
def test_a_tensor_group_the_simulated_nodes_cannot_hold_is_refused_with_the_fix(changes: dict[str, int], wanted: str) -> None:
    assert any(wanted in p for p in tiny(**changes).problems()), tiny(**changes).problems()


def test_our_intervals_are_the_operators_rule_and_replica_groups_lengthen_them() -> None:
    """Our policy leaves the intervals open: the rule of railyard.logic.intervals chooses them from
    the scenario (1 s steps, the Llama 3 rates at 64 GPUs); the engine saves at them, and with
    replica groups the memory tier (only needed when every group is down) saves far less often."""
    from railyard.sim.engine import STALL, simulate

    s = tiny(failure_scale=1.0, sdc_per_day=None)
    alone = simulate(s, our_policy(hot_spares=1), ())
    groups = simulate(s, our_policy(hot_spares=1, replica_groups=2), ())
    assert set(alone.checkpoint_intervals) == {"memory", "local", "shared"}
    assert all("Young/Daly" in why for why in alone.interval_reasons)
    assert groups.checkpoint_intervals["memory"] > alone.checkpoint_intervals["memory"]
    assert groups.lost[STALL]["stall"] < alone.lost[STALL]["stall"]
    # no failure in the trace: the stall is one snapshot per step on which any tier saves
    every = alone.checkpoint_intervals.values()
    saves = sum(1 for k in range(1, int(s.wall_s / s.step_s) + 1) if any(k % iv == 0 for iv in every))
    snapshot = s.bytes_per_node / (s.gpus_per_node * s.host_copy_bw_per_gpu) + s.save_fixed_stall_s
    assert alone.lost[STALL]["stall"] == pytest.approx(saves * snapshot, abs=2 * snapshot)
    # the spec's interval wins
    assert simulate(s, ours_every(hot_spares=1), ()).checkpoint_intervals == {"memory": 10, "local": 50, "shared": 100}
