"""Benchmark: one node lost from a 2,048-pod gang, restarted in place vs in full, in one run.

The local cluster (embedded API server, simulated nodes: the node agent reports the pods
Running without processes; with ``--kubeconfig`` the simulated nodes and the agent join that API
server instead, whose own scheduler binds the pods) and the operator as in production (``railyard operator run`` in its
own process). Every pod's launcher is played by this process: 2,048 long polls on the
operator's control endpoint (railyard.protocol.control), one connection each, as real pods
hold them. Then a node of the gang fails (``local.railyard.dev/fail``) and, from one pod watch
and the launchers' own clocks:

- gang pods deleted and created by the restart (target: exactly 1 and 1; placeholders of the hot
  spares counted apart);
- the operator's part, from the node NotReady to the replacement Running and every kept
  launcher told to restart (target < 5 s), and to every launcher running the new attempt;
- the restart signal alone: the order published (``status.lastRestart.startedTime``) to the
  last launcher told.

The same gang with ``restartPolicy.inPlace: false`` (a full restart, as before) runs next on
the same cluster, for pods touched and time to all Running again.

The bench stops at once, with the reason, when the gang moves (a pod of the first attempt
deleted, or one of a later attempt created) before the failure is injected: it measures the
repair of one failure of a settled gang, and nodes going NotReady on their own (a node agent that
cannot keep up) or a gang timeout would otherwise leave it waiting. Ctrl-C, SIGTERM and any error
stop it the same way: the jobs and the namespace are deleted while the operator still runs (it
removes its finalizers), then the operator, the node agent and, with ``--kubeconfig``, the
simulated nodes are removed from that API server.

    python bench/inplace.py [--pods 2048] [--nodes 2100] [--skip-full] [--kubeconfig K]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from provenance import write_results
from railyard.k8s.client import Kube
from railyard.logic.conditions import parse_time
from railyard.protocol.control import Action, LauncherReport, LauncherState, parse_order
from railyard.protocol.ports import free_port as _free_port
from railyard_local.agent import SIMULATE_ANNOTATION
from railyard_local.cluster import LocalCluster
from railyard_local.nodes import FAIL_ANNOTATION

#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "operator/railyard/handlers",
    "operator/railyard/k8s",
    "operator/railyard/logic",
    "operator/railyard/observe/control.py",
    "local_cluster/railyard_local",
)


ROOT = Path(__file__).resolve().parents[1]
NS = "bench-inplace"
TARGET_REPAIR_S = 5.0
#: What a launcher takes to start its workers again before it reports the new attempt.
SPAWN_S = 0.1


class BenchError(RuntimeError):
    """The bench cannot measure what it is for; the message says why and what to look at."""


def _interrupt(signum: int, _frame: Any) -> None:
    """SIGINT and SIGTERM: a KeyboardInterrupt, so that every ``finally`` below cleans up."""
    raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")


def _wait_ready(port: int, op: subprocess.Popen[bytes]) -> None:
    """Until the operator has listed the cluster (/readyz)."""
    import urllib.request

    deadline = time.perf_counter() + 600
    while time.perf_counter() < deadline:
        if op.poll() is not None:
            raise RuntimeError(f"operator exited with {op.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("operator not ready")


async def _prepare(kubeconfig: Path, namespace: str = NS) -> None:
    """The CRD, and the namespace the operator is told to watch (before it starts)."""
    import yaml

    kube = Kube.from_config(str(kubeconfig))
    try:
        if await kube.get(f"/api/v1/namespaces/{namespace}") is not None:
            raise BenchError(f"namespace {namespace} already exists (left by an earlier run?): delete it first "
                             f"(kubectl delete namespace {namespace})")
        await kube.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        MADE.namespace = True
        crd = yaml.safe_load((ROOT / "crds" / "trainingjob.yaml").read_text())
        if await kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}") is None:
            await kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        for _ in range(200):
            try:
                await kube.request("GET", "/apis/railyard.dev/v1alpha1/namespaces/default/trainingjobs")
                return
            except Exception:
                await asyncio.sleep(0.1)
    finally:
        await kube.close()


def start_operator(kubeconfig: Path, log_path: Path, namespace: str, *, extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], int]:
    """``railyard operator run`` in its own process, as in production, watching ``namespace``
    (after :func:`_prepare`); returns it and its metrics port once it has listed the cluster.
    bench/replica_groups.py starts its operator the same way."""
    port = _free_port()
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    op = subprocess.Popen(
        [sys.executable, "-m", "railyard", "operator", "run", "--standalone", "--metrics-host", "127.0.0.1",
         "--metrics-port", str(port), "--heartbeat-advertise-url", f"http://127.0.0.1:{port}", "--not-ready-grace", "0.5",
         "--kubeconfig", str(kubeconfig), *extra, "--namespace", namespace],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )
    try:
        _wait_ready(port, op)
    except BaseException:
        stop_operator(op)
        raise
    return op, port


def stop_operator(op: subprocess.Popen[bytes]) -> None:
    op.terminate()
    try:
        op.wait(30)
    except subprocess.TimeoutExpired:
        op.kill()
        op.wait(10)


def job(name: str, pods: int, *, in_place: bool, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "railyard.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodes": pods,
            "procsPerNode": 1,
            "nodeSelector": selector,  # the bench's own nodes, whatever else the API server has
            "image": "railyard.local/bench:none",  # simulated pods: nothing runs
            "trainer": {"batchSize": pods},
            "gang": {"scheduleTimeoutSeconds": 900, "hotSpares": 1},
            # no hostPath tier: no init container for the simulated pods to run
            "checkpoint": {"memory": {"medium": "Pod"}, "local": {"enabled": False}, "shared": {"enabled": False}},
            "restartPolicy": {"infrastructure": {"limit": 5, "backoffSeconds": 0}, "inPlace": in_place, "inPlaceTimeoutSeconds": 120},
        },
    }


class PodWatch:
    """Per gang pod: first ADDED, first Running, DELETED; placeholders apart."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.added: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.deleted: dict[str, float] = {}
        self.index: dict[str, int] = {}
        self.spare_added: dict[str, float] = {}
        self.spare_deleted: dict[str, float] = {}
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listing = await self.kube.request("GET", f"/api/v1/namespaces/{NS}/pods")
        self.task = asyncio.create_task(self._run(listing["metadata"]["resourceVersion"]))

    async def _run(self, rv: str) -> None:
        sess = self.kube._sess()
        while True:
            params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "300", "allowWatchBookmarks": "true"}
            async with sess.get(f"{self.kube.server}/api/v1/namespaces/{NS}/pods", params=params, timeout=None) as resp:
                async for line in resp.content:
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    obj = ev.get("object") or {}
                    meta = obj.get("metadata") or {}
                    rv = meta.get("resourceVersion", rv)
                    if ev.get("type") == "BOOKMARK":
                        continue
                    now = time.perf_counter()
                    name = meta.get("name", "")
                    labels = meta.get("labels") or {}
                    if labels.get("railyard.dev/spare") == "true":
                        (self.spare_added if ev["type"] == "ADDED" else self.spare_deleted if ev["type"] == "DELETED" else {}).setdefault(name, now)
                        continue
                    if "railyard.dev/pod-index" in labels:
                        self.index[name] = int(labels["railyard.dev/pod-index"])
                    if ev["type"] == "ADDED":
                        self.added.setdefault(name, now)
                    if ev["type"] == "DELETED":
                        self.deleted.setdefault(name, now)
                    elif (obj.get("status") or {}).get("phase") == "Running" and not meta.get("deletionTimestamp"):
                        self.running.setdefault(name, now)

    def stop(self) -> None:
        if self.task:
            self.task.cancel()


