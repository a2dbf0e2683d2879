"""``railyard plan JOB.yaml --nodes NODES``: where a TrainingJob would be placed, and why not.

Prints the placement, a rank-table summary and the network cost per topology level, or the
reason the gang is unplaceable (exit code 3). With ``faultTolerance: ReplicaGroups`` also the
replica groups (which pods form each, on which nodes and leaf domains) and the Lighthouse pod the
operator creates for the job. ``NODES`` is a YAML/JSON file holding a list of
Node objects (or a ``kind: List`` / ``NodeList`` with ``items``, as ``kubectl get nodes -o yaml``
writes), or a compact generator spec such as ``spine=2,leaf=4,nodes=32,gpus=8``;
``--kubeconfig`` reads nodes and pods from a live cluster instead. ``--fail NODE`` then shows the
sticky re-placement after those nodes fail. Last, the checkpoint tiers' intervals the operator
writes into config.json and why (railyard.logic.intervals; ``--step-time``/``--save-stall`` give
the job's own figures).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from railyard.api.trainingjob import TrainingJob
from railyard.logic.cost import CostInputs
from railyard.logic.groups import GroupChoice, resolve_replica_groups
from railyard.logic.intervals import (
    KIND_WORDS,
    TIERS,
    IntervalChoice,
    Sourced,
    build_interval_inputs,
    decide_intervals,
)
from railyard.logic.placement import (
    GangRequest,
    Placement,
    Unplaceable,
    build_placement_input,
    compute_shared_domains,
    plan_placement,
)
from railyard.logic.topology import parse_synthetic_spec, resolve_nvlink_key, synthetic_levels

EXIT_UNPLACEABLE = 3
_DEFAULTS = CostInputs()


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "plan", help="show where a TrainingJob would be placed, its rank table and network cost"
    )
    p.add_argument("job", help="TrainingJob manifest (YAML)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--nodes",
        help="file with Node objects (list, List or NodeList), or a spec like spine=2,leaf=4,nodes=32,gpus=8 "
        "(leaves per spine, nodes per leaf: 256 nodes) "
        "(add nvl=18 for NVLink domains of 18 nodes, as GB200 NVL72 racks)",
    )
    src.add_argument("--kubeconfig", help="read nodes and pods from this cluster")
    p.add_argument("--pods", help="file with Pod objects using GPUs (with --nodes)")
    p.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="NODE",
        help="show the re-placement after NODE fails (repeatable)",
    )
    p.add_argument(
        "--param-bytes",
        type=float,
        default=_DEFAULTS.param_bytes,
        help="model parameter bytes (default 16e9: 8B in bf16)",
    )
    p.add_argument(
        "--activation-bytes",
        type=float,
        default=_DEFAULTS.activation_bytes,
        help="activation bytes per microbatch between stages",
    )
    p.add_argument(
        "--tp-bytes",
        type=float,
        default=_DEFAULTS.tp_bytes_per_step,
        help="bytes all-reduced per tensor-parallel group per step (default 0: TP traffic not counted)",
    )
    p.add_argument(
        "--step-time", type=float, default=None, metavar="SECONDS",
        help="the job's step time, for the checkpoint intervals the spec leaves open (default: the bench's)",
    )
    p.add_argument(
        "--save-stall", type=float, default=None, metavar="SECONDS",
        help="training's stall per checkpoint save, every tier (default: the bench's, per tier)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--show-pods", type=int, default=16, metavar="N", help="pods to list (default 16)"
    )


def _load_objects(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    out: list[dict[str, Any]] = []
    for d in docs:
        if isinstance(d, list):
            out.extend(x for x in d if isinstance(x, dict))
        elif isinstance(d, dict) and "items" in d:
            out.extend(x for x in d["items"] or () if isinstance(x, dict))
        elif isinstance(d, dict):
            out.append(d)
    return out


def _from_cluster(kubeconfig: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    import importlib

    # Typed as Any: the kubernetes client ships without type hints.
    k8s: Any = importlib.import_module("kubernetes")
    try:
        k8s.config.load_kube_config(config_file=kubeconfig)
        api = k8s.client.CoreV1Api()
        to_dict = k8s.client.ApiClient().sanitize_for_serialization
        nodes = [to_dict(n) for n in api.list_node().items]
        pods = [
            to_dict(p)
            for p in api.list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed"
            ).items
        ]
    except (k8s.config.ConfigException, k8s.client.exceptions.ApiException) as exc:
        raise ValueError(
            f"--kubeconfig {kubeconfig}: cannot list nodes and pods ({exc}); check the file and "
            "that it may list nodes and pods in all namespaces"
        ) from exc
    return nodes, pods


@dataclass(frozen=True)
class LighthousePlan:
    """The job's Lighthouse as the operator would create it (faultTolerance ReplicaGroups)."""

    pod: str
    address: str
    command: tuple[str, ...]
    #: When the operator creates it (railyard.logic.lighthouse.decide_lighthouse).
    created: str
    #: The node: the operator does not choose it (the pod is not pinned), so this says who does.
    node: str


