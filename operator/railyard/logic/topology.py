"""The cluster as an in-memory tree of network domains, built once per placement decision.

Placement needs to know, for every node, which switch domains it sits under (broadest first:
spine/block, leaf/rack, then the host itself), how many GPUs it has free for us, which rail each
GPU is wired to, and whether we may use it at all. All of that comes from Kubernetes Node and
Pod objects given as plain dicts (what the API or a kopf index hands us). The tree is stored as
flat arrays indexed by node number, not as per-node objects, because it is rebuilt for every
decision on clusters of 4,096-32,768 nodes.

Conventions (see docs/placement.md):

- Level keys come from a preset or from the job; the host level is always implied last. A level
  key that no node carries is dropped (so a preset written for three switch tiers works on a
  two-tier cluster); a node that lacks a level label others carry gets a domain of its own at
  that level (its locality is unknown, so we never assume it shares a switch).
- GPU ``i`` of a node is on rail ``(i + offset) % gpus`` with ``offset`` from the node label
  ``railyard.dev/rail-offset`` (default 0, the rail-optimised convention ``GPU i on rail i``).
- A node is unusable when NotReady, cordoned, quarantined by us (taint key or label
  ``railyard.dev/quarantined``), or tainted NoSchedule/NoExecute without a matching toleration.
  Readiness, tolerations and quantities are the Kubernetes rules of :mod:`railyard.api.corev1`
  and :mod:`railyard.api.quantity`, shared with the local cluster's scheduler.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from railyard.api.corev1 import Toleration, compute_pod_requests, node_is_ready, untolerated_taint
from railyard.api.quantity import to_count
from railyard.logic.quarantine import is_quarantined

GPU_RESOURCE = "nvidia.com/gpu"
#: GPU feature discovery's label of a node's GPU count: the node's GPUs where the extended
#: resource is not advertised (NVIDIA's DRA driver publishes ResourceSlices instead).
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
#: On a pod whose GPUs come by Dynamic Resource Allocation (spec.gpuClaim): how many its claim
#: holds, counted like its ``nvidia.com/gpu`` requests would be.
CLAIMED_GPUS_ANNOTATION = "railyard.dev/claimed-gpus"
HOSTNAME_KEY = "kubernetes.io/hostname"
RAIL_OFFSET_LABEL = "railyard.dev/rail-offset"
#: Pods carrying this label with the job's name do not count against free GPUs of that job
#: (its own pods are about to be replaced, or are the ones being kept).
JOB_LABEL = "railyard.dev/job"
#: Label keys that name a single machine; they are the implied host level and dropped from the
#: end of a level list.
HOST_KEYS = frozenset({HOSTNAME_KEY, "cloud.google.com/gce-topology-host"})

#: Preset name -> candidate level-key lists (broadest first, host implied). The first candidate
#: whose keys appear on any node wins; ``topograph`` lists the v1 label family
#: (``fabric.topograph.run/tier-N``, tier 0 nearest the node) before the pre-1.0 one
#: (``network.topology.nvidia.com/{core,spine,leaf|block}``).
LEVEL_PRESETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "railyard": (("railyard.dev/spine", "railyard.dev/leaf"),),
    "topograph": (
        (
            "fabric.topograph.run/tier-2",
            "fabric.topograph.run/tier-1",
            "fabric.topograph.run/tier-0",
        ),
        (
            "network.topology.nvidia.com/core",
            "network.topology.nvidia.com/spine",
            "network.topology.nvidia.com/leaf",
            "network.topology.nvidia.com/block",
        ),
    ),
    "gke": (("cloud.google.com/gce-topology-block", "cloud.google.com/gce-topology-subblock"),),
    "eks": (
        (
            "topology.k8s.aws/network-node-layer-1",
            "topology.k8s.aws/network-node-layer-2",
            "topology.k8s.aws/network-node-layer-3",
        ),
    ),
}

#: The node label naming a node's NVLink domain (a rack-scale NVLink fabric: the 18 trays of a
#: GB200/GB300 NVL72 rack, value ``<cluster UUID>.<clique id>``), set by NVIDIA's GPU feature
#: discovery and read by its DRA driver, Topograph, KAI and Kueue.
NVLINK_LABEL = "nvidia.com/gpu.clique"
#: Preset name -> candidate NVLink-domain label keys; the first one any node carries is the
#: NVLink level (placed below the leaf for a job whose tensor-parallel group spans nodes), else
#: the first. Topograph >= 1.0 writes ``accelerator.topograph.run/domain``, before 1.0
#: ``network.topology.nvidia.com/accelerator``.
NVLINK_PRESETS: dict[str, tuple[str, ...]] = {
    "railyard": (NVLINK_LABEL,),
    "topograph": ("accelerator.topograph.run/domain", "network.topology.nvidia.com/accelerator", NVLINK_LABEL),
    "gke": (NVLINK_LABEL,),
    "eks": (NVLINK_LABEL,),
}

#: Why a node cannot be used, in the order they are checked (the first reason found is kept).
NOT_READY = "NotReady"
UNSCHEDULABLE = "Unschedulable"
QUARANTINED = "Quarantined"
TAINTED = "Tainted"
BUSY = "NotEnoughFreeGPUs"
#: The scheduler refused one of the job's pods there for lack of GPUs (GPUs the placement did not
#: see in use; logic/pending.py): left out of the job's next placements for a while.
REFUSED = "RefusedByScheduler"


@dataclass(frozen=True, slots=True)
class Topology:
    """Flat, read-only arrays describing the cluster for one decision.

    Nodes are numbered ``0..n-1`` in tree order (by domain path, then natural name order), so
    the nodes of one leaf are contiguous. ``domain_of[l][i]`` is node ``i``'s domain index at
    level ``l`` (0 = broadest); ``parent[l][d]`` is domain ``d``'s parent at level ``l-1``.
    """

    levels: tuple[str, ...]
    names: tuple[str, ...]
    index: Mapping[str, int]
    domain_of: tuple[tuple[int, ...], ...]
    domain_names: tuple[tuple[str, ...], ...]
    parent: tuple[tuple[int, ...], ...]
    #: Per leaf-level domain: its node indices (tree order).
    leaf_nodes: tuple[tuple[int, ...], ...]
    gpus: tuple[int, ...]
    free_gpus: tuple[int, ...]
    rail_offset: tuple[int, ...]
    #: "" when the node is usable, else one of the reasons above.
    excluded: tuple[str, ...]
    #: Level keys asked for but dropped because no node carries them.
    dropped_levels: tuple[str, ...] = ()
    #: The key of the deepest level when it is an NVLink domain (nodes of one domain reach each
    #: other over NVLink, not the network), else "".
    nvlink_key: str = ""

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def leaf_level(self) -> int:
        """Index of the level just above the host (-1 when there are no switch levels)."""
        return len(self.levels) - 1

    def leaf_of(self, node: int) -> int:
        return self.domain_of[self.leaf_level][node] if self.levels else 0

    @property
    def nvlink_level(self) -> int:
        """Index of the NVLink-domain level (the deepest), or -1 when there is none."""
        return self.leaf_level if self.nvlink_key else -1

    @property
    def network_leaf_level(self) -> int:
        """Index of the deepest switch level (the leaf, above an NVLink level), -1 if none."""
        return self.leaf_level - 1 if self.nvlink_key else self.leaf_level

    def network_leaf_of(self, node: int) -> int:
        lv = self.network_leaf_level
        return self.domain_of[lv][node] if lv >= 0 else 0

    def path(self, node: int) -> tuple[str, ...]:
        return tuple(
            self.domain_names[lv][self.domain_of[lv][node]] for lv in range(len(self.levels))
        )

    def level_index(self, key: str) -> int:
        """The index of a level key; raises ValueError naming the known levels."""
        try:
            return self.levels.index(key)
        except ValueError:
            raise ValueError(
                f"topology.requiredLevel: {key!r} is not a level of this cluster; "
                f"levels are {list(self.levels)} (dropped, no node carries them: {list(self.dropped_levels)})"
            ) from None


def placement_signature(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What placement reads of a node that can change under a running cluster: readiness,
    cordon, taints, our quarantine mark, GPUs. A change of any of them is worth a new decision
    (index 3 is True while the node is quarantined)."""
    spec = node.get("spec") or {}
    return (
        node_is_ready(node),
        bool(spec.get("unschedulable")),
        tuple(
            sorted(
                (str(t.get("key")), str(t.get("value") or ""), str(t.get("effect"))) for t in spec.get("taints") or ()
            )
        ),
        is_quarantined(node),
        node_gpus(node),
    )


