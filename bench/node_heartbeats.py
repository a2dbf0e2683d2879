"""Benchmark: the local node agent keeps 2,048 nodes Ready past the node-monitor grace period.

A real kube-controller-manager marks a node NotReady 50 s (its grace period) after the node's
last Lease renewal or status; the embedded API server applies the same rule
(apiserver/nodelifecycle.py). Issue 46: the agent stretched its renewals with the node count
(every 104 s at 2,088 nodes) and every node went NotReady on a real control plane. Here the
local cluster registers ``--nodes`` nodes, then for ``--hold`` seconds (longer than grace
period + monitor period) one watch of the nodes and one of their Leases record:

- nodes that were ever not Ready (target 0), from the watch and from the ``NodeNotReady`` Events
  of the node lifecycle controller since the cluster started (registration included: a node
  marked Unknown while the others were still registering, and Ready again before the watch
  began, counts), and nodes Ready at the end (target: all);
- the Lease renewals per second the agent makes (a kubelet's rate: nodes / 10 s) and the
  longest any node went without one (target: well under the grace period);
- what it costs: CPU seconds per second of the agent (the runtime process) and of the API server.

    python bench/node_heartbeats.py [--nodes 2048] [--hold 75] [--kubeconfig K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import write_results
from railyard.k8s.client import Kube
from railyard_local.cluster import LocalCluster
from railyard_local.nodes import LEASE_NS

ROOT = Path(__file__).resolve().parents[1]
#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "local_cluster/railyard_local/nodes.py",
    "local_cluster/railyard_local/runtime.py",
    "local_cluster/railyard_local/apiserver/nodelifecycle.py",
    "local_cluster/railyard_local/apiserver/server.py",
)
GRACE_S = 50.0


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Observer:
    """One watch of the bench's nodes and one of the node Leases."""

    def __init__(self, kube: Kube, names: set[str], selector: str) -> None:
        self.kube = kube
        self.names = names
        self.selector = selector
        self.ever_not_ready: dict[str, str] = {}
        self.ready: dict[str, bool] = {}
        self.renewals = 0
        self.last_renewal: dict[str, float] = {}
        self.longest_gap_s = 0.0
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        nodes = await self.kube.request("GET", "/api/v1/nodes", params={"labelSelector": self.selector})
        for node in nodes.get("items") or []:
            self._node(node)
        leases = await self.kube.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases")
        now = time.perf_counter()
        for lease in leases.get("items") or []:
            if lease["metadata"]["name"] in self.names:
                self.last_renewal[lease["metadata"]["name"]] = now
        self.tasks = [
            asyncio.create_task(self._watch("/api/v1/nodes", nodes["metadata"]["resourceVersion"], self._node,
                                            {"labelSelector": self.selector})),
            asyncio.create_task(self._watch(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases",
                                            leases["metadata"]["resourceVersion"], self._lease, {})),
        ]

    def _node(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
        self.ready[name] = ready.get("status") == "True"
        if not self.ready[name] and name not in self.ever_not_ready:
            self.ever_not_ready[name] = f"{ready.get('status')} {ready.get('reason')}: {ready.get('message')}"

    def _lease(self, lease: dict[str, Any]) -> None:
        name = lease["metadata"]["name"]
        if name not in self.names:
            return
        now = time.perf_counter()
        self.renewals += 1
        last = self.last_renewal.get(name)
        if last is not None:
            self.longest_gap_s = max(self.longest_gap_s, now - last)
        self.last_renewal[name] = now

    async def _watch(self, path: str, rv: str, seen: Any, params: dict[str, str]) -> None:
        sess = self.kube._sess()
        while True:
            query = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "300", "allowWatchBookmarks": "true",
                     **params}
            async with sess.get(f"{self.kube.server}{path}", params=query, timeout=None) as resp:
                async for line in resp.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        seen(obj)

    def stale_now(self) -> float:
        """The longest any node has gone without a renewal, counting the ones still waiting."""
        now = time.perf_counter()
        return max([self.longest_gap_s, *(now - t for t in self.last_renewal.values())])

    async def not_ready_events(self) -> dict[str, str]:
        """The bench's nodes the node lifecycle controller ever marked NotReady (its Events, which
        outlive the watch: kube-controller-manager's and the embedded rule's alike)."""
        events = await self.kube.list("/api/v1/namespaces/default/events")
        return {ev["involvedObject"]["name"]: f"NodeNotReady Event at {ev.get('lastTimestamp')}" for ev in events
                if ev.get("reason") == "NodeNotReady" and (ev.get("involvedObject") or {}).get("name") in self.names}

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def hold(kubeconfig: Path, names: set[str], selector: str, seconds: float, pids: dict[str, int]) -> dict[str, float]:
    kube = Kube.from_config(str(kubeconfig))
    observer = Observer(kube, names, selector)
    try:
        await observer.start()
        cpu0 = {name: _cpu_of(pid) for name, pid in pids.items()}
        t0 = time.perf_counter()
        renewals0 = observer.renewals
        while time.perf_counter() - t0 < seconds:
            await asyncio.sleep(5.0)
            print(f"  {time.perf_counter() - t0:5.0f}s: {sum(observer.ready.values())}/{len(names)} Ready, "
                  f"{(observer.renewals - renewals0) / (time.perf_counter() - t0):.0f} renewals/s, "
                  f"longest without a renewal {observer.stale_now():.1f}s", flush=True)
        took = time.perf_counter() - t0
        for name, why in (await observer.not_ready_events()).items():
            observer.ever_not_ready.setdefault(name, why)
        out = {f"{name}_cpu_per_s": (_cpu_of(pid) - cpu0[name]) / took for name, pid in pids.items()}
        out.update({
            "held_s": took,
            "nodes_ever_not_ready": float(len(observer.ever_not_ready)),
            "nodes_ready_at_end": float(sum(1 for n in names if observer.ready.get(n))),
            "lease_renewals_per_s": (observer.renewals - renewals0) / took,
            "longest_without_renewal_s": observer.stale_now(),
        })
        if observer.ever_not_ready:
            first = sorted(observer.ever_not_ready.items())[:3]
            print(f"not Ready at some point: {len(observer.ever_not_ready)} nodes, e.g. {first}", flush=True)
        return out
    finally:
        await observer.stop()
        await kube.close()


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2048)
    parser.add_argument("--hold", type=float, default=75.0,
                        help="seconds to watch after registration (default 75: grace period 50 s + monitor period 5 s + margin)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "node_heartbeats.json"))
    parser.add_argument("--kubeconfig", help="join this API server instead (existing mode; the nodes are removed at the end)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)  # cleanup below runs on SIGTERM as on Ctrl-C
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", kubeconfig=args.kubeconfig, nodes=args.nodes, gpus_per_node=1,
                               topology="spine=4,leaf=16", lease_interval=10.0, node_prefix="hb-",
                               node_monitor_grace_period=GRACE_S)
        t0 = time.perf_counter()
        try:
            kubeconfig = cluster.start(timeout=900)
            up_s = time.perf_counter() - t0
            print(f"local cluster ({cluster.mode}) with {args.nodes} nodes up in {up_s:.1f}s", flush=True)
            pids = {name: proc.pid for name, proc in cluster._procs.items()}
            names = {s.name for s in cluster.node_specs}
            selector = ",".join(f"{k}={v}" for k, v in cluster.node_selector.items())
            m = asyncio.run(hold(kubeconfig, names, selector, args.hold, pids))
        finally:
            cluster.stop()
            if cluster.mode == "existing":
                cluster.remove_nodes()
    m["nodes_up_s"] = up_s
    rows: list[tuple[str, float, str, float | None, bool]] = [
        ("nodes ever not Ready", m["nodes_ever_not_ready"], "nodes", 0.0, False),
        ("nodes Ready at the end", m["nodes_ready_at_end"], "nodes", float(args.nodes), True),
        (f"held past the last registration (grace {GRACE_S:g} s)", m["held_s"], "s", GRACE_S + 5, True),
        ("longest a node went without a Lease renewal", m["longest_without_renewal_s"], "s", GRACE_S / 2, False),
        ("Lease renewals per second", m["lease_renewals_per_s"], "1/s", None, False),
        ("node agent (runtime process) CPU per second", m.get("runtime_cpu_per_s", 0.0), "s/s", None, False),
        ("API server CPU per second", m.get("apiserver_cpu_per_s", 0.0), "s/s", None, False),
        ("nodes registered and Ready (cluster up)", m["nodes_up_s"], "s", None, False),
    ]
    results = []
    print(f"{'metric':<52}{'value':>10}  {'unit':<6}{'target':>8}  meets")
    for metric, value, unit, target, higher in rows:
        meets = None if target is None else (value >= target if higher else value <= target)
        results.append({"metric": metric, "value": round(value, 4), "unit": unit, "target": target, "meets": meets})
        shown = "" if target is None else f"{target:g}"
        print(f"{metric:<52}{value:>10.3f}  {unit:<6}{shown:>8}  {'' if meets is None else ('yes' if meets else 'NO')}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_results(Path(args.out), {"bench": "node_heartbeats", "nodes": args.nodes, "apiServer": cluster.mode,
                                   "results": results, "raw": m}, MEASURES, indent=2)
    print(f"wrote {args.out}")
    return 0 if all(r["meets"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