def plan_lighthouse(job: TrainingJob) -> LighthousePlan | None:
    """The operator's own Lighthouse pod and decision for this job (None without replica groups)."""
    from typing import get_args

    from railyard.api.trainingjob import TrainingJobStatus
    from railyard.logic.lighthouse import decide_lighthouse
    from railyard.logic.manifests import build_lighthouse_pod, lighthouse_address

    spec = job.spec
    if spec.replica_groups <= 1:
        return None
    name, ns = job.metadata.name or "", job.metadata.namespace or "default"
    pod = build_lighthouse_pod(spec, job=name, namespace=ns, owner={})
    all_phases = get_args(TrainingJobStatus.model_fields["phase"].annotation)
    phases = [ph for ph in all_phases if decide_lighthouse(replica_groups=spec.replica_groups, phase=ph, deleting=False,
                                                                  have=[], nodes={}).create]
    node_affinity = (pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}
    pinned = pod["spec"].get("nodeName") or node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    selector = pod["spec"].get("nodeSelector")
    where = [f"nodeSelector {selector}" if selector else "any node"] + (
        ["the job's tolerations"] if pod["spec"].get("tolerations") else []
    )
    node = (
        "pinned by the operator"
        if pinned
        else f"not chosen by the operator: kube-scheduler places it (no GPU; {', '.join(where)}), preferring a node "
        "without the gang's pods and without GPUs; it may share a node with the gang where there is no other"
    )
    return LighthousePlan(
        pod=str(pod["metadata"]["name"]),
        address=lighthouse_address(name, ns),
        command=tuple(pod["spec"]["containers"][0]["command"]),
        created="while the gang holds its nodes (" + ", ".join(phases) + "); recreated when lost",
        node=node,
    )


def plan_intervals(
    job: TrainingJob, *, step_s: float | None = None, save_stall_s: float | None = None
) -> tuple[list[IntervalChoice], list[str]]:
    """The operator's checkpoint intervals for this job (logic/intervals.py) and the lines naming
    the inputs with their sources; ``step_s``/``save_stall_s`` replace the defaults (measured by
    the user)."""
    kw: dict[str, Any] = {}
    if step_s is not None:
        kw["step_s"] = Sourced(step_s, "--step-time")
    if save_stall_s is not None:
        kw["save_stall_s"] = {t: Sourced(save_stall_s, "--save-stall") for t in TIERS}
    inputs = build_interval_inputs(job.spec, **kw)
    choices = list(decide_intervals(inputs))
    said = [f"step time {inputs.step_s.value:.3g} s ({inputs.step_s.source})"]
    said += [f"{t} save: stall {c.stall_s.value:.3g} s ({c.stall_s.source}), background write "
             f"{c.duration_s.value:.3g} s ({c.duration_s.source})" for t, c in inputs.costs.items()]
    said += [f"{KIND_WORDS[k]}: {r.value:.3g} per hour ({r.source})" for k, r in inputs.failures_per_hour.items()]
    if inputs.groups is not None:
        g = inputs.groups
        said.append(f"replica groups: {g.replicas}, minReplicas {g.min_replicas}, a lost group out "
                    f"{g.outage_s.value:.3g} s ({g.outage_s.source})")
    return choices, said