def node_gpus(node: Mapping[str, Any]) -> int:
    """A node's GPUs: its allocatable ``nvidia.com/gpu`` (device plugin), else the GPU count
    label (a node whose GPUs are handed out by Dynamic Resource Allocation)."""
    allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
    if allocatable is not None:
        return to_count(allocatable)
    return _int_label(((node.get("metadata") or {}).get("labels") or {}).get(GPU_COUNT_LABEL, 0))


def resolve_level_keys(
    preset: str | None, levels: Sequence[str] | None, nodes: Sequence[Mapping[str, Any]]
) -> tuple[str, ...]:
    """The level keys to use: explicit ``levels`` win; else the preset's first candidate that any
    node carries. Host keys at the end are dropped (the host level is implied)."""
    if levels:
        keys = list(levels)
    else:
        name = preset or "railyard"
        if name not in LEVEL_PRESETS:
            raise ValueError(
                f"topology.preset: unknown preset {name!r}; use one of {sorted(LEVEL_PRESETS)}"
            )
        candidates = LEVEL_PRESETS[name]
        if len(candidates) == 1:
            keys = list(candidates[0])  # nothing to choose: no need to read every node's labels
        else:
            present: set[str] = set()
            for n in nodes:
                present.update((n.get("metadata") or {}).get("labels") or {})
            keys = list(next((c for c in candidates if present.intersection(c)), candidates[0]))
    while keys and keys[-1] in HOST_KEYS:
        keys.pop()
    return tuple(keys)


