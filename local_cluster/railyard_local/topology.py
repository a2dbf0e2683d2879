"""The simulated nodes of the local cluster and the topology labels they carry.

A topology is a list of switch levels from the top down, each with the number of children per
parent: ``spine=2,leaf=2`` is two spines with two leaves each (four leaves). Nodes fill the
leaves in order, ``ceil(nodes / leaves)`` per leaf, so ``node-0`` and ``node-1`` share a leaf.
Every node carries our own labels (``railyard.dev/<level>``) and, for the same levels, the
labels of NVIDIA Topograph, both the v0.x convention (``network.topology.nvidia.com/leaf|spine|
core``) and the v1.x one (``fabric.topograph.run/tier-N``, tier 0 nearest the node), and GKE's
(``cloud.google.com/gce-topology-block|subblock|host``: top level, bottom level, node), so placement
code written against a real cluster reads the local one unchanged. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GROUP = "railyard.dev"
LOCAL_GROUP = "local.railyard.dev"
HOSTNAME_LABEL = "kubernetes.io/hostname"
SIMULATED_LABEL = f"{LOCAL_GROUP}/simulated"
GPU_RESOURCE = "nvidia.com/gpu"
TOPOGRAPH_TREE = ("leaf", "spine", "core")  # Topograph v0.x label names, bottom up
FIRST_NODE_IP = ipaddress.IPv4Address("127.0.0.10")
DEFAULT_TOPOLOGY = "spine=1,leaf=2"


class TopologyError(ValueError):
    """A topology spec or file that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Level:
    name: str
    count: int


@dataclass(frozen=True)
class NodeSpec:
    """One simulated node as the node manager registers it."""

    name: str
    ip: str
    labels: dict[str, str]
    cpu: str = "16"
    memory: str = "64Gi"
    gpus: int = 0
    max_pods: int = 110
    taints: tuple[dict[str, str], ...] = ()

    def capacity(self) -> dict[str, str]:
        cap = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.max_pods), "ephemeral-storage": "100Gi"}
        if self.gpus:
            cap[GPU_RESOURCE] = str(self.gpus)
        return cap

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ip": self.ip,
            "labels": dict(self.labels),
            "cpu": self.cpu,
            "memory": self.memory,
            "gpus": self.gpus,
            "maxPods": self.max_pods,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeSpec:
        return cls(
            name=str(d["name"]),
            ip=str(d["ip"]),
            labels={str(k): str(v) for k, v in dict(d.get("labels", {})).items()},
            cpu=str(d.get("cpu", "16")),
            memory=str(d.get("memory", "64Gi")),
            gpus=int(d.get("gpus", 0)),
            max_pods=int(d.get("maxPods", 110)),
        )


@dataclass(frozen=True)
class ClusterShape:
    """What ``railyard local up`` was asked for, before nodes are generated."""

    nodes: int = 4
    gpus_per_node: int = 0
    levels: tuple[Level, ...] = field(default_factory=lambda: parse_topology_spec(DEFAULT_TOPOLOGY))
    cpu: str = "16"
    memory: str = "64Gi"
    max_pods: int = 110
    name_prefix: str = "node-"
    #: first node's address is 127.0.0.(10 + ip_offset): two clusters on one machine stay apart
    ip_offset: int = 0


def parse_topology_spec(spec: str) -> tuple[Level, ...]:
    """``"spine=2,leaf=2"`` -> levels top-down. Raises :class:`TopologyError` naming the fix."""
    levels: list[Level] = []
    problems: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, sep, count = part.partition("=")
        name = name.strip()
        if not sep or not name or not count.strip().isdigit() or int(count) < 1:
            problems.append(f"topology: {part!r} must look like 'NAME=COUNT' with COUNT >= 1, e.g. 'leaf=4'")
            continue
        if not _is_label_name(name):
            problems.append(f"topology: level name {name!r} must be a lowercase DNS label, e.g. 'spine'")
            continue
        if any(lv.name == name for lv in levels):
            problems.append(f"topology: level {name!r} appears twice")
            continue
        levels.append(Level(name, int(count)))
    if not levels and not problems:
        problems.append("topology: empty; give at least one level, e.g. 'spine=2,leaf=2'")
    if problems:
        raise TopologyError("; ".join(problems))
    return tuple(levels)