def _interval_lines(choices: list[IntervalChoice], inputs: list[str]) -> list[str]:
    lines = ["checkpoint intervals (the spec's where it sets one, else Young/Daly; docs/checkpoints.md):"]
    lines += [f"  {c.reason}" for c in choices]
    lines.append("  inputs:")
    lines += [f"    {line}" for line in inputs]
    return lines


def _pods_text(pods: Sequence[int]) -> str:
    """Pod indices, consecutive runs as ranges (a group of 1,536 pods is one range)."""
    runs: list[list[int]] = []
    for i in pods:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _groups_summary(pl: Placement, req: GangRequest, lighthouse: LighthousePlan | None) -> list[str]:
    groups = pl.replica_groups
    if not groups:
        return []
    per = req.nodes // req.replicas
    lines = [
        f"  replica groups: {len(groups)} of {per} pods each (faultTolerance ReplicaGroups), each its own world "
        f"pp {req.pp} x dp {req.dp // req.replicas} x tp {req.tp}:",
        f"    {'group':>5}  {'pods':<12} {'nodes':<40} failure domains (leaf, or NVLink domain, of its nodes)",
    ]
    for g in groups:
        pods = _pods_text(g.pods) + (" (moved " + _pods_text(g.moved) + ")" if g.moved else "")
        nodes = ", ".join(g.nodes[:2]) + (f", ... ({len(g.nodes)})" if len(g.nodes) > 2 else "")
        leaves = ", ".join("/".join(path[1:] if len(path) > 1 else path) or "-" for path in g.leaves)
        lines.append(f"    {g.group:>5}  {pods:<12} {nodes:<40} {leaves}")
    shared = compute_shared_domains(groups, leaf_depth=len(req.levels) - (req.nvlink_level in req.levels))
    lines.append(
        "  failure domains: no leaf or NVLink domain holds two replica groups (a switch, rack or power failure "
        "there takes at most one)" if not shared else
        f"  failure domains: {len(shared)} domains hold several replica groups (the topology or the free nodes "
        "allow no better): " + "; ".join(
            f"{'/'.join(path)}: groups {', '.join(map(str, gs))}" for path, gs in list(shared.items())[:8])
        + ("; ..." if len(shared) > 8 else ""))
    if lighthouse is not None:
        lines.append(f"  lighthouse: pod {lighthouse.pod} at {lighthouse.address}: {' '.join(lighthouse.command)}")
        lines.append(f"    created {lighthouse.created}; node: {lighthouse.node}")
    return lines


def _summary(pl: Placement, req: GangRequest, show: int, lighthouse: LighthousePlan | None = None) -> list[str]:
    t = pl.rank_table
    lines = [
        f"placed {req.job}: {len(pl.nodes)} pods on {len(pl.nodes)} nodes + {len(pl.spares)} hot spares",
        f"  mesh: pp {t.pp} x dp {t.dp} x tp {t.tp} = world {t.world_size}, {t.procs_per_node} procs per node",
        f"  rails per data-parallel group: {pl.rails_per_dp_group} "
        f"({'rail-aligned' if pl.rail_aligned else 'NOT rail-aligned'})",
        f"  leaf domains per data-parallel group: {pl.dp_leaf_spans} (least possible: {pl.dp_leaf_minimum})",
    ]
    for level, names in pl.domains.items():
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        lines.append(f"  {level}: {len(names)} domains ({shown})")
    lines.extend(_nvlink_lines(pl, req))
    if pl.moved:
        lines.append(f"  moved pods: {list(pl.moved)}")
    lines.append(f"  pods (first {min(show, len(pl.nodes))}):")
    lines.append(f"    {'pod':>5}  {'node':<28} {'ranks':<18} {'(pp,dp)':<10} peer")
    for pe in t.pods[:show]:
        rs = t.ranks_of_pod(pe.pod_index)
        coords = sorted({(r.pp, r.dp) for r in rs})
        span = f"{rs[0].rank}..{rs[-1].rank}" if rs else "-"
        if len(rs) > 1 and rs[-1].rank - rs[0].rank != len(rs) - 1:
            span = ",".join(str(r.rank) for r in rs[:4]) + (",..." if len(rs) > 4 else "")
        lines.append(
            f"    {pe.pod_index:>5}  {pe.node:<28} {span:<18} {str(coords[0]) if coords else '-':<10} {pe.replica_peer}"
        )
    if pl.spares:
        lines.append(f"  spares: {', '.join(pl.spares)}")
    lines.extend(_groups_summary(pl, req, lighthouse))
    lines.append("  network cost per step (host and nvlink: NVLink, not the network):")
    lines.append(f"    {'level':<34} {'bytes':>12} {'seconds':>10}")
    for c in pl.cost.levels:
        lines.append(f"    {c.level:<34} {c.bytes_per_step / 1e9:>10.2f}GB {c.seconds:>10.4f}")
    lines.append(f"    {'cross-rail':<34} {pl.cost.cross_rail_bytes / 1e9:>10.2f}GB")
    lines.extend(f"  note: {n}" for n in pl.notes)
    return lines