def resolve_nvlink_key(
    preset: str | None, key: str | None, nodes: Sequence[Mapping[str, Any]]
) -> str:
    """The NVLink-domain label key: ``key`` (``topology.nvlinkLevel``) when given, else the
    preset's first candidate any node carries, else its first."""
    if key:
        return key
    candidates = NVLINK_PRESETS.get(preset or "railyard", NVLINK_PRESETS["railyard"])
    if len(candidates) > 1:
        for n in nodes:
            labels = (n.get("metadata") or {}).get("labels") or {}
            found = next((c for c in candidates if c in labels), None)
            if found is not None:
                return found
    return candidates[0]


_DIGITS = re.compile(r"(\d+)")


def natural_key(s: str) -> tuple[str | int, ...]:
    """Sort key that orders ``node-2`` before ``node-10`` (text and numbers alternate, so the
    parts at each position have the same type)."""
    parts: list[str | int] = list(_DIGITS.split(s))
    parts[1::2] = [int(x) for x in parts[1::2]]
    return tuple(parts)


def _int_label(v: Any) -> int:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return 0


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """The GPUs a pod holds: its ``nvidia.com/gpu`` requests plus those its DRA claim holds
    (:data:`CLAIMED_GPUS_ANNOTATION`, on our pods)."""
    claimed = _int_label(((pod.get("metadata") or {}).get("annotations") or {}).get(CLAIMED_GPUS_ANNOTATION, 0))
    return compute_pod_requests(pod, only=GPU_RESOURCE).get(GPU_RESOURCE, 0) // 1000 + claimed


