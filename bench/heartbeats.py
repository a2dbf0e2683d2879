"""Heartbeat ingest and detection benchmark.

1. Ingest: the real aiohttp route (railyard.observe.heartbeats) in a server process; client
   processes (aiohttp, keep-alive, bounded concurrency) post batches for 2,048 pods x 8 ranks.
   Reports rank heartbeats/s at saturation, p50/p99 latency, and the server's RSS with every
   rank's window full (prefilled in the server process, the state the operator would hold).
2. Detection: the pure rules on synthetic streams (simulated time): latency per fault kind.
3. Evaluation cost: one decide_health over 16,384 ranks with full windows.

    python bench/heartbeats.py [--seconds 8] [--clients 2] [--concurrency 64]

Prints a table and writes bench/results/heartbeats.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

from provenance import write_results
from railyard.logic.health import FaultKind, HealthPolicy, HealthState, PodStatus, decide_health
from railyard.logic.health.window import HeartbeatStore
from railyard.observe.heartbeats import StaticTokens, build_heartbeat_app
from railyard.protocol.heartbeat import HealthResult, HeartbeatBatch, RankBeat
from railyard.protocol.ports import free_port as _free_port

#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "operator/railyard/observe/heartbeats.py",
    "operator/railyard/logic/health",
    "operator/railyard/protocol/heartbeat.py",
)


RESULTS = Path(__file__).parent / "results" / "heartbeats.json"
NS, JOB, TOKEN = "bench", "llm", "bench-token"
#: Pods of the ingest and evaluation parts (``--pods``; the env var carries it to the spawned server).
PODS_ENV = "RAILYARD_BENCH_HEARTBEAT_PODS"
PODS, RANKS_PER_POD = int(os.environ.get(PODS_ENV, "2048")), 8
TARGET_RATE = 20_000
#: Issue 46: the server's CPU per rank heartbeat, and so what one core ingests.
TARGET_CPU_US_PER_BEAT = 20.0
TARGET_CORE_CAPACITY = 40_000


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _batch(pod: int, step: int, now: float, rng: random.Random, attempt: int = 0) -> HeartbeatBatch:
    ranks = tuple(
        RankBeat(
            rank=pod * RANKS_PER_POD + i,
            step=step,
            step_time_s=1.0,
            compute_s=0.8 * (1 + rng.gauss(0, 0.03)),
            loss=2.0,
            grad_norm=1.0,
            tokens_per_s=4096.0,
            recent_compute_s=(0.8 * (1 + rng.gauss(0, 0.03)),),
        )
        for i in range(RANKS_PER_POD)
    )
    return HeartbeatBatch(JOB, attempt, pod, f"node-{pod}", now, ranks)


def prefill(store: HeartbeatStore, steps: int, start: float = 1_000_000.0) -> None:
    rng = random.Random(0)
    store.begin_attempt(NS, JOB, 0)
    for s in range(1, steps + 1):
        for p in range(PODS):
            store.ingest(NS, JOB, _batch(p, s, start + s, rng), start + s)


# ---------------------------------------------------------------------------- server process
def serve(port: int, prefill_steps: int, ready: Any) -> None:
    from aiohttp import web

    store = HeartbeatStore()
    rss_empty = _rss_bytes()
    prefill(store, prefill_steps)
    rss_full = _rss_bytes()
    app = build_heartbeat_app(store, StaticTokens({(NS, JOB): TOKEN}))

    async def stats(_: web.Request) -> web.Response:
        jw = store.job(NS, JOB)
        return web.json_response(
            {"cpu_s": time.process_time(), "rss_bytes": _rss_bytes(), "rss_empty": rss_empty, "rss_prefilled": rss_full, "rank_beats": jw.rank_beats if jw else 0, "ranks": len(jw.ranks) if jw else 0}
        )

    app.router.add_get("/bench/stats", stats)
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, handle_signals=True)


# ---------------------------------------------------------------------------- client process
def client(port: int, pods: list[int], seconds: float, concurrency: int, out: Any) -> None:
    import aiohttp

    async def main() -> dict[str, Any]:
        rng = random.Random(pods[0])
        url = f"http://127.0.0.1:{port}/v1/heartbeats/{NS}/{JOB}"
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        templates = {p: _batch(p, 999_999_999, 0.0, rng).to_json() for p in pods}
        lat: list[float] = []
        codes: dict[int, int] = {}
        step = 1_000
        queue: asyncio.Queue[int] = asyncio.Queue()
        for p in pods:
            queue.put_nowait(p)
        deadline = time.perf_counter() + seconds
        conn = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=conn) as session:

            async def worker() -> None:
                nonlocal step
                while time.perf_counter() < deadline:
                    p = await queue.get()
                    step += 1
                    body = templates[p].replace("999999999", str(step)).encode()
                    t0 = time.perf_counter()
                    async with session.post(url, data=body, headers=headers) as resp:
                        await resp.read()
                        codes[resp.status] = codes.get(resp.status, 0) + 1
                    lat.append(time.perf_counter() - t0)
                    queue.put_nowait(p)

            t_start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - t_start
        return {"requests": len(lat), "elapsed": elapsed, "lat": lat, "codes": codes}

    out.put(asyncio.run(main()))


def raw_client(port: int, pods: list[int], seconds: float, concurrency: int, out: Any) -> None:
    """Same load over keep-alive HTTP/1.1 written on asyncio streams: a much cheaper client,
    so a small machine measures the server rather than the client."""

    async def main() -> dict[str, Any]:
        rng = random.Random(pods[0])
        path = f"/v1/heartbeats/{NS}/{JOB}"
        templates = {p: _batch(p, 999_999_999, 0.0, rng).to_json() for p in pods}
        lat: list[float] = []
        codes: dict[int, int] = {}
        step = 1_000
        order = list(pods)
        deadline = time.perf_counter() + seconds

        async def conn(k: int) -> None:
            nonlocal step
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            i = k
            while time.perf_counter() < deadline:
                p = order[i % len(order)]
                i += concurrency
                step += 1
                body = templates[p].replace("999999999", str(step)).encode()
                head = (
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode()
                t0 = time.perf_counter()
                writer.write(head + body)
                status_line = await reader.readuntil(b"\r\n")
                headers = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in headers.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                if length:
                    await reader.readexactly(length)
                lat.append(time.perf_counter() - t0)
                code = int(status_line.split()[1])
                codes[code] = codes.get(code, 0) + 1
            writer.close()

        t_start = time.perf_counter()
        await asyncio.gather(*(conn(k) for k in range(concurrency)))
        return {"requests": len(lat), "elapsed": time.perf_counter() - t_start, "lat": lat, "codes": codes}

    out.put(asyncio.run(main()))


def bench_ingest(seconds: float, clients: int, concurrency: int, prefill_steps: int, raw: bool = False) -> dict[str, Any]:
    import urllib.request

    ctx = mp.get_context("spawn")
    port = _free_port()
    ready = ctx.Event()
    server = ctx.Process(target=serve, args=(port, prefill_steps, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(600):
            raise RuntimeError("server did not start")
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/stats", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        before = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/stats", timeout=5).read())
        q = ctx.Queue()
        shards = [list(range(i, PODS, clients)) for i in range(clients)]
        procs = [ctx.Process(target=raw_client if raw else client, args=(port, shard, seconds, concurrency, q)) for shard in shards]
        for p in procs:
            p.start()
        outs = [q.get(timeout=seconds + 120) for _ in procs]
        for p in procs:
            p.join(30)
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/bench/stats", timeout=5).read())
    finally:
        server.terminate()
        server.join(10)
    lat = sorted(x for o in outs for x in o["lat"])
    requests = sum(o["requests"] for o in outs)
    elapsed = max(o["elapsed"] for o in outs)
    codes: dict[str, int] = {}
    for o in outs:
        for k, v in o["codes"].items():
            codes[str(k)] = codes.get(str(k), 0) + v
    server_cpu = stats["cpu_s"] - before["cpu_s"]
    beats = stats["rank_beats"] - before["rank_beats"]
    return {
        "server_cpu_us_per_beat": 1e6 * server_cpu / max(1, beats),
        "server_cpu_share": server_cpu / elapsed,
        "rank_beats_per_s": requests * RANKS_PER_POD / elapsed,
        "requests_per_s": requests / elapsed,
        "p50_ms": 1e3 * lat[len(lat) // 2],
        "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "codes": codes,
        "server": stats,
    }


# ---------------------------------------------------------------------------- detection
class _Sim:
    """A job in simulated time: 64 pods x 8 ranks, beats every interval, timer every interval."""

    def __init__(self, policy: HealthPolicy, pods: int = 64, step_s: float = 1.0, seed: int = 0) -> None:
        self.policy, self.pods_n, self.step_s = policy, pods, step_s
        self.rng = random.Random(seed)
        self.store = HeartbeatStore()
        self.store.begin_attempt(NS, JOB, 0)
        self.state = HealthState()
        self.now, self.step, self.next_step_at = 0.0, 0, step_s
        self.silent: set[int] = set()
        self.stalled = False
        self.slow: dict[int, float] = {}
        self.health: dict[int, HealthResult] = {}
        self.pending: dict[int, list[float]] = {}
        self.pods = {p: PodStatus(p, "Running", f"node-{p}", 0.0) for p in range(pods)}

    def run_until(self, t_end: float) -> list[tuple[float, Any]]:
        found = []
        dt = self.policy.heartbeat_interval_s
        while self.now < t_end:
            self.now += dt
            while not self.stalled and self.next_step_at <= self.now:
                self.step += 1
                self.next_step_at += self.step_s
                for r in range(self.pods_n * RANKS_PER_POD):
                    c = 0.8 * (1 + self.rng.gauss(0, 0.03)) * self.slow.get(r, 1.0)
                    self.pending.setdefault(r, []).append(c)
            for p in range(self.pods_n):
                if p in self.silent:
                    continue
                ranks = []
                for r in range(p * RANKS_PER_POD, (p + 1) * RANKS_PER_POD):
                    rec = tuple(self.pending.pop(r, [])[-64:])
                    h = (self.health.pop(r),) if r in self.health else ()
                    ranks.append(RankBeat(rank=r, step=self.step, step_time_s=self.step_s, compute_s=rec[-1] if rec else 0.0, recent_compute_s=rec, health=h))
                self.store.ingest(NS, JOB, HeartbeatBatch(JOB, 0, p, f"node-{p}", self.now, tuple(ranks)), self.now)
            job = self.store.job(NS, JOB)
            assert job is not None
            d = decide_health(job, self.pods, self.state, self.policy, self.now)
            self.state = d.state
            found += [(self.now, v) for v in d.verdicts]
        return found


def bench_detection() -> list[tuple[str, float, str, str | None, bool | None]]:
    policy = HealthPolicy()  # defaults of spec.health: interval 2 s, timeout 10 s, hang floor 10 s x3
    rows: list[tuple[str, float, str, str | None, bool | None]] = []

    sim = _Sim(policy)
    sim.run_until(60)
    sim.silent = {5}
    t_fault = sim.now
    found = [(t, v) for t, v in sim.run_until(t_fault + 60) if v.kind is FaultKind.DEAD]
    lat = found[0][0] - t_fault if found else float("inf")
    rows.append(("detection: dead pod (heartbeat timeout 10 s)", round(lat, 2), "s", "<= 12", lat <= policy.heartbeat_timeout_s + policy.heartbeat_interval_s))

    for step_s in (1.0, 6.0):
        sim = _Sim(policy, step_s=step_s)
        sim.run_until(120)
        job = sim.store.job(NS, JOB)
        assert job is not None
        t_fault = max(r.step_advanced_at for r in job.ranks.values())
        sim.stalled = True
        found = [(t, v) for t, v in sim.run_until(sim.now + 120) if v.kind is FaultKind.HANG]
        lat = found[0][0] - t_fault if found else float("inf")
        bound = max(3 * step_s, policy.hang_timeout_floor_s)
        rows.append((f"detection: hang, step {step_s:g} s (bound max(3 x p99, 10 s) = {bound:g} s)", round(lat, 2), "s", f"<= {bound + policy.heartbeat_interval_s:g}", lat <= bound + policy.heartbeat_interval_s))

    sim = _Sim(policy)
    sim.run_until(60)
    sim.slow = {77: 1.3}
    s_fault = sim.step
    found = [(t, v) for t, v in sim.run_until(sim.now + 60) if v.kind is FaultKind.STRAGGLER]
    steps = (sim.step if not found else int(found[0][0] / sim.step_s)) - s_fault
    ok = bool(found) and found[0][1].rank == 77 and steps <= 20
    rows.append(("detection: straggler 1.3x (steps after slowdown)", steps, "steps", "<= 20", ok))

    sim = _Sim(policy, seed=3)
    clean = sum(1 for _, v in sim.run_until(400) if v.kind is FaultKind.STRAGGLER)
    rows.append(("false straggler flags, clean run of 400 steps x 512 ranks", clean, "flags", "0", clean == 0))

    sim = _Sim(policy)
    sim.run_until(20)
    sim.health[9] = HealthResult("replay", False, sim.step, "grad mismatch", confirmed=True)
    t_fault = sim.now
    found = [(t, v) for t, v in sim.run_until(sim.now + 10) if v.kind is FaultKind.SDC]
    lat = found[0][0] - t_fault if found else float("inf")
    rows.append(("detection: SDC verdict after the trainer's report", round(lat, 2), "s", "<= 4", lat <= 2 * policy.heartbeat_interval_s))
    return rows


def bench_evaluation() -> tuple[float, float]:
    store = HeartbeatStore()
    prefill(store, 40)
    job = store.job(NS, JOB)
    assert job is not None
    pods = {p: PodStatus(p, "Running", f"node-{p}", 0.0) for p in range(PODS)}
    policy = HealthPolicy()
    state = HealthState()
    wall, cpu = [], []
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.process_time()
        d = decide_health(job, pods, state, policy, 1_000_041.0)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        state = d.state
    return sorted(cpu)[len(cpu) // 2], sorted(wall)[len(wall) // 2]


def main(argv: list[str] | None = None) -> int:
    global PODS
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--prefill-steps", type=int, default=16, help="steps ingested per rank before the run (rings are preallocated, so memory is the full-window figure)")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--client", choices=("aiohttp", "raw", "both"), default="both", help="client implementation(s) to load the server with")
    ap.add_argument("--pods", type=int, default=int(os.environ.get(PODS_ENV, "2048")), help="pods (x 8 ranks) of the ingest and evaluation parts")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    PODS = args.pods
    os.environ[PODS_ENV] = str(args.pods)

    rows: list[tuple[str, Any, str, str | None, bool | None]] = []
    load_before = os.getloadavg()[0]  # a shared machine's other work shows in wall time, less in CPU time
    if not args.skip_ingest:
        kinds = ("aiohttp", "raw") if args.client == "both" else (args.client,)
        for kind in kinds:
            ing = bench_ingest(args.seconds, args.clients, args.concurrency, args.prefill_steps, raw=kind == "raw")
            srv = ing["server"]
            ok_codes = set(ing["codes"]) == {"204"}
            cap = 1e6 / max(ing["server_cpu_us_per_beat"], 1e-9)
            rows += [
                (f"ingest [{kind} client]: rank heartbeats/s, {PODS:,} pods x 8 ranks", round(ing["rank_beats_per_s"]), "beats/s", f">= {TARGET_RATE}", ing["rank_beats_per_s"] >= TARGET_RATE),
                (f"ingest [{kind} client]: POSTs/s", round(ing["requests_per_s"]), "req/s", None, None),
                (f"ingest [{kind} client]: p50 latency at saturation", round(ing["p50_ms"], 2), "ms", None, None),
                (f"ingest [{kind} client]: p99 latency at saturation", round(ing["p99_ms"], 2), "ms", None, None),
                (f"ingest [{kind} client]: all responses 204", int(ok_codes), "bool", "1", ok_codes),
                (f"ingest [{kind} client]: server CPU used (1.0 = one core)", round(ing["server_cpu_share"], 2), "cores", None, None),
                (f"ingest [{kind} client]: server CPU per rank heartbeat", round(ing["server_cpu_us_per_beat"], 2), "us", f"<= {TARGET_CPU_US_PER_BEAT:g}", ing["server_cpu_us_per_beat"] <= TARGET_CPU_US_PER_BEAT),
                (f"ingest [{kind} client]: capacity of one core (1e6 / CPU per beat)", round(cap), "beats/s", f">= {TARGET_CORE_CAPACITY}", cap >= TARGET_CORE_CAPACITY),
            ]
        rows += [
            ("server RSS, empty store", round(srv["rss_empty"] / 2**20, 1), "MiB", None, None),
            (f"server RSS, {PODS * RANKS_PER_POD:,} ranks (rings preallocated: 256 steps, 64 beats)", round(srv["rss_prefilled"] / 2**20, 1), "MiB", None, None),
            ("server RSS after the run", round(srv["rss_bytes"] / 2**20, 1), "MiB", None, None),
            ("ranks held by the store", srv["ranks"], "ranks", None, None),
        ]
    rows += bench_detection()
    cpu, wall = bench_evaluation()
    rows.append((f"evaluation: decide_health over {PODS * RANKS_PER_POD:,} ranks, CPU (median of 5)", round(cpu, 3), "s", "<= 0.1", cpu <= 0.1))
    rows.append((f"evaluation: decide_health over {PODS * RANKS_PER_POD:,} ranks, wall (median of 5)", round(wall, 3), "s", None, None))

    print(f"(1-minute load average: {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs)")
    width = max(len(r[0]) for r in rows)
    print(f"{'metric':<{width}}  {'value':>10}  {'unit':<8} {'target':<9} meets")
    for name, value, unit, target, meets in rows:
        print(f"{name:<{width}}  {value!s:>10}  {unit:<8} {target or '':<9} {'' if meets is None else ('yes' if meets else 'NO')}")
    write_results(
        args.out,
        {
            "bench": "heartbeats",
            "machine": {
                "clients": args.clients, "concurrency": args.concurrency,
                "load_average_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
            },
            "results": [{"metric": n, "value": v, "unit": u, "target": t, "meets": m} for n, v, u, t, m in rows],
        },
        MEASURES,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
