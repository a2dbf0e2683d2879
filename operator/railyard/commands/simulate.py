"""``railyard simulate``: goodput of a long run on a large cluster, ours vs today's common setup.

Runs the discrete-event simulation in :mod:`railyard.sim` (default: 16,384 GPUs for 54 days with
the Llama 3 failure causes), prints the comparison table, and writes JSON and a PNG plot.
Assumptions and sources: docs/simulate.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from railyard.sim.model import (
    DEFAULT_HOT_SPARES,
    MAX_FAILURE_SCALE,
    Scenario,
    baseline_policy,
    our_policy,
)
from railyard.sim.report import (
    compare,
    format_seeds,
    format_spare_sweep,
    format_sweep,
    format_table,
    write_json,
    write_plot,
)

DEFAULT_OUT = os.path.join("bench", "results", "simulate.json")
_D = Scenario()


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate",
        help="simulate goodput of a long run on a large cluster",
        description=(
            "Simulate a long training run on a large cluster through a seeded failure trace (Llama 3 "
            "causes and rates), once with Railyard's policies and once with a common baseline; print "
            "goodput, lost GPU-hours by cause and restarts; write JSON and a plot. See docs/simulate.md."
        ),
    )
    p.add_argument("--gpus", type=int, default=_D.gpus, help=f"GPUs in the job (default {_D.gpus})")
    p.add_argument(
        "--gpus-per-node", type=int, default=_D.gpus_per_node, help="GPUs per node (default 8)"
    )
    p.add_argument(
        "--days",
        type=float,
        default=_D.days,
        help=f"length of the run in days (default {_D.days:g})",
    )
    p.add_argument(
        "--seed", type=int, default=_D.seed, help="seed of the failure trace (default 0)"
    )
    p.add_argument("--pp", type=int, default=_D.pp, help="pipeline-parallel degree (default 16)")
    p.add_argument(
        "--tp",
        type=int,
        default=_D.tp,
        help="tensor-parallel degree (default 8; more than --gpus-per-node needs --nvlink-domain-nodes)",
    )
    p.add_argument(
        "--nvlink-domain-nodes",
        type=int,
        default=_D.nvlink_domain_nodes,
        help="nodes per NVLink domain (rack-scale NVLink; an NVL72 rack: 18 trays of 4 GPUs); 0: NVLink only inside a "
             "node",
    )
    p.add_argument(
        "--nodes-per-leaf",
        type=int,
        default=_D.nodes_per_leaf,
        help=f"nodes under one leaf switch (default {_D.nodes_per_leaf})",
    )
    p.add_argument(
        "--params", type=float, default=_D.model_params, help="model parameters (default 405e9)"
    )
    p.add_argument(
        "--bytes-per-param",
        type=float,
        default=_D.bytes_per_param,
        help="checkpoint bytes per parameter (default 14)",
    )
    p.add_argument(
        "--step-time",
        type=float,
        default=None,
        help="seconds per step (default: from FLOPs, ~6.2 s)",
    )
    p.add_argument(
        "--failure-scale",
        type=float,
        default=_D.failure_scale,
        help=f"multiply the Llama 3 failure rates (0..{MAX_FAILURE_SCALE:g}, default 1)",
    )
    p.add_argument(
        "--stragglers-per-day",
        type=float,
        default=_D.stragglers_per_day,
        help="slow-node episodes per day (default 0.2)",
    )
    p.add_argument(
        "--straggler-slowdown",
        type=float,
        default=_D.straggler_slowdown,
        help="how much slower a slow node is (default 1.3)",
    )
    p.add_argument(
        "--sdc-per-day",
        type=float,
        default=None,
        help="silent corruptions per day (default: Llama 3's 6 in 54 days)",
    )
    p.add_argument(
        "--repeat-fraction",
        type=float,
        default=_D.repeat_fraction,
        help="hardware faults that recur on a node put back without quarantine (default 0.1)",
    )
    p.add_argument(
        "--shared-bw",
        type=float,
        default=_D.shared_write_bw / 1e12,
        help="shared storage aggregate bandwidth, TB/s (default 2)",
    )
    p.add_argument(
        "--heal-gbps",
        type=float,
        default=_D.heal_bw_per_node * 8 / 1e9,
        help="a replica group's heal rate per node, Gb/s: the network faultTolerance.healNetwork names (default "
             f"{_D.heal_bw_per_node * 8 / 1e9:g}: one NDR InfiniBand rail; the pod network's rate without it)",
    )
    p.add_argument(
        "--hot-spares", type=_spare_counts, default=[DEFAULT_HOT_SPARES],
        help=f"hot spare nodes held by our policy (spec.gang.hotSpares; default {DEFAULT_HOT_SPARES}); several, "
             "e.g. 0,8,16,64: also print goodput and lost GPU-hours against the pool's size, in place and with "
             f"replica groups, on the same trace (the table shows {DEFAULT_HOT_SPARES}, marked as the default)",
    )
    p.add_argument(
        "--baseline-interval",
        type=int,
        default=200,
        help="baseline checkpoint interval in steps (default 200, ~21 min)",
    )
    p.add_argument(
        "--collective-timeout",
        type=float,
        default=600.0,
        help="baseline collective timeout in seconds (default 600)",
    )
    p.add_argument(
        "--init-seconds", type=float, default=_D.init_s,
        help=f"communicator set-up and warm-up after every restart, both policies (default {_D.init_s:g})",
    )
    p.add_argument(
        "--replica-groups", type=_group_counts, default=[AUTO],
        help="also simulate faultTolerance ReplicaGroups with this many groups; must divide the "
             "data-parallel degree; auto: the operator's choice for this job and cluster, as for "
             "parallelism.dataReplicas: 0 (default); 0: skip; several, e.g. 2,4,8,16: also print goodput "
             "against the number of groups, the operator's choice among them (the table shows the first)",
    )
    p.add_argument(
        "--seeds", type=_seed_range, default=None, metavar="A-B",
        help="run every seed of A..B (e.g. 0-4) and print goodput per seed and the minimum against the targets "
             "(instead of one seed's table)",
    )
    p.add_argument("--out", default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    p.add_argument(
        "--plot", default=None, metavar="PATH", help="PNG plot (default: next to --out, .png)"
    )
    p.add_argument("--no-plot", action="store_true", help="do not write the plot")


#: ``--replica-groups auto``: the operator's choice (railyard.logic.groups).
AUTO = -1


def _spare_counts(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of hot spares or a comma-separated list, e.g. 32 or 0,8,16,64") from None


def _group_counts(text: str) -> list[int]:
    try:
        return [AUTO if x.strip() == "auto" else int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of groups, auto or a comma-separated list, e.g. 8 or 2,4,8,16") from None


def _seed_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    try:
        seeds = list(range(int(first), int(last or first) + 1))
    except ValueError:
        seeds = []
    if not seeds:
        raise argparse.ArgumentTypeError(f"{text!r} is not a range of seeds, e.g. 0-4")
    return seeds


def build_scenario(args: argparse.Namespace) -> Scenario:
    return Scenario(
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        days=args.days,
        seed=args.seed,
        pp=args.pp,
        tp=args.tp,
        nvlink_domain_nodes=args.nvlink_domain_nodes,
        nodes_per_leaf=args.nodes_per_leaf,
        model_params=args.params,
        bytes_per_param=args.bytes_per_param,
        step_time_s=args.step_time,
        failure_scale=args.failure_scale,
        stragglers_per_day=args.stragglers_per_day,
        straggler_slowdown=args.straggler_slowdown,
        sdc_per_day=args.sdc_per_day,
        repeat_fraction=args.repeat_fraction,
        shared_write_bw=args.shared_bw * 1e12,
        shared_read_bw=args.shared_bw * 1e12,
        init_s=args.init_seconds,
        heal_bw_per_node=args.heal_gbps * 1e9 / 8,
    )


def run(args: argparse.Namespace) -> int:
    scn = build_scenario(args)
    problems = scn.problems()
    if any(n < 0 for n in args.hot_spares):
        problems.append(f"--hot-spares: must be >= 0, got {','.join(map(str, args.hot_spares))}")
    # with a list the table shows the default pool, the sweep every size asked for and the default
    spare_sweep = sorted({*args.hot_spares, DEFAULT_HOT_SPARES}) if len(args.hot_spares) > 1 else []
    args.hot_spares = DEFAULT_HOT_SPARES if spare_sweep else args.hot_spares[0]
    if spare_sweep and args.seeds:
        problems.append("--hot-spares: a list of sizes is a sweep on one seed's trace; with --seeds give one size")
    chosen = scn.choose_replica_groups().groups if not problems else 0
    if AUTO in args.replica_groups and not chosen and not problems:
        problems.append(f"--replica-groups auto: {scn.choose_replica_groups().reason}")
    counts = [chosen if r == AUTO else r for r in args.replica_groups]
    if len(counts) > 1 and chosen and chosen not in counts:
        counts.append(chosen)  # the operator's choice beside the counts asked for
    # with a sweep the table shows the operator's choice (else the first count asked for)
    sweep = sorted(set(counts)) if len(counts) > 1 else []
    args.replica_groups = chosen if sweep and chosen else counts[0]
    for r in sweep or [args.replica_groups]:
        if r < 0 or (r == 1 and not sweep) or (r == 0 and sweep) or (r and not problems and scn.dp % r):
            problems.append(f"--replica-groups: must be 0 (off) or a divisor > 1 of the data-parallel degree "
                            f"({scn.dp if not problems else '?'}) (in a list, 1: no groups), got {r}")
    if args.baseline_interval < 1:
        problems.append(f"--baseline-interval: must be >= 1 step, got {args.baseline_interval}")
    if problems:
        for line in problems:
            print(f"railyard simulate: {line}", file=sys.stderr)
        return 2
    ours = our_policy(hot_spares=args.hot_spares)
    base = baseline_policy(
        interval_steps=args.baseline_interval, collective_timeout_s=args.collective_timeout
    )
    if args.seeds:
        try:
            print(format_seeds([compare(scn.with_(seed=seed), ours, base, replica_groups=args.replica_groups,
                                        extras=False) for seed in args.seeds]))
        except ValueError as exc:
            print(f"railyard simulate: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        result = compare(scn, ours, base, replica_groups=args.replica_groups, group_sweep=sweep,
                         spare_sweep=spare_sweep)
    except ValueError as exc:
        print(f"railyard simulate: {exc}", file=sys.stderr)
        return 2
    print(format_table(result))
    if sweep:
        print(format_sweep(result))
    if spare_sweep:
        print(format_spare_sweep(result, DEFAULT_HOT_SPARES))
    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    policies = {"railyard": ours, "baseline": base}
    if args.replica_groups > 1:
        policies["railyard_replica_groups"] = our_policy(hot_spares=args.hot_spares, replica_groups=args.replica_groups)
    write_json(result, args.out, policies)
    print(f"wrote {args.out}")
    if not args.no_plot:
        plot = args.plot or os.path.splitext(args.out)[0] + ".png"
        plot_dir = os.path.dirname(plot)
        if plot_dir:
            os.makedirs(plot_dir, exist_ok=True)
        write_plot(result, plot)
        print(f"wrote {plot}")
    return 0