class NodeWatch:
    """The bench's nodes that were ever not Ready, besides the ones it failed on purpose."""

    def __init__(self, kube: Kube, selector: dict[str, str]) -> None:
        self.kube = kube
        self.selector = ",".join(f"{k}={v}" for k, v in selector.items())
        self.not_ready: dict[str, str] = {}
        self.failed_on_purpose: set[str] = set()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listing = await self.kube.request("GET", "/api/v1/nodes", params={"labelSelector": self.selector})
        for node in listing.get("items") or []:
            self._seen(node)
        self.task = asyncio.create_task(self._run(listing["metadata"]["resourceVersion"]))

    def _seen(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        ready = next((c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), {})
        if ready.get("status") != "True" and name not in self.not_ready:
            self.not_ready[name] = f"Ready={ready.get('status')} {ready.get('reason')}: {ready.get('message')}"

    def others(self) -> dict[str, str]:
        return {n: why for n, why in self.not_ready.items() if n not in self.failed_on_purpose}

    async def _run(self, rv: str) -> None:
        sess = self.kube._sess()
        while True:
            params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "300", "allowWatchBookmarks": "true",
                      "labelSelector": self.selector}
            async with sess.get(f"{self.kube.server}/api/v1/nodes", params=params, timeout=None) as resp:
                async for line in resp.content:
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    obj = ev.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if ev.get("type") in ("ADDED", "MODIFIED"):
                        self._seen(obj)

    def stop(self) -> None:
        if self.task:
            self.task.cancel()


