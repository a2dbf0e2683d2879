"""Benchmark: the embedded API server (railyard_local.apiserver) as the operator would load it.

Runs the server as its own process (``python -m railyard_local.apiserver``, TLS + token, fresh
state dir) and measures from one client process:

- pod create throughput: 2,000 Pods POSTed by one aiohttp client with 32 requests in flight,
  each acknowledged only after its SQLite commit (target >= 300 pods/s, the gang-start target);
- load: 4,096 Nodes and 16,384 Pods created, then listed, with a watch open on each kind;
  server memory (RSS, and its peak VmHWM) after list + watch (target < 1.5 GiB);
- watch event latency: 500 status patches on pods, sent at ~100/s; latency from sending the
  patch to the watcher receiving its MODIFIED event (p50/p99).

Run: ``python bench/apiserver.py [--quick]`` (about a minute on 2 cores; --quick uses 1/8 of the
load). Writes bench/results/apiserver.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from provenance import write_results
from railyard_local.apiserver.process import ServerProcess, start_server_process

#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "local_cluster/railyard_local/apiserver",
)


RESULTS = Path(__file__).parent / "results" / "apiserver.json"


def pod_body(i: int, node: str | None = None) -> dict[str, Any]:
    """A pod shaped like the trainer pods the operator creates (env, resources, labels, gates)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"job-{i // 8}-rank-{i}", "labels": {
            "railyard.io/job": f"job-{i // 8}", "railyard.io/rank": str(i), "railyard.io/role": "worker"},
            "annotations": {"railyard.io/rank-table": "v1"}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "schedulingGates": [] if node else [{"name": "railyard.io/gang"}],
            "containers": [{
                "name": "trainer", "image": "railyard/trainer:0.1.0",
                "command": ["railyard-train"], "args": ["--config", "/etc/railyard/job.yaml"],
                "env": [{"name": "RANK", "value": str(i)}, {"name": "WORLD_SIZE", "value": "16384"},
                        {"name": "MASTER_ADDR", "value": "job-0-rank-0"}, {"name": "MASTER_PORT", "value": "29500"}],
                "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
                              "limits": {"nvidia.com/gpu": "1"}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/railyard"}],
            }],
            "volumes": [{"name": "config", "configMap": {"name": "job-config"}}],
        },
    }


def node_body(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": f"node-{i:05d}", "labels": {
            "kubernetes.io/hostname": f"node-{i:05d}", "railyard.dev/spine": f"s{i // 512}",
            "railyard.dev/leaf": f"l{i // 32}", "network.topology.kubernetes.io/block": f"b{i // 512}"}},
        "spec": {},
        "status": {
            "capacity": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": "2026-01-01T00:00:00Z"}],
            "addresses": [{"type": "InternalIP", "address": f"127.0.{i // 256}.{i % 256}"}],
        },
    }


