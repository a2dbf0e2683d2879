"""Benchmark: the operator starting a 1,000-pod gang, and restarting a 256-pod gang after a node
failure, on the local cluster (1,000 simulated nodes).

The operator runs as it does in production (``railyard operator run`` in its own process) and
is told to annotate pods ``local.railyard.dev/simulate=true`` so the local node agent reports
them Running without starting 1,000 processes on a 2-core machine: the numbers measure the
operator + API server + scheduler + agent, not process start-up. Measured from a watch:

- apply -> all 1,000 pods created (target >= 355 pods/s, the figure of issue 46; TARGETS.md "gang start" asks > 300);
- apply -> all 1,000 pods Running;
- a node of a running 256-pod gang fails -> the whole gang Running again (sticky: one pod moves).

With ``--kubeconfig`` the simulated nodes and the local node agent join that API server instead of
the embedded one (existing mode: its scheduler binds the pods; the nodes are removed at the end).

    python bench/operator.py [--pods 1000] [--restart-pods 256] [--nodes 1000] [--kubeconfig K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from provenance import write_results
from railyard.k8s.client import Kube
from railyard.protocol.ports import free_port as _free_port
from railyard_local.agent import SIMULATE_ANNOTATION
from railyard_local.cluster import LocalCluster
from railyard_local.nodes import FAIL_ANNOTATION

#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "operator/railyard/handlers",
    "operator/railyard/k8s",
    "operator/railyard/logic",
    "local_cluster/railyard_local",
)


ROOT = Path(__file__).resolve().parents[1]
#: Gang start: issue 46 holds the figure this bench measured before it regressed (355 pods/s).
TARGET_PODS_PER_S = 355.0
TARGET_RECOVERY_S = 30.0
NS = "bench"
#: The embedded API server bookmarks every 15 s: a watch quiet for longer than this is dead.
WATCH_INACTIVITY_S = 30.0


def job(name: str, pods: int, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "railyard.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodes": pods,
            "procsPerNode": 1,
            "nodeSelector": selector,  # the bench's own nodes, whatever else the API server has
            "command": ["true"],
            "trainer": {"batchSize": pods},
            "gang": {"scheduleTimeoutSeconds": 600},
            "restartPolicy": {"infrastructure": {"limit": 5, "backoffSeconds": 0}},
        },
    }


class PodWatch:
    """Times of the first ADDED and first Running per pod name, and the node each pod was bound
    to, from one watch."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.added: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.node: dict[str, str] = {}
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listing = await self.kube.request("GET", f"/api/v1/namespaces/{NS}/pods")
        rv = listing["metadata"]["resourceVersion"]
        self.task = asyncio.create_task(self._run(rv))

    async def _run(self, rv: str) -> None:
        """Watch until cancelled; a stream that ends, breaks or delivers nothing (not even a
        bookmark) for WATCH_INACTIVITY_S is watched again from the last resourceVersion."""
        sess = self.kube._sess()
        url = f"{self.kube.server}/api/v1/namespaces/{NS}/pods"
        while True:
            params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "300", "allowWatchBookmarks": "true"}
            try:
                async with sess.get(url, params=params, timeout=aiohttp.ClientTimeout(total=330, sock_read=WATCH_INACTIVITY_S)) as resp:
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        ev = json.loads(line)
                        obj = ev.get("object") or {}
                        meta = obj.get("metadata") or {}
                        if ev.get("type") == "ERROR":  # 410: too old, start from a fresh list
                            listing = await self.kube.request("GET", f"/api/v1/namespaces/{NS}/pods")
                            rv = listing["metadata"]["resourceVersion"]
                            for pod in listing.get("items") or []:
                                self._see("MODIFIED", pod, time.perf_counter())
                            break
                        rv = meta.get("resourceVersion", rv)
                        if ev.get("type") == "BOOKMARK":
                            continue
                        self._see(str(ev.get("type")), obj, time.perf_counter())
            except (aiohttp.ClientError, TimeoutError) as exc:
                print(f"pod watch: {exc!r}; watching again from {rv}", flush=True)

    def _see(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        if kind == "ADDED":
            self.added.setdefault(name, now)
        if (obj.get("spec") or {}).get("nodeName"):
            self.node[name] = obj["spec"]["nodeName"]
        if (obj.get("status") or {}).get("phase") == "Running" and not meta.get("deletionTimestamp"):
            self.running.setdefault(name, now)

    async def until(self, what: str, pred: Any, timeout: float) -> float:
        deadline = time.perf_counter() + timeout
        report = time.perf_counter() + 30
        while time.perf_counter() < deadline:
            if time.perf_counter() > report:
                report += 30
                print(f"  still waiting for {what}: {len(self.added)} pods seen, {len(self.running)} Running", flush=True)
            if pred():
                return time.perf_counter()
            if self.task is not None and self.task.done():
                exc = None if self.task.cancelled() else self.task.exception()
                raise RuntimeError(f"the pod watch ended while waiting for {what}: {exc!r}") from exc
            await asyncio.sleep(0.02)
        raise TimeoutError(f"{what} not reached within {timeout}s ({len(self.added)} pods seen, {len(self.running)} Running)")

    def stop(self) -> None:
        if self.task:
            self.task.cancel()


def _names(job_name: str, attempt: int, n: int) -> list[str]:
    return [f"{job_name}-a{attempt}-{i}" for i in range(n)]


async def run_bench(kubeconfig: Path, pods: int, restart_pods: int, metrics_port: int, selector: dict[str, str]) -> dict[str, float]:
    kube = Kube.from_config(str(kubeconfig))
    out: dict[str, float] = {}
    try:
        w = PodWatch(kube)
        await w.start()
        # -- gang start
        names = _names("big", 0, pods)
        t0 = time.perf_counter()
        await kube.create(f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs", job("big", pods, selector))
        t_created = await w.until("all pods created", lambda: all(n in w.added for n in names), 600)
        t_running = await w.until("all pods Running", lambda: all(n in w.running for n in names), 600)
        first = min(w.added[n] for n in names)
        out["apply_to_created_s"] = t_created - t0
        out["created_rate"] = pods / (t_created - t0)
        out["created_rate_first_to_last"] = pods / max(max(w.added[n] for n in names) - first, 1e-9)
        out["apply_to_running_s"] = t_running - t0
        out["apply_to_first_pod_s"] = first - t0
        print(f"gang start: {out}", flush=True)
        await kube.delete(f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs/big")
        await w.until("big gang gone", lambda: True, 1)
        for _ in range(600):
            left = await kube.list(f"/api/v1/namespaces/{NS}/pods", labelSelector="railyard.dev/job=big")
            if not left:
                break
            await asyncio.sleep(0.2)
        # -- restart after a node failure
        names0 = _names("mid", 0, restart_pods)
        t0 = time.perf_counter()
        await kube.create(f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs", job("mid", restart_pods, selector))
        await w.until("mid gang Running", lambda: all(n in w.running for n in names0), 600)
        out["mid_apply_to_running_s"] = time.perf_counter() - t0
        await _status(kube, "mid", lambda st: st.get("phase") == "Running", 600)
        # the node a pod of the gang really runs on (from the pods, not from status.placement:
        # a node the gang does not use would fail without effect)
        victim = w.node[names0[len(names0) // 2]]
        names1 = _names("mid", 1, restart_pods)
        t_fail = time.perf_counter()
        await kube.patch(f"/api/v1/nodes/{victim}", {"metadata": {"annotations": {FAIL_ANNOTATION: "true"}}})
        tracer = asyncio.create_task(_status(kube, "mid", lambda s: False, 600))  # prints each phase meanwhile
        try:
            t_back = await w.until("mid gang Running again", lambda: all(n in w.running for n in names1), 600)
        finally:
            tracer.cancel()
            await asyncio.gather(tracer, return_exceptions=True)
        out["failure_to_all_running_s"] = t_back - t_fail
        await _status(kube, "mid", lambda s: s.get("attempt") == 1 and s.get("phase") == "Running", 600)
        out["pods_moved"] = float(sum(1 for a, b in zip(names0, names1, strict=True) if w.node.get(a) != w.node.get(b)))
        await kube.patch(f"/api/v1/nodes/{victim}", {"metadata": {"annotations": {FAIL_ANNOTATION: None}}})
        # nothing left behind on a given API server
        await kube.delete(f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs/mid")
        for _ in range(600):
            if not await kube.list(f"/api/v1/namespaces/{NS}/pods", labelSelector="railyard.dev/job=mid"):
                break
            await asyncio.sleep(0.2)
        w.stop()
    finally:
        await kube.close()
    out.update(_scrape(metrics_port))
    return out


async def _status(kube: Kube, name: str, pred: Any, timeout: float) -> dict[str, Any]:
    """Poll the job's status until ``pred``; every phase it passes through is printed (a
    post-mortem of a slow run starts there). ``timeout`` only catches a stuck operator."""
    deadline = time.perf_counter() + timeout
    st: dict[str, Any] = {}
    seen: tuple[Any, ...] = ()
    while time.perf_counter() < deadline:
        obj = await kube.get(f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs/{name}")
        st = (obj or {}).get("status") or {}
        now = (st.get("phase"), st.get("attempt"), st.get("message"))
        if now != seen:
            seen = now
            print(f"  {name}: phase {now[0]}, attempt {now[1]}: {str(now[2])[:160]}", flush=True)
        if pred(st):
            return st
        await asyncio.sleep(0.1)
    raise TimeoutError(f"status of {name} after {timeout:g}s: {json.dumps(st)[:3000]}")


def _wait_ready(port: int, op: subprocess.Popen[bytes]) -> None:
    """Until the operator has listed the cluster (/readyz): its start-up is not gang start."""
    import urllib.request

    deadline = time.perf_counter() + 300
    while time.perf_counter() < deadline:
        if op.poll() is not None:
            raise RuntimeError(f"operator exited with {op.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError("operator not ready")


def _scrape(port: int) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "railyard_placement_decision_seconds":
            s = {x.name: x.value for x in fam.samples}
            if s.get("railyard_placement_decision_seconds_count"):
                out["placement_mean_s"] = s["railyard_placement_decision_seconds_sum"] / s["railyard_placement_decision_seconds_count"]
        if fam.name == "railyard_reconcile_errors":
            out["reconcile_errors"] = sum(x.value for x in fam.samples if x.name.endswith("_total"))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--restart-pods", type=int, default=256)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "operator.json"))
    parser.add_argument("--kubeconfig", help="measure on this API server: the simulated nodes and the local node agent join it "
                        "(existing mode; its scheduler binds the pods; the nodes are removed at the end)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]  # a shared machine's other work shows in every wall-clock figure here
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", kubeconfig=args.kubeconfig, nodes=args.nodes, gpus_per_node=1,
                               topology="spine=4,leaf=10", lease_interval=10.0, node_prefix="bench-")
        selector = cluster.node_selector
        t_start = time.perf_counter()
        kubeconfig = cluster.start(timeout=600)
        print(f"local cluster ({cluster.mode}) with {args.nodes} nodes up in {time.perf_counter() - t_start:.1f}s", flush=True)
        port = _free_port()
        op = None
        try:
            asyncio.run(_prepare(kubeconfig))
            log = open(Path(tmp) / "operator.log", "wb")  # noqa: SIM115 - closed below
            op = subprocess.Popen(
                [sys.executable, "-m", "railyard", "operator", "run", "--standalone", "--metrics-host", "127.0.0.1",
                 "--metrics-port", str(port), "--not-ready-grace", "0.5", "--kubeconfig", str(kubeconfig),
                 "--pod-annotation", f"{SIMULATE_ANNOTATION}=true", "--namespace", NS],
                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            )
            _wait_ready(port, op)
            print("operator ready", flush=True)
            m = asyncio.run(run_bench(kubeconfig, args.pods, args.restart_pods, port, selector))
        finally:
            if op is not None:
                op.terminate()
                op.wait(20)
            cluster.stop()
            if cluster.mode == "existing":
                cluster.remove_nodes()
    rows = [
        (f"apply -> all {args.pods} pods created", m["created_rate"], "pods/s", TARGET_PODS_PER_S, True),
        (f"apply -> all {args.pods} pods created", m["apply_to_created_s"], "s", None, False),
        ("first -> last pod created", m["created_rate_first_to_last"], "pods/s", TARGET_PODS_PER_S, True),
        (f"apply -> all {args.pods} pods Running", m["apply_to_running_s"], "s", None, False),
        (f"apply -> all {args.restart_pods} pods Running", m["mid_apply_to_running_s"], "s", None, False),
        (f"node failure -> all {args.restart_pods} Running again", m["failure_to_all_running_s"], "s", TARGET_RECOVERY_S, False),
        (f"pods moved by the restart (of {args.restart_pods})", m["pods_moved"], "pods", None, False),
        ("placement decision, mean", m.get("placement_mean_s", float("nan")), "s", None, False),
        ("reconcile errors", m.get("reconcile_errors", 0.0), "count", None, False),
    ]
    results = []
    print(f"{'metric':<48}{'value':>10}  {'unit':<7}{'target':>8}  meets")
    for metric, value, unit, target, higher in rows:
        meets = None if target is None else (value >= target if higher else value <= target)
        results.append({"metric": metric, "value": round(value, 4), "unit": unit, "target": target, "meets": meets})
        t = "" if target is None else f"{target:g}"
        print(f"{metric:<48}{value:>10.3f}  {unit:<7}{t:>8}  {'' if meets is None else ('yes' if meets else 'NO')}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    load = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    print(f"(1-minute load average: {load[0]} before, {load[1]} after, on {os.cpu_count()} CPUs)")
    write_results(Path(args.out), {"bench": "operator", "pods": args.pods, "nodes": args.nodes, "apiServer": cluster.mode,
                                   "machine": {"load_average_1m": load}, "results": results}, MEASURES, indent=2)
    print(f"wrote {args.out}")
    return 0


async def _prepare(kubeconfig: Path) -> None:
    """The CRD, and the namespace the operator is told to watch (before it starts)."""
    kube = Kube.from_config(str(kubeconfig))
    try:
        await kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        await kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", yaml.safe_load((ROOT / "crds" / "trainingjob.yaml").read_text()))
        for _ in range(100):
            try:
                await kube.request("GET", "/apis/railyard.dev/v1alpha1/namespaces/default/trainingjobs")
                return
            except Exception:
                await asyncio.sleep(0.1)
    finally:
        await kube.close()


if __name__ == "__main__":
    sys.exit(main())