def _nvlink_lines(pl: Placement, req: GangRequest, show: int = 8) -> list[str]:
    """The NVLink domains the gang uses and the tensor-parallel groups in each."""
    by_domain = pl.tp_groups_by_domain
    if not by_domain or pl.topology is None:
        return []
    topo = pl.topology
    nv = topo.nvlink_level
    split = sum(1 for d in pl.tp_domains if len(d) > 1)
    k = req.tp_pods
    lines = [
        f"  NVLink domains ({topo.nvlink_key}): {len(by_domain)} hold the {len(pl.tp_domains)} tensor-parallel "
        f"groups of {k} node{'s' if k > 1 else ''}; "
        + (f"{split} groups split across domains" if split else "every group inside one domain")
    ]
    used = {name: 0 for name in by_domain}
    for n in pl.nodes:
        used[topo.domain_names[nv][topo.domain_of[nv][topo.index[n]]]] += 1
    size = {topo.domain_names[nv][d]: len(x) for d, x in enumerate(topo.leaf_nodes)}
    for name, groups in list(by_domain.items())[:show]:
        shown = ", ".join(str(g) for g in groups[:8]) + (", ..." if len(groups) > 8 else "")
        lines.append(f"    {name:<28} TP groups {shown} ({used[name]} of its {size[name]} nodes)")
    if len(by_domain) > show:
        lines.append(f"    ... {len(by_domain) - show} more domains")
    return lines


def _as_json(pl: Placement | Unplaceable, lighthouse: LighthousePlan | None = None) -> dict[str, Any]:
    if isinstance(pl, Unplaceable):
        return {
            "placed": False,
            "constraint": pl.constraint,
            "conditionReason": pl.condition_reason,
            "reason": pl.reason,
            "short": pl.short,
            "domains": list(pl.domains),
        }
    return {
        "placed": True,
        "nodes": list(pl.nodes),
        "spares": list(pl.spares),
        "domains": {k: list(v) for k, v in pl.domains.items()},
        "railsPerDataParallelGroup": pl.rails_per_dp_group,
        "leafDomainsPerDataParallelGroup": pl.dp_leaf_spans,
        "crossBytesPerStep": pl.cost.as_dict(),
        "moved": list(pl.moved),
        "nvlinkDomains": {k: list(v) for k, v in pl.tp_groups_by_domain.items()},
        "notes": list(pl.notes),
        **(
            {
                "replicaGroups": [
                    {
                        "group": g.group,
                        "pods": list(g.pods),
                        "nodes": list(g.nodes),
                        "leaves": ["/".join(path) for path in g.leaves],
                        "moved": list(g.moved),
                    }
                    for g in pl.replica_groups
                ]
            }
            if pl.replica_groups
            else {}
        ),
        **(
            {
                "lighthouse": {
                    "pod": lighthouse.pod,
                    "address": lighthouse.address,
                    "command": list(lighthouse.command),
                    "created": lighthouse.created,
                    "node": lighthouse.node,
                }
            }
            if lighthouse is not None
            else {}
        ),
    }


def _choice_lines(choice: GroupChoice | None) -> list[str]:
    """The operator's number of replica groups (``parallelism.dataReplicas: 0``) and why."""
    if choice is None:
        return []
    if not choice.groups:
        return [f"replica groups: none fits: {choice.reason}"]
    others = ", ".join(f"{o.groups}: {o.loss:.3%}{'' if o.disjoint else ' (groups share leaves)'}"
                       for o in choice.options)
    return [f"replica groups chosen (parallelism.dataReplicas: 0): {choice.reason}",
            f"  expected loss by number of groups: {others}"]