def compute_used_gpus(
    pods: Iterable[Mapping[str, Any]], *, ignore_job: str | None = None
) -> dict[str, int]:
    """GPUs requested per node by pods that hold them (bound, not Succeeded/Failed)."""
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        if (
            ignore_job is not None
            and ((pod.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL) == ignore_job
        ):
            continue
        g = pod_gpus(pod)
        if g:
            used[node] = used.get(node, 0) + g
    return used


def node_exclusion(node: Mapping[str, Any], tolerations: Sequence[Toleration]) -> str:
    """Why a pod with ``tolerations`` cannot be placed on ``node`` (one of the reasons above,
    the first found), or "" when it can."""
    if not node_is_ready(node):
        return NOT_READY
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return UNSCHEDULABLE
    taints = spec.get("taints") or ()
    if is_quarantined(node):
        return QUARANTINED
    if untolerated_taint(tolerations, taints) is not None:
        return TAINTED
    return ""


@dataclass(slots=True)
class _NodeFacts:
    """What one Node object says, for one set of level keys and tolerations."""

    #: The object itself: keeps ``id(node)`` from being reused while the facts are cached.
    node: Mapping[str, Any]
    resource_version: Any
    name: str
    #: The level keys' label values (None where the node lacks the label).
    values: tuple[str | None, ...]
    gpus: int
    rail_offset: int
    excluded: str


@dataclass(frozen=True, slots=True)
class _Structure:
    """The tree part of a Topology: depends only on node names and their level labels."""

    #: (name, level label values) of every input node, in input order.
    signature: tuple[tuple[str, tuple[str | None, ...]], ...]
    present: tuple[str, ...]
    #: Input position of the node at each tree position.
    order: tuple[int, ...]
    names: tuple[str, ...]
    index: Mapping[str, int]
    domain_of: tuple[tuple[int, ...], ...]
    domain_names: tuple[tuple[str, ...], ...]
    parent: tuple[tuple[int, ...], ...]
    leaf_nodes: tuple[tuple[int, ...], ...]


class TopologyCache:
    """What :func:`build_topology` derived from Node objects, kept for the next call on the same
    cluster: per node its readiness, exclusion, GPUs and labels, and the domain tree while no
    node's name or level labels change. For callers that decide again and again on one cluster
    (the simulator re-places after every failure; an operator could keep one per process).

    A Node is recognised by identity (and by ``metadata.resourceVersion`` when it has one): hand
    over a new dict when a node changes, as the kopf index and the simulator do. A dict changed
    in place without a new resourceVersion is not seen. The answers are those of a build without
    a cache (which uses a fresh one).

    What a node says depends on the level keys and the tolerations asked with: the cache keeps
    the :data:`CONTEXTS` most recently used of them, so jobs that differ in either, placed in
    turn by one operator, do not each start from nothing."""

    #: How many (level keys, tolerations) contexts are kept.
    CONTEXTS = 8

    def __init__(self) -> None:
        self._context: tuple[tuple[str, ...], tuple[Toleration, ...]] | None = None
        self._facts: dict[int, _NodeFacts] = {}
        self._structure: _Structure | None = None
        #: The other contexts' facts and tree, least recently used first.
        self._others: dict[
            tuple[tuple[str, ...], tuple[Toleration, ...]], tuple[dict[int, _NodeFacts], _Structure | None]
        ] = {}
        self._value_keys: dict[str, tuple[str | int, ...]] = {}

    def _switch(self, context: tuple[tuple[str, ...], tuple[Toleration, ...]]) -> None:
        if self._context is not None:
            self._others[self._context] = (self._facts, self._structure)
        self._facts, self._structure = self._others.pop(context, ({}, None))
        self._context = context
        while len(self._others) >= self.CONTEXTS:
            del self._others[next(iter(self._others))]

    def _node_facts(
        self,
        nodes: Sequence[Mapping[str, Any]],
        keys: tuple[str, ...],
        tolerations: tuple[Toleration, ...],
        *,
        remember: bool,
    ) -> list[_NodeFacts]:
        if self._context != (keys, tolerations):
            self._switch((keys, tolerations))
        old = self._facts
        facts: dict[int, _NodeFacts] = {}
        out: list[_NodeFacts] = []
        for node in nodes:
            meta = node.get("metadata") or {}
            rv = meta.get("resourceVersion")
            f = old.get(id(node)) if old else None
            if f is None or f.node is not node or f.resource_version != rv:
                labels = meta.get("labels") or {}
                rail = labels.get(RAIL_OFFSET_LABEL)
                f = _NodeFacts(
                    node,
                    rv,
                    str(meta.get("name", "")),
                    tuple(map(labels.get, keys)),
                    node_gpus(node),
                    0 if rail is None else _int_label(rail),
                    node_exclusion(node, tolerations),
                )
            if remember:
                facts[id(node)] = f
            out.append(f)
        self._facts = facts
        return out

    def _tree(self, facts: Sequence[_NodeFacts], keys: tuple[str, ...], *, remember: bool) -> _Structure:
        signature = tuple((f.name, f.values) for f in facts) if remember else ()
        cached = self._structure
        if cached is not None and cached.signature == signature:
            return cached
        # a key is a level when any node carries it (even with an empty value)
        present_idx = [j for j in range(len(keys)) if any(f.values[j] is not None for f in facts)]
        present = tuple(keys[j] for j in present_idx)
        every_key = len(present_idx) == len(keys)
        # A missing (or empty) label value puts the node in a domain of its own.
        paths: list[tuple[str, ...]] = [
            cast("tuple[str, ...]", f.values) if every_key and all(f.values)  # no None, no ""
            else tuple(f.values[j] or f"{f.name}(no {keys[j]})" for j in present_idx)
            for f in facts
        ]
        # Nodes share few distinct paths (one per leaf): the sort key and the domains of each
        # path are worked out once, not once per node.
        value_keys = self._value_keys
        path_keys: dict[tuple[str, ...], tuple[tuple[str | int, ...], ...]] = {}
        for p in paths:
            if p not in path_keys:
                for v in p:
                    if v not in value_keys:
                        value_keys[v] = natural_key(v)
                path_keys[p] = tuple(value_keys[v] for v in p)
        sort_keys = [(path_keys[p], natural_key(f.name)) for p, f in zip(paths, facts, strict=True)]
        order = sorted(range(len(facts)), key=sort_keys.__getitem__)
        n_levels = len(present)
        ids: list[dict[tuple[str, ...], int]] = [{} for _ in range(n_levels)]
        dom_names: list[list[str]] = [[] for _ in range(n_levels)]
        parents: list[list[int]] = [[] for _ in range(n_levels)]
        domain_of: list[list[int]] = [[] for _ in range(n_levels)]
        leaf_nodes: list[list[int]] = []
        path_domains: dict[tuple[str, ...], tuple[int, ...]] = {}
        for new_i, i in enumerate(order):
            p = paths[i]
            doms = path_domains.get(p)
            if doms is None:
                found: list[int] = []
                parent = -1
                for lv in range(n_levels):
                    key = p[: lv + 1]
                    d = ids[lv].get(key)
                    if d is None:
                        d = len(dom_names[lv])
                        ids[lv][key] = d
                        dom_names[lv].append(p[lv])
                        parents[lv].append(parent)
                        if lv == n_levels - 1:
                            leaf_nodes.append([])
                    found.append(d)
                    parent = d
                doms = path_domains[p] = tuple(found)
            for lv, d in enumerate(doms):
                domain_of[lv].append(d)
            if n_levels:
                leaf_nodes[doms[-1]].append(new_i)
        if not n_levels:
            leaf_nodes = [list(range(len(order)))]
        names = tuple(facts[i].name for i in order)
        structure = _Structure(
            signature=signature,
            present=present,
            order=tuple(order),
            names=names,
            index={n: i for i, n in enumerate(names)},
            domain_of=tuple(tuple(x) for x in domain_of),
            domain_names=tuple(tuple(x) for x in dom_names),
            parent=tuple(tuple(x) for x in parents),
            leaf_nodes=tuple(tuple(x) for x in leaf_nodes),
        )
        if remember:
            self._structure = structure
        return structure


def build_topology(
    nodes: Sequence[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    *,
    levels: Sequence[str] = LEVEL_PRESETS["railyard"][0],
    tolerations: Sequence[Toleration] = (),
    ignore_job: str | None = None,
    cache: TopologyCache | None = None,
    nvlink_level: str | None = None,
) -> Topology:
    """Build the domain tree from Node dicts (and the Pods that use their GPUs).

    ``levels`` are label keys broadest first, without the host (see :func:`resolve_level_keys`).
    ``nvlink_level``: the key of the NVLink-domain level; when it is the deepest level some node
    carries, the topology says so (``nvlink_key``) and the cost model counts traffic between
    the nodes of one domain as NVLink, not network.
    Pods labelled ``railyard.dev/job=<ignore_job>`` are ignored when computing free GPUs.
    ``cache`` keeps what was derived from each Node for the next call (see
    :class:`TopologyCache`); without one, everything is derived afresh.
    """
    remember = cache is not None
    cache = cache if cache is not None else TopologyCache()
    keys = tuple(k for k in levels if k not in HOST_KEYS)
    facts = cache._node_facts(nodes, keys, tuple(tolerations), remember=remember)
    tree = cache._tree(facts, keys, remember=remember)
    used = compute_used_gpus(pods, ignore_job=ignore_job)
    placed = [facts[i] for i in tree.order]
    return Topology(
        levels=tree.present,
        names=tree.names,
        index=tree.index,
        domain_of=tree.domain_of,
        domain_names=tree.domain_names,
        parent=tree.parent,
        leaf_nodes=tree.leaf_nodes,
        gpus=tuple(f.gpus for f in placed),
        free_gpus=tuple(max(f.gpus - used.get(f.name, 0), 0) for f in placed),
        rail_offset=tuple(f.rail_offset for f in placed),
        excluded=tuple(f.excluded for f in placed),
        dropped_levels=tuple(k for k in keys if k not in tree.present),
        nvlink_key=nvlink_level if nvlink_level and tree.present[-1:] == (nvlink_level,) else "",
    )


def build_synthetic_nodes(
    spines: int,
    leaves_per_spine: int,
    nodes_per_leaf: int,
    gpus: int = 8,
    *,
    levels: Sequence[str] = LEVEL_PRESETS["railyard"][0],
    prefix: str = "node",
    nvlink_domain: int = 0,
    nvlink_key: str = NVLINK_LABEL,
) -> list[dict[str, Any]]:
    """Ready, untainted Node dicts for a two-switch-level topology (spine -> leaf -> host).

    Names are ``{prefix}-s{spine}-l{leaf}-n{i}``; ``levels`` names the two label keys used.
    ``nvlink_domain`` > 0: the nodes of each leaf also form NVLink domains of that many
    consecutive nodes (an NVL72 rack is 18 trays of 4 GPUs), label ``nvlink_key`` =
    ``nvl-{spine}-{leaf}-{j}``. Used by tests, benchmarks, the simulator and the demo.
    """
    if len(levels) != 2:
        raise ValueError(f"levels: need exactly two keys (spine, leaf), got {list(levels)}")
    out: list[dict[str, Any]] = []
    for s in range(spines):
        for lf in range(leaves_per_spine):
            for i in range(nodes_per_leaf):
                name = f"{prefix}-s{s}-l{lf}-n{i}"
                out.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {
                            "name": name,
                            "labels": {
                                levels[0]: f"spine-{s}",
                                levels[1]: f"leaf-{s}-{lf}",
                                HOSTNAME_KEY: name,
                                **({nvlink_key: f"nvl-{s}-{lf}-{i // nvlink_domain}"} if nvlink_domain > 0 else {}),
                            },
                        },
                        "spec": {},
                        "status": {
                            "allocatable": {GPU_RESOURCE: str(gpus)} if gpus else {},
                            "capacity": {GPU_RESOURCE: str(gpus)} if gpus else {},
                            "conditions": [{"type": "Ready", "status": "True"}],
                        },
                    }
                )
    return out