def rss_bytes(pid: int) -> tuple[int, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def session(proc: ServerProcess, limit: int = 64) -> aiohttp.ClientSession:
    ctx = ssl.create_default_context(cafile=str(proc.ca_file)) if proc.ca_file else False
    return aiohttp.ClientSession(headers={"Authorization": f"Bearer {proc.token}"},
                                 connector=aiohttp.TCPConnector(ssl=ctx, limit=limit),
                                 timeout=aiohttp.ClientTimeout(total=600))


async def create_all(s: aiohttp.ClientSession, url: str, path: str, bodies: list[dict[str, Any]],
                     concurrency: int) -> float:
    """POST every body with ``concurrency`` in flight; return objects per second."""
    queue = list(reversed(bodies))

    async def worker() -> None:
        while queue:
            body = queue.pop()
            async with s.post(url + path, json=body) as r:
                if r.status != 201:
                    raise RuntimeError(f"POST {path}: {r.status} {await r.text()}")
                await r.read()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(bodies) / (time.perf_counter() - start)


async def run(scale: int) -> list[dict[str, Any]]:
    n_nodes, n_pods, n_throughput = 4096 // scale, 16384 // scale, 2000 // scale
    results: list[dict[str, Any]] = []

    def add(metric: str, value: float, unit: str, target: str = "", meets: bool | None = None) -> None:
        results.append({"metric": metric, "value": value, "unit": unit, "target": target, "meets": meets})

    import os

    add("machine load average (1 min) at start; the cores are shared", round(os.getloadavg()[0], 2), "")
    with tempfile.TemporaryDirectory(prefix="railyard-bench-apiserver-") as tmp:
        proc = start_server_process(Path(tmp) / "state")
        try:
            async with session(proc) as s:
                url = proc.url
                await s.post(url + "/api/v1/namespaces", json={"metadata": {"name": "bench"}})
                rate = await create_all(s, url, "/api/v1/namespaces/bench/pods",
                                        [pod_body(i) for i in range(n_throughput)], 32)
                add("pod create throughput (1 client, 32 in flight, durable)", round(rate, 1), "pods/s",
                    ">= 300", rate >= 300)
                async with s.delete(url + "/api/v1/namespaces/bench/pods",
                                    params={"gracePeriodSeconds": "0"}) as r:
                    await r.read()

                node_rate = await create_all(s, url, "/api/v1/nodes", [node_body(i) for i in range(n_nodes)], 32)
                add(f"node create throughput ({n_nodes} nodes)", round(node_rate, 1), "nodes/s")
                pods = [pod_body(i, node=f"node-{i // 4:05d}") for i in range(n_pods)]
                bulk_rate = await create_all(s, url, "/api/v1/namespaces/bench/pods", pods, 32)
                add(f"pod create throughput while loading {n_pods} pods", round(bulk_rate, 1), "pods/s")

                t = time.perf_counter()
                async with s.get(url + "/api/v1/nodes") as r:
                    nodes = await r.json()
                list_nodes_s = time.perf_counter() - t
                t = time.perf_counter()
                async with s.get(url + "/api/v1/pods") as r:
                    listed = await r.json()
                list_pods_s = time.perf_counter() - t
                assert len(nodes["items"]) == n_nodes and len(listed["items"]) == n_pods
                add(f"list {n_nodes} nodes", round(list_nodes_s, 3), "s")
                add(f"list {n_pods} pods", round(list_pods_s, 3), "s")

                received: dict[str, float] = {}
                ready = asyncio.Event()

                async def watch(path: str, rv: str, record: bool) -> None:
                    async with s.get(url + path, params={"watch": "1", "resourceVersion": rv,
                                                         "allowWatchBookmarks": "true"}) as r:
                        ready.set()
                        async for line in r.content:
                            if record:
                                ev = json.loads(line)
                                if ev["type"] == "MODIFIED":
                                    received[ev["object"]["metadata"]["annotations"].get("bench/seq", "")] = \
                                        time.perf_counter()

                watchers = [asyncio.create_task(watch("/api/v1/nodes", nodes["metadata"]["resourceVersion"], False)),
                            asyncio.create_task(watch("/api/v1/pods", listed["metadata"]["resourceVersion"], True))]
                await ready.wait()
                rss, _ = rss_bytes(proc.pid)
                add(f"server RSS after list+watch of {n_nodes} nodes and {n_pods} pods", round(rss / 2**20, 1),
                    "MiB", "< 1536", rss < 1.5 * 2**30)

                sent: dict[str, float] = {}
                n_events = 500 // scale
                for i in range(n_events):
                    name = pods[(i * 7919) % n_pods]["metadata"]["name"]
                    seq = str(i)
                    sent[seq] = time.perf_counter()
                    async with s.patch(url + f"/api/v1/namespaces/bench/pods/{name}",
                                       data=json.dumps({"metadata": {"annotations": {"bench/seq": seq}}}),
                                       headers={"Content-Type": "application/merge-patch+json"}) as r:
                        await r.read()
                    await asyncio.sleep(0.01)
                deadline = time.perf_counter() + 10
                while len(received) < n_events and time.perf_counter() < deadline:
                    await asyncio.sleep(0.05)
                lat = sorted((received[k] - sent[k]) * 1000 for k in sent if k in received)
                for w in watchers:
                    w.cancel()
                add("watch events delivered", len(lat), "events", f"{n_events}", len(lat) == n_events)
                if lat:
                    add("watch event latency p50 (patch sent -> event received)", round(statistics.median(lat), 2),
                        "ms")
                    add("watch event latency p99", round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2), "ms")
                rss, hwm = rss_bytes(proc.pid)
                add("server peak RSS (VmHWM) over the whole run", round(hwm / 2**20, 1), "MiB", "< 1536",
                    hwm < 1.5 * 2**30)
        finally:
            proc.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1/8 of the load (same as --scale 8)")
    parser.add_argument("--scale", type=int, default=1, help="divide the load by this (tests/bench runs it at 64)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"where to write the results (default {RESULTS}, and only at full load)")
    args = parser.parse_args()
    scale = max(args.scale, 8 if args.quick else 1)
    results = asyncio.run(run(scale))
    width = max(len(r["metric"]) for r in results)
    print(f"{'metric':<{width}}  {'value':>10}  {'unit':<7}  {'target':<8}  meets")
    for r in results:
        meets = "" if r["meets"] is None else ("yes" if r["meets"] else "NO")
        print(f"{r['metric']:<{width}}  {r['value']:>10}  {r['unit']:<7}  {r['target']:<8}  {meets}")
    out = args.out or (RESULTS if scale == 1 else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_results(out, {"bench": "apiserver", "scale": scale, "results": results}, MEASURES, indent=2)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
