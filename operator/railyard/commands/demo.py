"""``railyard demo``: the main job on one machine, with a node failure, a straggler and a bit flip;
``--replica-groups``: the same demo with replica groups (faultTolerance) and one node lost."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "demo", help="run a tiny FSDP + TP job on a local cluster through scripted faults, then summarise"
    )
    p.add_argument(
        "--out", default="railyard-demo", help="folder for pictures, summary.json and logs (default: ./railyard-demo)"
    )
    p.add_argument(
        "--scenario",
        help="YAML scenario file (steps, nodeFailure, straggler, bitflip, replicaGroups); see docs/demo.md",
    )
    p.add_argument("--replica-groups", type=int, nargs="?", const=2, metavar="R",
                   help="the replica-groups scenario: R (default 2, at most 4) HSDP groups of 1 pod x 2 ranks under "
                        "faultTolerance ReplicaGroups (minReplicas 1), the last group's node lost mid-run; "
                        "no straggler, no bit flip (docs/demo.md)")
    p.add_argument("--steps", type=int, help="training steps (default 80; 120 with --replica-groups)")
    p.add_argument("--no-node-failure", action="store_true", help="do not fail a node")
    p.add_argument("--no-straggler", action="store_true", help="do not slow a node")
    p.add_argument("--no-bitflip", action="store_true", help="do not flip a bit")
    p.add_argument("--node-failure-step", type=int, help="step at which a node of the gang fails")
    p.add_argument("--straggler-step", type=int, help="step from which a node runs slow")
    p.add_argument("--straggler-factor", type=float, help="how much slower (default 2.5)")
    p.add_argument("--bitflip-step", type=int, help="step at which a gradient bit flips")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    p.add_argument(
        "--prometheus",
        action="store_true",
        help="also run a real Prometheus (the `prometheus` binary, e.g. Debian's package) on 127.0.0.1 that scrapes "
             "the operator and loads the alerting rules; prints its URL and example queries",
    )
    p.add_argument("--prometheus-port", type=int, default=0, help="port for --prometheus (default: a free one)")


def build_scenario(args: argparse.Namespace) -> Any:
    import dataclasses

    import yaml

    from railyard.demo.scenario import (
        Scenario,
        ScenarioError,
        replica_groups_scenario,
        scenario_from_dict,
    )

    scn = Scenario()
    if args.replica_groups is not None:
        if args.scenario:
            raise ScenarioError(
                "--replica-groups: not with --scenario (put replicaGroups: {groups: R} in the scenario file instead)"
            )
        if not 2 <= args.replica_groups <= 4:
            raise ScenarioError(
                f"--replica-groups: {args.replica_groups} must be in [2, 4] (one pod per group on this machine)"
            )
        scn = replica_groups_scenario(args.replica_groups)
    if args.scenario:
        with open(args.scenario, encoding="utf-8") as fh:
            scn = scenario_from_dict(yaml.safe_load(fh) or {})
    changes: dict[str, Any] = {}
    if args.steps:
        changes["steps"] = args.steps
    for flag, field in (("no_node_failure", "node_failure"), ("no_straggler", "straggler"), ("no_bitflip", "bitflip")):
        if getattr(args, flag):
            changes[field] = None
    if args.node_failure_step and scn.node_failure:
        changes["node_failure"] = dataclasses.replace(scn.node_failure, step=args.node_failure_step)
    if scn.straggler and (args.straggler_step or args.straggler_factor):
        changes["straggler"] = dataclasses.replace(
            scn.straggler,
            step=args.straggler_step or scn.straggler.step,
            factor=args.straggler_factor or scn.straggler.factor,
        )
    if args.bitflip_step and scn.bitflip:
        changes["bitflip"] = dataclasses.replace(scn.bitflip, step=args.bitflip_step)
    scn = dataclasses.replace(scn, **changes)
    scn.validate()
    return scn


def run(args: argparse.Namespace) -> int:
    from railyard.commands import missing_local_cluster

    missing = missing_local_cluster("demo")
    if missing:
        print(missing, file=sys.stderr)
        return 2
    from railyard.demo.runner import Demo, DemoError
    from railyard.demo.scenario import ScenarioError

    try:
        scenario = build_scenario(args)
    except (ScenarioError, OSError) as exc:
        print(f"railyard demo: {exc}", file=sys.stderr)
        return 2
    if args.prometheus:
        from railyard.demo.prometheus import find_prometheus

        if find_prometheus() is None:
            print(
                "railyard demo: --prometheus needs the `prometheus` binary on PATH "
                "(Debian: apt-get install --no-install-recommends prometheus); or leave out --prometheus",
                file=sys.stderr,
            )
            return 2
    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # run the same clean-up as Ctrl-C

    signal.signal(signal.SIGTERM, _terminate)
    try:
        summary = Demo(scenario, Path(args.out), timeout=args.timeout, echo=lambda s: print(s, flush=True),
                       prometheus=args.prometheus, prometheus_port=args.prometheus_port).run()
    except KeyboardInterrupt:
        print("\nrailyard demo: interrupted; the cluster, the operator and every pod were stopped", file=sys.stderr)
        return 130
    except DemoError as exc:
        print(f"railyard demo: {exc}", file=sys.stderr)
        return 1
    return 0 if summary.phase == "Succeeded" else 1