@dataclass
class Launcher:
    index: int
    pod: str
    attempt: int
    answered: float | None = None
    """When its first report was answered: from then on the operator counts it as one that can be
    told to restart in place."""
    told: float | None = None
    acked: float | None = None
    stopped: float | None = None


@dataclass
class Fleet:
    """2,048 launchers long-polling the operator, one connection each."""

    url: str
    token: str
    job: str
    launchers: dict[str, Launcher] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None
    errors: int = 0

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=60))

    def add(self, pod: str, index: int, attempt: int) -> None:
        if pod in self.launchers:
            return
        launcher = Launcher(index, pod, attempt)
        self.launchers[pod] = launcher
        self.tasks.append(asyncio.create_task(self._run(launcher)))

    async def _run(self, ln: Launcher) -> None:
        assert self.session is not None
        state = LauncherState.RUNNING
        while ln.stopped is None:
            body = LauncherReport(self.job, ln.attempt, ln.index, ln.pod, state, sent_at=time.time()).to_json().encode()
            try:
                async with self.session.post(f"{self.url}?wait=20", data=body, headers={"Authorization": f"Bearer {self.token}"}) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        self.errors += 1
                        await asyncio.sleep(0.5)
                        continue
            except (aiohttp.ClientError, TimeoutError):
                self.errors += 1
                await asyncio.sleep(0.5)
                continue
            order = parse_order(raw)
            now = time.perf_counter()
            if ln.answered is None:
                ln.answered = now
            if order.action is Action.STOP:
                ln.stopped = now
            elif order.action is Action.RESTART and order.attempt > ln.attempt:
                ln.told = now
                # a real launcher starts its workers (one Popen per rank) before it reports the
                # new attempt running: ~0.1 s for 8 ranks
                await asyncio.sleep(SPAWN_S)
                ln.attempt = order.attempt
                ln.acked = time.perf_counter()

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()


async def until(what: str, pred: Any, timeout: float, step: float = 0.02,
                fail: Callable[[], str | None] | None = None) -> float:
    """Wait for ``pred``; ``fail`` says why it can no longer come (then BenchError at once)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if pred():
            return time.perf_counter()
        why = fail() if fail is not None else None
        if why:
            raise BenchError(f"{what}: {why}")
        await asyncio.sleep(step)
    raise TimeoutError(f"{what} not reached within {timeout}s")


def gang_moved(w: PodWatch, name: str, first: list[str]) -> str | None:
    """Why the first attempt's gang is no longer the one to fail, or None while it still is."""
    gone = sorted(n for n in first if n in w.deleted)
    later = sorted(n for n in w.added if n.startswith(f"{name}-a") and not n.startswith(f"{name}-a0-"))
    if not gone and not later:
        return None
    return (f"the gang moved before the failure was injected ({len(gone)} pods of the first attempt deleted, "
            f"e.g. {gone[:3]}; {len(later)} pods of a later attempt created, e.g. {later[:3]}): the bench measures "
            "the repair of one failure of a settled gang. See the job's conditions and the nodes' Ready "
            "condition: nodes that went NotReady on their own (no Lease renewal within the node-monitor grace "
            "period) or a gang timeout move it")


