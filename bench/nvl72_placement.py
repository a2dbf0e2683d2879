"""Benchmark: tensor-parallel groups across the trays of GB200 NVL72 racks (issue 38).

The cluster: 72 NVL72 racks (one NVLink domain of 18 trays x 4 GPUs each, node label
``nvidia.com/gpu.clique``), 4 racks per leaf switch, 9 leaves per spine, 2 spines: 1,296 trays,
5,184 GPUs; about 5% of the trays NotReady, quarantined or half used by another tenant. The job:
4,096 GPUs (1,024 trays), tensor 16 (a TP group spans 4 trays), pipeline 4, data 64, 8 hot
spares; so a rack holds 4 TP groups and 2 trays to spare.

Measured in one process (one core):

- decision time: Node/Pod dicts -> domain tree -> placement -> rank table -> cost (< 1 s);
- ours: every TP group inside one NVLink domain, every DP group on one rail;
- against the same planner with the NVLink level removed (``nvlink_level=None``: TP groups on
  consecutive trays of a leaf, the domains unknown), priced on the same topology: TP groups
  split across racks, bytes per step leaving an NVLink domain (the network row), crossing a
  spine, and the TP share of the network.

Traffic model (``CostInputs``): a 70B-parameter model in bf16, 8,192-token sequences, 1,024 per
step: per TP group per step 20 layers x 4 all-reduces of 131,072 tokens x 8,192 x 2 bytes
(172 GB; Megatron-style TP), stage-to-stage activations of 16,384 tokens per microbatch, 8
microbatches.

Run: ``python bench/nvl72_placement.py`` (a few seconds); ``--small`` is the smoke run. Writes
bench/results/nvl72_placement.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from provenance import write_results
from railyard.logic.cost import NETWORK, NVLINK, CostInputs, CostReport, compute_cost
from railyard.logic.placement import GangRequest, Placement, PlacementInput, plan_placement
from railyard.logic.topology import NVLINK_LABEL, Topology, build_synthetic_nodes, build_topology
from railyard.protocol.ranktable import RankTable

#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "operator/railyard/logic/placement.py",
    "operator/railyard/logic/placement",
    "operator/railyard/logic/topology.py",
    "operator/railyard/logic/cost.py",
)


SPINE = "railyard.dev/spine"
LEAF = "railyard.dev/leaf"
TRAY_GPUS = 4
RACK_TRAYS = 18
HIDDEN, SEQ, BATCH, LAYERS = 8192, 8192, 1024, 80

#: name -> (spines, leaves per spine, racks per leaf, job: (trays, tp, pp, spares)).
SIZES: dict[str, tuple[int, int, int, tuple[int, int, int, int]]] = {
    "full": (2, 9, 4, (1024, 16, 4, 8)),
    "small": (1, 2, 2, (32, 16, 2, 2)),
}


def cost_inputs(pp: int, dp: int, microbatches: int = 8) -> CostInputs:
    tokens = BATCH * SEQ // dp  # per TP group (one DP replica of one stage) per step
    return CostInputs(
        param_bytes=70e9 * 2,
        activation_bytes=tokens // microbatches * HIDDEN * 2,
        microbatches=microbatches,
        tp_bytes_per_step=LAYERS / pp * 4 * tokens * HIDDEN * 2,
    )


def make_cluster(spines: int, leaves: int, racks: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """NVL72 racks: ~2% trays NotReady, ~1% quarantined, ~2% half used by another tenant."""
    rng = random.Random(seed)
    nodes = build_synthetic_nodes(spines, leaves, racks * RACK_TRAYS, TRAY_GPUS, nvlink_domain=RACK_TRAYS)
    pods: list[dict[str, Any]] = []
    for n in nodes:
        x = rng.random()
        if x < 0.02:
            n["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        elif x < 0.03:
            n["spec"]["taints"] = [{"key": "railyard.dev/quarantined", "value": "sdc", "effect": "NoSchedule"}]
        elif x < 0.05:
            pods.append({
                "metadata": {"name": f"tenant-{len(pods)}", "labels": {}},
                "spec": {"nodeName": n["metadata"]["name"],
                         "containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}]},
                "status": {"phase": "Running"},
            })
    return nodes, pods


def decide(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]], req: GangRequest, ci: CostInputs, repeats: int
) -> tuple[float, Placement, Topology]:
    """Median seconds from Node dicts to placement, rank table and cost."""
    times: list[float] = []
    result: Placement | None = None
    topo: Topology | None = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        topo = build_topology(nodes, pods, levels=req.levels, ignore_job=req.job, nvlink_level=req.nvlink_level)
        out = plan_placement(PlacementInput(topo, req, cost_inputs=ci))
        if not isinstance(out, Placement):
            raise SystemExit(f"unplaceable: {out.reason}")
        _ = out.rank_table, out.cost
        times.append(time.perf_counter() - t0)
        result = out
    assert result is not None and topo is not None
    return statistics.median(times), result, topo


def split_tp_groups(table: RankTable, topo: Topology) -> int:
    """TP groups whose ranks sit in more than one NVLink domain of ``topo``."""
    nv = topo.nvlink_level
    dom = {e.rank: topo.domain_of[nv][topo.index[e.node]] for e in table.ranks}
    return sum(
        1 for g in range(table.pp * table.dp) if len({dom[g * table.tp + t] for t in range(table.tp)}) > 1
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="2 leaves of 2 racks, a 128-GPU job (a smoke run; no meaningful figures)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "nvl72_placement.json")
    args = ap.parse_args(argv)
    spines, leaves, racks, (trays, tp, pp, spares) = SIZES["small" if args.small else "full"]
    rows: list[dict[str, Any]] = []

    def add(metric: str, value: float, unit: str, target: str = "", meets: bool | None = None) -> None:
        rows.append({"metric": metric, "value": value, "unit": unit, "target": target, "meets": meets})

    add("machine load average (1 min) at start; the cores are shared", round(os.getloadavg()[0], 2), "")
    nodes, pods = make_cluster(spines, leaves, racks, seed=1)
    gpus = trays * TRAY_GPUS
    dp = gpus // (tp * pp)
    req = GangRequest(
        job="nvl72-tp16", nodes=trays, procs_per_node=TRAY_GPUS, pp=pp, dp=dp, tp=tp, hot_spares=spares,
        levels=(SPINE, LEAF, NVLINK_LABEL), nvlink_level=NVLINK_LABEL,
    )
    ci = cost_inputs(pp, dp)
    seconds, ours, topo = decide(nodes, pods, req, ci, repeats=5)
    unusable = sum(1 for i in range(topo.size) if topo.excluded[i] or topo.free_gpus[i] < TRAY_GPUS)
    add(f"cluster: NVL72 racks of {RACK_TRAYS} trays x {TRAY_GPUS} GPUs", len(topo.leaf_nodes), "racks")
    add("trays unusable (NotReady, quarantined, busy)", unusable, "nodes")
    add(
        f"decision time {len(nodes):,} trays, {gpus:,}-GPU job tp={tp} pp={pp} dp={dp} (dicts -> placement, rank table, cost)",
        seconds, "s", "< 1 s", seconds < 1.0,
    )
    groups = pp * dp
    ours_split = split_tp_groups(ours.rank_table, topo)
    add("TP groups inside one NVLink domain (ours)", groups - ours_split, "groups", f"{groups} (all)", ours_split == 0)
    add("rails per data-parallel group (ours)", ours.rails_per_dp_group, "rails", "1", ours.rails_per_dp_group == 1)
    add("NVLink domains used (ours)", len(ours.tp_groups_by_domain), "racks")

    # the same planner without the NVLink level: the domains are unknown to it
    blind = replace(req, levels=(SPINE, LEAF), nvlink_level=None)
    blind_s, theirs, _ = decide(nodes, pods, blind, ci, repeats=3)
    theirs_cost = compute_cost(theirs.rank_table, topo, ci)
    theirs_split = split_tp_groups(theirs.rank_table, topo)
    add("decision time, domain-ignorant (same planner, NVLink level removed)", blind_s, "s")
    add("TP groups split across NVLink domains: ours", ours_split, "groups", "0", ours_split == 0)
    add("TP groups split across NVLink domains: domain-ignorant", theirs_split, "groups")

    def bytes_rows(label: str, c: CostReport) -> None:
        add(f"bytes/step over NVLink between trays: {label}", c.bytes_at(NVLINK), "bytes")
        add(f"bytes/step leaving an NVLink domain (network): {label}", c.bytes_at(NETWORK), "bytes")
        add(f"bytes/step crossing a spine: {label}", c.bytes_at(SPINE), "bytes")
        seconds = {lc.level: lc.seconds for lc in c.levels}
        add(f"busiest NIC s/step (network bytes / 400 Gb/s): {label}", seconds[NETWORK], "s")
        add(f"busiest GPU's NVLink s/step (between trays, 900 GB/s): {label}", seconds[NVLINK], "s")

    bytes_rows("ours", ours.cost)
    bytes_rows("domain-ignorant", theirs_cost)
    net_ours, net_theirs = ours.cost.bytes_at(NETWORK), theirs_cost.bytes_at(NETWORK)
    add("domain-ignorant / ours (bytes leaving a domain)", net_theirs / net_ours, "ratio", "> 1", net_theirs > net_ours)
    sp_ours, sp_theirs = ours.cost.bytes_at(SPINE), theirs_cost.bytes_at(SPINE)
    add("ours / domain-ignorant (spine bytes)", sp_ours / sp_theirs if sp_theirs else 0.0, "ratio", "<= 1", sp_ours <= sp_theirs)
    tp_only = CostInputs(param_bytes=0, activation_bytes=0, tp_bytes_per_step=ci.tp_bytes_per_step)
    tp_ours = compute_cost(ours.rank_table, topo, tp_only).bytes_at(NETWORK)
    add("TP bytes/step on the network: ours", tp_ours, "bytes", "0", tp_ours == 0)
    add("TP bytes/step on the network: domain-ignorant", compute_cost(theirs.rank_table, topo, tp_only).bytes_at(NETWORK), "bytes")

    width = max(len(r["metric"]) for r in rows)
    for r in rows:
        v = r["value"]
        shown = f"{v:.3e}" if r["unit"] == "bytes" else (f"{v:.4f}" if isinstance(v, float) else str(v))
        meets = "" if r["meets"] is None else ("yes" if r["meets"] else "NO")
        print(f"{r['metric']:<{width}}  {shown:>12}  {r['unit']:<7} {r['target']:<10} {meets}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, {"bench": "nvl72_placement", "results": rows}, MEASURES, indent=2)
    print(f"wrote {args.out}")
    return 0 if all(r["meets"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