def synthetic_levels(preset: str | None) -> tuple[str, str]:
    """The two label keys generated nodes carry for a topology preset: the preset's two levels
    nearest the host (its first candidate list), so a job naming the preset finds its levels."""
    keys = LEVEL_PRESETS.get(preset or "railyard", LEVEL_PRESETS["railyard"])[0]
    return keys[-2], keys[-1]


#: The most nodes a compact spec may describe (twice a 100,000-GPU cluster of 8-GPU nodes).
MAX_SYNTHETIC_NODES = 250_000


def parse_synthetic_spec(
    spec: str, *, levels: Sequence[str] = LEVEL_PRESETS["railyard"][0], nvlink_key: str = NVLINK_LABEL
) -> list[dict[str, Any]]:
    """Nodes from a compact spec ``spine=2,leaf=4,nodes=32,gpus=8[,nvl=18]`` (leaf per spine,
    nodes per leaf; gpus defaults to 8; nvl: nodes per NVLink domain, label ``nvlink_key``),
    labelled with ``levels`` (see :func:`synthetic_levels`)."""
    fields: dict[str, int] = {}
    for part in spec.split(","):
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in ("spine", "leaf", "nodes", "gpus", "nvl"):
            raise ValueError(
                f"--nodes: bad item {part!r} in {spec!r}; expected spine=N,leaf=N,nodes=N[,gpus=N][,nvl=N]"
            )
        try:
            fields[k] = int(v)
        except ValueError:
            raise ValueError(f"--nodes: {k}={v!r} is not an integer") from None
    missing = [k for k in ("spine", "leaf", "nodes") if k not in fields]
    if missing:
        raise ValueError(
            f"--nodes: {spec!r} lacks {missing}; expected spine=N,leaf=N,nodes=N[,gpus=N][,nvl=N]"
        )
    total = fields["spine"] * fields["leaf"] * fields["nodes"]
    if total > MAX_SYNTHETIC_NODES:
        # nodes= counts the nodes of one leaf, not of the cluster: a misread spec would build
        # millions of node objects and run the machine out of memory before saying anything
        raise ValueError(
            f"--nodes: {spec!r} is {total:,} nodes (spine x leaf x nodes: leaf counts leaves per spine, nodes "
            f"counts nodes per leaf); at most {MAX_SYNTHETIC_NODES:,}. For 12,288 nodes: spine=8,leaf=16,nodes=96"
        )
    return build_synthetic_nodes(
        fields["spine"], fields["leaf"], fields["nodes"], fields.get("gpus", 8), levels=levels,
        nvlink_domain=fields.get("nvl", 0), nvlink_key=nvlink_key,
    )