def not_one_restart_in_place(w: PodWatch, name: str, victim: str) -> str | None:
    """Why the repair of the one failure cannot be measured: a pod of the first attempt other than
    the failed one deleted (a full restart), or a pod of a second restart created."""
    gone = sorted(n for n in w.deleted if n.startswith(f"{name}-a0-") and n != victim)
    later = sorted(n for n in w.added if n.startswith(f"{name}-a") and not n.startswith((f"{name}-a0-", f"{name}-a1-")))
    if not gone and not later:
        return None
    return (f"the one failure was not repaired by one restart in place ({len(gone)} kept pods deleted, e.g. "
            f"{gone[:3]}; {len(later)} pods of a later attempt created, e.g. {later[:3]}): see the job's Events "
            f"(kubectl get events -n {NS}) for what each restart did and why")


async def _conditions(kube: Kube, name: str) -> str:
    try:
        st = await status(kube, name)
    except Exception as exc:  # the message is for a person; the bench is failing anyway
        return f"(status unreadable: {exc})"
    return "; ".join(f"{c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}"
                     for c in st.get("conditions") or []) or json.dumps(st)[:400]


async def status(kube: Kube, name: str) -> dict[str, Any]:
    obj = await kube.get(f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs/{name}")
    return dict((obj or {}).get("status") or {})


async def wait_status(kube: Kube, name: str, pred: Any, timeout: float,
                      fail: Callable[[], str | None] | None = None) -> dict[str, Any]:
    deadline = time.perf_counter() + timeout
    st: dict[str, Any] = {}
    while time.perf_counter() < deadline:
        st = await status(kube, name)
        if pred(st):
            return st
        why = fail() if fail is not None else None
        if why:
            raise BenchError(f"status of {name}: {why}")
        await asyncio.sleep(0.1)
    raise TimeoutError(f"status of {name}: {json.dumps(st)[:600]}")


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_failure(kube: Kube, w: PodWatch, name: str, pods: int, metrics_port: int, *, in_place: bool, op_pid: int,
                      selector: dict[str, str], nodes: NodeWatch) -> dict[str, float]:
    """Start the gang, fail one node, measure the repair."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    await kube.create(f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs", job(name, pods, in_place=in_place, selector=selector))
    names0 = [f"{name}-a0-{i}" for i in range(pods)]
    moved = functools.partial(gang_moved, w, name, names0)
    try:
        await until(f"{name}: all pods Running", lambda: all(n in w.running for n in names0), 900, 0.1, fail=moved)
        out["start_to_running_s"] = time.perf_counter() - t0
        st = await wait_status(kube, name, lambda s: s.get("phase") == "Running" and s.get("sparesHeld") == 1, 120,
                               fail=moved)
    except (BenchError, TimeoutError) as exc:
        lost = f"; nodes not Ready: {_some(nodes.others())}" if nodes.others() else ""
        raise BenchError(f"{exc}; job {name}: {await _conditions(kube, name)}{lost}") from None
    secret = await kube.get(f"/api/v1/namespaces/{NS}/secrets/{name}-heartbeat")
    token = base64.b64decode((secret or {})["data"]["token"]).decode()
    fleet = Fleet(f"http://127.0.0.1:{metrics_port}/v1/control/{NS}/{name}", token, name)
    await fleet.open()
    try:
        if in_place:
            for i, n in enumerate(names0):
                fleet.add(n, i, 0)
            # every launcher's first report answered (a launcher not heard of in this attempt cannot be
            # told to restart: the operator would restart the whole gang, NoControlChannel; 3 s after
            # starting them was too short for 2,048 on a loaded machine)
            listening = list(fleet.launchers.values())
            await until("every launcher's first report answered", lambda: all(ln.answered for ln in listening), 300)
            await asyncio.sleep(1.0)  # the polls after the first are held
        victim_pod = names0[pods // 2]
        victim = ((await kube.get(f"/api/v1/namespaces/{NS}/pods/{victim_pod}")) or {})["spec"]["nodeName"]
        nodes.failed_on_purpose.add(victim)
        if nodes.others():
            raise BenchError(f"nodes went NotReady before the failure was injected: {_some(nodes.others())}")
        mark = time.perf_counter()
        deleted_before, added_before = set(w.deleted), set(w.added)
        spare_del_before, spare_add_before = set(w.spare_deleted), set(w.spare_added)
        cpu0 = _cpu_of(op_pid)
        await kube.patch(f"/api/v1/nodes/{victim}", {"metadata": {"annotations": {FAIL_ANNOTATION: "true"}}})
        t_fail = time.perf_counter()
        wall_fail = time.time()
        if in_place:
            replacement = f"{name}-a1-{pods // 2}"
            await until("the replacement Running", lambda: replacement in w.running, 300,
                        fail=functools.partial(not_one_restart_in_place, w, name, victim_pod))
            # the replacement's launcher starts polling at the new attempt
            fleet.add(replacement, pods // 2, 1)
            kept = [ln for ln in fleet.launchers.values() if ln.pod != victim_pod and ln.pod != replacement]
            await until("every kept launcher told", lambda: all(ln.told is not None for ln in kept), 300,
                        fail=functools.partial(not_one_restart_in_place, w, name, victim_pod))
            cpu1 = _cpu_of(op_pid)
            st = await wait_status(kube, name, lambda s: s.get("phase") == "Running" and s.get("attempt") == 1, 300,
                                   fail=functools.partial(not_one_restart_in_place, w, name, victim_pod))
            t_all = time.perf_counter()
            out["operator_cpu_s"] = cpu1 - cpu0
            node = await kube.get(f"/api/v1/nodes/{victim}")
            ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")  # type: ignore[index]
            not_ready = parse_time(ready["lastTransitionTime"]) or wall_fail
            to_perf = t_fail - wall_fail  # wall clock -> perf_counter
            t_not_ready = max(not_ready + to_perf, t_fail)
            last_told = max(ln.told for ln in kept if ln.told is not None)
            started = parse_time((st.get("lastRestart") or {}).get("startedTime")) or wall_fail
            out["replacement_running_s"] = w.running[replacement] - t_not_ready
            out["all_told_s"] = last_told - t_not_ready
            out["repair_s"] = max(w.running[replacement], last_told) - t_not_ready
            out["signal_s"] = last_told - (started + to_perf)
            told = sorted(ln.told - (started + to_perf) for ln in kept if ln.told is not None)
            out["signal_first_s"], out["signal_median_s"] = told[0], told[len(told) // 2]
            out["published_after_fail_s"] = started + to_perf - t_fail
            out["fail_to_all_running_s"] = t_all - t_fail
            out["not_ready_after_fail_s"] = t_not_ready - t_fail
            out["kept_launchers_told"] = float(sum(1 for ln in kept if ln.told is not None))
            out["launcher_errors"] = float(fleet.errors)
        else:
            names1 = [f"{name}-a1-{i}" for i in range(pods)]
            await until(f"{name}: the whole new gang Running", lambda: all(n in w.running for n in names1), 900, 0.1)
            out["fail_to_all_running_s"] = time.perf_counter() - t_fail
        await asyncio.sleep(2.0)  # let the watch see any late writes
        out["gang_pods_deleted"] = float(len({n for n in w.deleted if n not in deleted_before and w.deleted[n] >= mark}))
        out["gang_pods_created"] = float(len({n for n in w.added if n not in added_before and w.added[n] >= mark}))
        out["placeholders_deleted"] = float(len(set(w.spare_deleted) - spare_del_before))
        out["placeholders_created"] = float(len(set(w.spare_added) - spare_add_before))
        await kube.patch(f"/api/v1/nodes/{victim}", {"metadata": {"annotations": {FAIL_ANNOTATION: None}}})
        await kube.patch(f"/api/v1/nodes/{victim}", {"metadata": {"labels": {"railyard.dev/quarantined": None},
                                                                   "annotations": {"railyard.dev/release": "true"}}})
    finally:
        await fleet.close()
    await kube.delete(f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs/{name}")
    for _i in range(1200):
        left = await kube.list(f"/api/v1/namespaces/{NS}/pods", labelSelector=f"railyard.dev/job={name}")
        if not left:
            break
        await asyncio.sleep(0.25)
    return out


def _some(nodes: dict[str, str]) -> str:
    return f"{len(nodes)} nodes, e.g. " + "; ".join(f"{n}: {why}" for n, why in sorted(nodes.items())[:3])


async def run_bench(kubeconfig: Path, pods: int, metrics_port: int, skip_full: bool, op_pid: int,
                    selector: dict[str, str]) -> dict[str, dict[str, float]]:
    kube = Kube.from_config(str(kubeconfig))
    w = PodWatch(kube)
    nodes = NodeWatch(kube, selector)
    try:
        await w.start()
        await nodes.start()
        res = {"in_place": await one_failure(kube, w, "gang", pods, metrics_port, in_place=True, op_pid=op_pid,
                                             selector=selector, nodes=nodes)}
        res["in_place"]["other_nodes_not_ready"] = float(len(nodes.others()))
        print(f"in place: {json.dumps(res['in_place'])}", flush=True)
        if not skip_full:
            res["full"] = await one_failure(kube, w, "full", pods, metrics_port, in_place=False, op_pid=op_pid,
                                            selector=selector, nodes=nodes)
            print(f"full: {json.dumps(res['full'])}", flush=True)
        if nodes.others():
            print(f"nodes not Ready besides the failed ones: {_some(nodes.others())}", flush=True)
    finally:
        w.stop()
        nodes.stop()
        await kube.close()
    return res


async def _delete_objects(kubeconfig: Path, timeout_s: float = 120.0) -> None:
    """The bench's jobs (while the operator runs: it removes its finalizers), then its namespace."""
    kube = Kube.from_config(str(kubeconfig))
    try:
        jobs = f"/apis/railyard.dev/v1alpha1/namespaces/{NS}/trainingjobs"
        for item in await kube.list(jobs):
            await kube.delete(f"{jobs}/{item['metadata']['name']}")
        deadline = time.perf_counter() + timeout_s
        while await kube.list(jobs) and time.perf_counter() < deadline:
            await asyncio.sleep(0.5)
        await kube.delete(f"/api/v1/namespaces/{NS}")
        while await kube.get(f"/api/v1/namespaces/{NS}") is not None and time.perf_counter() < deadline:
            await asyncio.sleep(0.5)
        if await kube.get(f"/api/v1/namespaces/{NS}") is not None:
            print(f"namespace {NS} still terminating after {timeout_s:.0f}s; check it with kubectl", file=sys.stderr)
    finally:
        await kube.close()


@dataclass
class Made:
    """What this run made on the API server, so that cleanup removes exactly that."""

    namespace: bool = False


MADE = Made()


def _keep_logs(tmp: Path) -> Path:
    """The operator's, the API server's and the node agent's logs, out of the folder that goes."""
    import shutil

    kept = Path(tempfile.mkdtemp(prefix="railyard-bench-inplace-logs-"))
    for log in (tmp / "operator.log", *sorted((tmp / "cluster" / "logs").glob("*.log"))):
        if log.is_file():
            shutil.copy2(log, kept / log.name)
    return kept


def _clean_up(cluster: LocalCluster, op: subprocess.Popen[bytes] | None) -> None:
    """Every step runs even when one before it fails; a second Ctrl-C or SIGTERM waits for it."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    steps: list[tuple[str, Callable[[], None]]] = []
    if cluster.mode == "existing" and MADE.namespace:
        steps.append((f"delete namespace {NS}", lambda: asyncio.run(_delete_objects(cluster.kubeconfig))))
    if op is not None:
        steps.append(("stop the operator", lambda: stop_operator(op)))
    steps.append(("stop the local cluster", cluster.stop))
    if cluster.mode == "existing":
        steps.append(("remove the simulated nodes", cluster.remove_nodes))
    try:
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # report it and go on: the other steps still clean up
                print(f"cleanup: {what} failed: {exc!r}", file=sys.stderr)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=2048)
    parser.add_argument("--nodes", type=int, default=0, help="default: pods + 40")
    parser.add_argument("--skip-full", action="store_true", help="only the in-place restart")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "inplace.json"))
    parser.add_argument("--kubeconfig", help="measure on this API server: the simulated nodes and the local node agent join it "
                        "(existing mode; its scheduler binds the pods; the nodes are removed at the end)")
    args = parser.parse_args()
    # both, explicitly: a shell starts a background job with SIGINT ignored, and Python keeps it so
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    nodes = args.nodes or args.pods + 40
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", kubeconfig=args.kubeconfig, nodes=nodes, gpus_per_node=1,
                               topology="spine=4,leaf=16", lease_interval=10.0, node_prefix="bench-")
        selector = cluster.node_selector
        op = None
        try:
            t0 = time.perf_counter()
            kubeconfig = cluster.start(timeout=900)
            print(f"local cluster ({cluster.mode}) with {nodes} nodes up in {time.perf_counter() - t0:.1f}s", flush=True)
            asyncio.run(_prepare(kubeconfig))
            op, port = start_operator(kubeconfig, Path(tmp) / "operator.log", NS,
                                      extra=("--pod-annotation", f"{SIMULATE_ANNOTATION}=true"))
            print("operator ready", flush=True)
            m = asyncio.run(run_bench(kubeconfig, args.pods, port, args.skip_full, op.pid, selector))
        except (BenchError, TimeoutError) as exc:
            print(f"bench/inplace.py: {exc}\nlogs kept in {_keep_logs(Path(tmp))}", file=sys.stderr, flush=True)
            return 1
        except KeyboardInterrupt as exc:
            print(f"bench/inplace.py: {exc or 'interrupted'}; cleaning up", file=sys.stderr, flush=True)
            return 130
        finally:
            _clean_up(cluster, op)
    ip, full = m["in_place"], m.get("full", {})
    n = args.pods
    rows: list[tuple[str, float, str, float | None, bool]] = [
        ("in place: nodes not Ready besides the failed one", ip["other_nodes_not_ready"], "nodes", 0.0, False),
        ("in place: gang pods deleted", ip["gang_pods_deleted"], "pods", 1.0, False),
        ("in place: gang pods created", ip["gang_pods_created"], "pods", 1.0, False),
        ("in place: placeholder pods deleted / created", ip["placeholders_deleted"] + ip["placeholders_created"] / 1000, "pods", None, False),
        ("in place: NotReady -> replacement Running + all told", ip["repair_s"], "s", TARGET_REPAIR_S, False),
        ("in place: NotReady -> replacement Running", ip["replacement_running_s"], "s", None, False),
        (f"in place: NotReady -> all {n - 1} kept launchers told", ip["all_told_s"], "s", None, False),
        ("in place: restart signal (published -> last told)", ip["signal_s"], "s", 1.0, False),
        ("in place: restart signal (published -> median told)", ip["signal_median_s"], "s", None, False),
        ("in place: operator CPU, failure -> all told", ip["operator_cpu_s"], "s", None, False),
        ("in place: operator CPU per launcher told", ip["operator_cpu_s"] / max(ip["kept_launchers_told"], 1) * 1000, "ms", None, False),
        ("in place: node failure -> job Running again", ip["fail_to_all_running_s"], "s", None, False),
    ]
    if full:
        rows += [
            ("full restart: gang pods deleted", full["gang_pods_deleted"], "pods", None, False),
            ("full restart: gang pods created", full["gang_pods_created"], "pods", None, False),
            (f"full restart: node failure -> all {n} Running again", full["fail_to_all_running_s"], "s", None, False),
            ("pods touched per failure, full / in place", (full["gang_pods_deleted"] + full["gang_pods_created"]) / max(ip["gang_pods_deleted"] + ip["gang_pods_created"], 1), "x", None, False),
        ]
    results = []
    print(f"{'metric':<58}{'value':>10}  {'unit':<6}{'target':>8}  meets")
    for metric, value, unit, target, higher in rows:
        if "placeholder" in metric:
            value = ip["placeholders_deleted"]
            shown = f"{ip['placeholders_deleted']:.0f} / {ip['placeholders_created']:.0f}"
        else:
            shown = f"{value:.3f}"
        meets = None if target is None else (value >= target if higher else value <= target)
        if metric.endswith(("deleted", "created")) and target is not None:
            meets = value == target
        results.append({"metric": metric, "value": round(value, 4), "unit": unit, "target": target, "meets": meets})
        t = "" if target is None else f"{target:g}"
        print(f"{metric:<58}{shown:>10}  {unit:<6}{t:>8}  {'' if meets is None else ('yes' if meets else 'NO')}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_results(Path(args.out), {"bench": "inplace", "pods": n, "nodes": nodes, "apiServer": cluster.mode, "results": results, "raw": m}, MEASURES, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