def parse_topology_file(doc: Mapping[str, Any]) -> ClusterShape:
    """A topology YAML document (already loaded) -> shape. Unknown keys are errors."""
    known = {"nodes", "gpusPerNode", "levels", "cpu", "memory", "maxPods", "namePrefix", "ipOffset"}
    problems = [f"{k}: unknown field; known fields are {sorted(known)}" for k in doc if k not in known]
    levels_raw = doc.get("levels", DEFAULT_TOPOLOGY)
    levels: tuple[Level, ...] = ()
    try:
        if isinstance(levels_raw, str):
            levels = parse_topology_spec(levels_raw)
        elif isinstance(levels_raw, list):
            parts = []
            for i, item in enumerate(levels_raw):
                if not isinstance(item, Mapping) or "name" not in item or "count" not in item:
                    problems.append(f"levels[{i}]: must be a mapping with 'name' and 'count'")
                    continue
                parts.append(f"{item['name']}={item['count']}")
            if parts:
                levels = parse_topology_spec(",".join(parts))
        elif isinstance(levels_raw, Mapping):
            levels = parse_topology_spec(",".join(f"{k}={v}" for k, v in levels_raw.items()))
        else:
            problems.append("levels: must be 'spine=2,leaf=2', a list of {name, count} or a mapping")
    except TopologyError as exc:
        problems.append(str(exc))
    for key in ("nodes", "gpusPerNode", "maxPods"):
        if key in doc and (not isinstance(doc[key], int) or doc[key] < 0):
            problems.append(f"{key}: must be a non-negative integer, got {doc[key]!r}")
    if problems:
        raise TopologyError("; ".join(problems))
    return ClusterShape(
        nodes=int(doc.get("nodes", 4)),
        gpus_per_node=int(doc.get("gpusPerNode", 0)),
        levels=levels,
        cpu=str(doc.get("cpu", "16")),
        memory=str(doc.get("memory", "64Gi")),
        max_pods=int(doc.get("maxPods", 110)),
        name_prefix=str(doc.get("namePrefix", "node-")),
        ip_offset=int(doc.get("ipOffset", 0)),
    )


def node_ip(index: int) -> str:
    """Each simulated node's own loopback address: 127.0.0.10, .11, ... (all of 127/8 is lo)."""
    return str(FIRST_NODE_IP + index)


def build_topology_labels(name: str, path: list[tuple[str, str]]) -> dict[str, str]:
    """Labels for a node under ``path`` (top-down list of (level, domain))."""
    labels = {HOSTNAME_LABEL: name}
    for level, domain in path:
        labels[f"{GROUP}/{level}"] = domain
    if path:
        labels["cloud.google.com/gce-topology-block"] = path[0][1]
        labels["cloud.google.com/gce-topology-subblock"] = path[-1][1]
        labels["cloud.google.com/gce-topology-host"] = name
    for tier, (_, domain) in enumerate(reversed(path)):
        labels[f"fabric.topograph.run/tier-{tier}"] = domain
        if tier < len(TOPOGRAPH_TREE):
            labels[f"network.topology.nvidia.com/{TOPOGRAPH_TREE[tier]}"] = domain
    return labels


def build_nodes(shape: ClusterShape) -> list[NodeSpec]:
    """The nodes of ``shape`` with names, addresses and labels."""
    if shape.nodes < 1:
        raise TopologyError(f"nodes: {shape.nodes}; a cluster needs at least one node")
    if shape.gpus_per_node < 0:
        raise TopologyError("gpusPerNode: must be >= 0")
    levels = shape.levels
    leaves = math.prod(lv.count for lv in levels) if levels else 1
    per_leaf = max(1, math.ceil(shape.nodes / leaves))
    nodes: list[NodeSpec] = []
    for i in range(shape.nodes):
        leaf = i // per_leaf
        path: list[tuple[str, str]] = []
        below = leaves
        for lv in levels:
            below //= lv.count
            path.append((lv.name, f"{lv.name}-{leaf // below}"))
        name = f"{shape.name_prefix}{i}"
        labels = build_topology_labels(name, path)
        labels.update(
            {
                SIMULATED_LABEL: "true",
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "railyard-local",
            }
        )
        if shape.gpus_per_node:
            labels["nvidia.com/gpu.count"] = str(shape.gpus_per_node)
            labels["nvidia.com/gpu.present"] = "true"
        nodes.append(
            NodeSpec(
                name=name,
                ip=node_ip(i + shape.ip_offset),
                labels=labels,
                cpu=shape.cpu,
                memory=shape.memory,
                gpus=shape.gpus_per_node,
                max_pods=shape.max_pods,
            )
        )
    return nodes


def _is_label_name(name: str) -> bool:
    return (
        bool(name)
        and len(name) <= 63
        and all(c.isdigit() or c.islower() or c == "-" for c in name)
        and name[0].isalnum()
        and name[-1].isalnum()
    )