def plan(
    job_doc: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]] = (),
    *,
    fail: Sequence[str] = (),
    cost_inputs: CostInputs | None = None,
) -> tuple[GangRequest, Placement | Unplaceable, Placement | Unplaceable | None]:
    """Plan a job (and, with ``fail``, its re-placement); the testable core of the command.

    The same input and decision as the operator's (:func:`build_placement_input`,
    :func:`plan_placement`): attempt 0, then attempt 1 sticky on it with ``fail`` moved off."""
    from railyard.api.trainingjob import TrainingJob

    job, _ = resolve_replica_groups(TrainingJob.model_validate(job_doc), nodes)
    inp = build_placement_input(job, nodes=nodes, pods=pods, cost_inputs=cost_inputs)
    first = plan_placement(inp)
    second: Placement | Unplaceable | None = None
    if fail and isinstance(first, Placement):
        again = build_placement_input(
            job, nodes=nodes, pods=pods, attempt=1, previous_nodes=first.nodes,
            previous_spares=first.spares, failed=fail, cost_inputs=cost_inputs,
        )
        second = plan_placement(again)
    return inp.request, first, second


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        docs = _load_objects(args.job)
        job_doc = next((d for d in docs if d.get("kind") in (None, "TrainingJob")), None)
        if job_doc is None:
            print(f"{args.job}: no TrainingJob found", file=sys.stderr)
            return 1
        if args.kubeconfig:
            nodes, pods = _from_cluster(args.kubeconfig)
        elif "=" in args.nodes and not args.nodes.endswith((".yaml", ".yml", ".json")):
            topo = (job_doc.get("spec") or {}).get("topology") or {}
            preset = topo.get("preset")
            nvlink_key = resolve_nvlink_key(preset, topo.get("nvlinkLevel"), [])
            nodes = parse_synthetic_spec(args.nodes, levels=synthetic_levels(preset), nvlink_key=nvlink_key)
            pods = []
        else:
            nodes = _load_objects(args.nodes)
            pods = _load_objects(args.pods) if args.pods else []
        inputs = CostInputs(
            param_bytes=args.param_bytes, activation_bytes=args.activation_bytes, tp_bytes_per_step=args.tp_bytes
        )
        req, first, second = plan(job_doc, nodes, pods, fail=args.fail, cost_inputs=inputs)
        job, choice = resolve_replica_groups(TrainingJob.model_validate(job_doc), nodes)
        lighthouse = plan_lighthouse(job)
        intervals, interval_inputs = plan_intervals(job, step_s=args.step_time, save_stall_s=args.save_stall)
    except (OSError, yaml.YAMLError, ValueError, ValidationError) as exc:
        print(f"railyard plan: {exc}", file=sys.stderr)
        return 1
    if args.json:
        out: dict[str, Any] = {"job": req.job, "placement": _as_json(first, lighthouse)}
        if choice is not None:
            out["replicaGroupsChosen"] = {"groups": choice.groups, "reason": choice.reason}
        if second is not None:
            out["replacement"] = _as_json(second, lighthouse)
        out["checkpointIntervals"] = {
            "tiers": [{"tier": c.tier, "steps": c.steps, "chosenBy": c.chosen_by, "reason": c.reason}
                      for c in intervals],
            "inputs": interval_inputs,
        }
        print(json.dumps(out, indent=2))
    else:
        print("\n".join([*_choice_lines(choice), *_interval_lines(intervals, interval_inputs)]))
        for label, result in (
            ("", first),
            ("after failure of " + ", ".join(args.fail) + ": ", second),
        ):
            if result is None:
                continue
            if isinstance(result, Unplaceable):
                print(f"{label}unplaceable ({result.constraint}): {result.reason}")
            else:
                print(label + "\n".join(_summary(result, req, args.show_pods, lighthouse)))
    final = second if second is not None else first
    return EXIT_UNPLACEABLE if isinstance(final, Unplaceable) else 0
