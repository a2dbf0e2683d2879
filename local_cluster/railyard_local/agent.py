"""The process node agent: runs every pod bound to a simulated node as local processes.

One :class:`PodWorker` per pod: it fetches the ConfigMaps/Secrets the pod refers to,
materialises its volumes under ``<state>/nodes/<node>/``, starts each container's command in its
own process group (cwd: the pod's folder; stdout+stderr appended to the file the API server's
pods/log serves), reports phases, container states, restart counts and conditions through
pods/status, and stops the processes on deletion (SIGTERM, grace period, SIGKILL, then DELETE
with gracePeriodSeconds=0, as a kubelet does). The pod IP is the node's own loopback address.

Processes never outlive the agent: every group is killed on stop, and each direct child gets
PR_SET_PDEATHSIG so even a SIGKILLed agent takes its children along.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from railyard.protocol import podenv as contract
from railyard.protocol.device import SIMULATED_DEVICE_ENV, SimulatedDevice, write_device
from railyard_local import podenv, podlogs
from railyard_local.kube import ApiError, Informer, KubeClient, Obj, key_of, retry
from railyard_local.nodes import NodeControl, now_iso
from railyard_local.podenv import ContainerConfigError, PodContext
from railyard_local.tasks import TaskSet
from railyard_local.termination import build_termination_message, termination_message_path
from railyard_local.topology import NodeSpec

log = logging.getLogger(__name__)
RESOLVER_SOURCE = Path(__file__).with_name("_resolver_site.py")
DEFAULT_GRACE = 30
RESTART_BACKOFF_MAX = 10.0
#: Period of a slow node's SIGSTOP/SIGCONT duty cycle: short, so the node's processes are slowed
#: evenly (wall clock) rather than in visible bursts. The straggler signal does not come from it:
#: the speed probe sees the node's simulated device (device_file), which is exact under any load.
SLOW_PERIOD = 0.004
#: A pod with this annotation set to "true" is reported Running without starting processes
#: (as kwok does): for scale tests of 1,000-pod gangs on a 2-core machine. Its init containers
#: complete at once (exit 0), its containers run until the pod is deleted or its node fails.
SIMULATE_ANNOTATION = "local.railyard.dev/simulate"
#: hostPaths under these prefixes are one folder for all nodes (a shared filesystem mount).
DEFAULT_SHARED_HOST_PATHS = ("/mnt",)


def _pdeathsig() -> None:
    """Runs in the child before exec: die with the agent."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def process_tree(roots: list[int]) -> list[int]:
    """The roots and all their descendants. A pod's processes may start new sessions (the
    trainer's launcher does, to manage its workers), so a process group is not the pod; on a
    real node the container's cgroup is. This walks /proc/<pid>/task/<tid>/children instead."""
    seen: dict[int, None] = {}  # insertion-ordered set
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen[pid] = None
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                    stack.extend(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                continue
    return list(seen)


def signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@dataclass
class Container:
    """One container's live state, as containerStatuses reports it."""

    name: str
    spec: Obj
    init: bool = False
    proc: asyncio.subprocess.Process | None = None
    pgid: int = 0
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    restarts: int = 0
    ready: bool = False
    started_at: str = ""

    def status(self, node: str) -> Obj:
        out: Obj = {
            "name": self.name,
            "image": str(self.spec.get("image", "")),
            "imageID": "",
            "ready": self.ready,
            "restartCount": self.restarts,
            "started": "running" in self.state,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.proc is not None:
            out["containerID"] = f"railyard://{node}/{self.proc.pid}"
        return out

    @property
    def terminated(self) -> bool:
        return "terminated" in self.state


class PodWorker:
    """Runs one pod from start to its terminal phase or deletion."""

    def __init__(self, agent: Agent, pod: Obj, node: NodeSpec) -> None:
        self.agent = agent
        self.pod = pod
        self.node = node
        meta = pod.get("metadata") or {}
        self.ns = str(meta.get("namespace", "default"))
        self.name = str(meta.get("name", ""))
        self.uid = str(meta.get("uid", ""))
        spec = pod.get("spec") or {}
        self.restart_policy = str(spec.get("restartPolicy") or "Always")
        self.simulated = str((meta.get("annotations") or {}).get(SIMULATE_ANNOTATION, "")).lower() == "true"
        self.init = [Container(str(c.get("name")), c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [Container(str(c.get("name")), c) for c in spec.get("containers") or []]
        self.pod_dir = agent.node_dir(node.name) / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.phase = "Pending"
        self.reason = ""
        self.message = ""
        self.initialized = False
        self.start_time = now_iso()
        self.transitions: dict[str, tuple[str, str]] = {}
        self.volume_dirs: dict[str, str] = {}
        self.task: asyncio.Task[None] | None = None
        self.stopping = False
        self._status_lock = asyncio.Lock()
        self._changed = asyncio.Event()

    # --- public ---
    def start(self) -> None:
        self.task = self.agent.tasks.spawn(self._run(), f"pod {self.ns}/{self.name}")

    @property
    def running(self) -> bool:
        return self.phase in ("Pending", "Running") and not self.stopping

    def pgids(self) -> list[int]:
        return [c.pgid for c in self.init + self.containers if c.pgid and c.proc is not None and c.proc.returncode is None]

    async def delete(self, grace: int) -> None:
        """Graceful deletion: SIGTERM, wait up to ``grace`` s, SIGKILL, then remove the pod."""
        if self.stopping:
            return
        self.stopping = True
        await self._stop_processes(grace)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        self.agent.forget(self)
        self._cleanup()
        await retry(
            lambda: self.agent.client.delete(
                f"/api/v1/namespaces/{self.ns}/pods/{self.name}",
                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            ),
            what=f"delete {self.ns}/{self.name}",
        )

    async def kill(self, *, reason: str, message: str, report: bool) -> None:
        """Immediate SIGKILL (node failure, agent stop); optionally report the pod Failed."""
        if self.stopping:
            return
        self.stopping = True
        # the whole tree at once, as a node's death takes every process of its pods (workers
        # in their own sessions included), not leaders first
        tree = process_tree(self.pgids())
        for pgid in self.pgids():
            killpg(pgid, signal.SIGKILL)
        signal_pids(tree, signal.SIGKILL)
        await self._reap(2.0)
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        if report:
            for c in self.init + self.containers:
                if not c.terminated:
                    c.last_state = {}
                    c.state = {"terminated": self._terminated(137, reason, c.started_at, message)}
                    c.ready = False
            self.phase, self.reason, self.message = "Failed", reason, message
            with contextlib.suppress(Exception):
                await self._patch_status()
        self.agent.forget(self)

    async def report_shutdown(self) -> None:
        for c in self.init + self.containers:
            if not c.terminated:
                c.state = {"terminated": self._terminated(143, "NodeShutdown", c.started_at)}
            c.ready = False
        self.phase, self.reason = "Failed", "NodeShutdown"
        self.message = "the local cluster was stopped (railyard local down) while this pod ran"
        await self._patch_status()

    # --- lifecycle ---
    async def _run(self) -> None:
        try:
            await self._prepare()
            for c in self.init:
                ok = await self._run_to_completion(c)
                if not ok:
                    return
            self.initialized = True
            await asyncio.gather(*(self._supervise(c) for c in self.containers))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("pod %s/%s: agent error", self.ns, self.name)
            self.phase, self.reason, self.message = "Failed", "AgentError", f"railyard local agent: {exc!r}"
            await self._patch_status()

    async def _prepare(self) -> None:
        """Fetch referenced objects and materialise volumes; retry while references are missing."""
        delay = 1.0
        while True:
            try:
                self.ctx = await self.agent.pod_context(self.pod, self.node)
                self.volume_dirs = self.agent.materialise_volumes(
                    self.pod, self.node, self.pod_dir, self.ctx, create=not self.simulated
                )
                for c in self.init + self.containers:
                    self._plan(c)
                return
            except ContainerConfigError as exc:
                for c in self.init + self.containers:
                    c.state = {"waiting": {"reason": exc.reason, "message": str(exc)}}
                await self._patch_status()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _plan(self, c: Container) -> tuple[list[str], dict[str, str], str]:
        env = podenv.build_env(self.ctx, c.spec)
        mounts = podenv.build_mounts(c.spec, self.volume_dirs)
        # the container's terminationMessagePath is a file of its own, as the kubelet mounts it
        mounts.setdefault(termination_message_path(c.spec), str(self._termination_file(c)))
        env = {k: podenv.rewrite_paths(v, mounts) for k, v in env.items()}
        argv = podenv.build_command(c.spec, env, mounts)
        workdir = str(c.spec.get("workingDir") or "")
        cwd = podenv.rewrite_paths(workdir, mounts) if workdir else ""
        if not cwd or not os.path.isdir(cwd):
            cwd = str(self.pod_dir)
        full = self.agent.base_env(self.node)
        full.update(
            {
                "HOSTNAME": str((self.pod.get("spec") or {}).get("hostname") or self.name),
                contract.POD_NAME.name: self.name,
                "RAILYARD_POD_NAMESPACE": self.ns,
                "RAILYARD_POD_IP": self.node.ip,
                contract.NODE_NAME.name: self.node.name,
                "RAILYARD_POD_DIR": str(self.pod_dir),
                "RAILYARD_MOUNTS": podenv.mounts_json(mounts),
                "RAILYARD_NODE_SLOW_FACTOR": str(self.agent.control(self.node.name).slow_factor),
                SIMULATED_DEVICE_ENV: str(self.agent.device_file(self.node.name)),
            }
        )
        full.update(env)
        return argv, full, cwd

    def _termination_file(self, c: Container) -> Path:
        return self.pod_dir / f"{c.name}.termination-log"

    def _termination_message(self, c: Container, code: int) -> str:
        policy = str(c.spec.get("terminationMessagePolicy") or "File")
        log_path = self.agent.log_path(self.ns, self.name, c.name)
        return build_termination_message(self._termination_file(c), log_path, policy=policy, exit_code=code)

    async def _spawn(self, c: Container) -> int | None:
        """Start the container's process; None when it started, else an exit code to report."""
        argv, env, cwd = self._plan(c)
        if self.simulated:
            c.started_at = now_iso()
            c.state = {"running": {"startedAt": c.started_at}}
            return None
        if not argv:
            argv = ["sleep", "infinity"]  # an image entrypoint cannot run here: idle like a pause container
        with contextlib.suppress(OSError):
            self._termination_file(c).write_bytes(b"")  # each run of the container starts with an empty one
        log_path = self.agent.log_path(self.ns, self.name, c.name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        if c.restarts and log_path.exists():
            os.replace(log_path, self.agent.log_path(self.ns, self.name, c.name, previous=True))
        c.started_at = now_iso()
        with open(log_path, "wb") as out:
            try:
                c.proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_pdeathsig,
                )
            except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
                out.write(f"railyard local: cannot start {argv[0]!r}: {exc}\n".encode())
                c.state = {"terminated": self._terminated(127 if isinstance(exc, FileNotFoundError) else 126, "StartError", c.started_at, str(exc))}
                return 127 if isinstance(exc, FileNotFoundError) else 126
        c.pgid = c.proc.pid
        c.state = {"running": {"startedAt": c.started_at}}
        self.agent.on_processes_changed(self.node.name)
        return None

    def _terminated(self, code: int, reason: str, started: str, message: str = "") -> Obj:
        out: Obj = {"exitCode": code, "reason": reason, "startedAt": started or now_iso(), "finishedAt": now_iso()}
        if message:
            out["message"] = message
        if code > 128:
            out["signal"] = code - 128
        return out

    async def _wait(self, c: Container) -> int:
        if c.proc is not None:
            rc = await c.proc.wait()
            code = 128 - rc if rc < 0 else rc
        elif c.init:  # simulated: an init container has done its work
            code = 0
        else:  # simulated: runs until the pod is deleted or its node fails
            await asyncio.get_running_loop().create_future()
            code = 0
        c.ready = False
        c.state = {"terminated": self._terminated(code, "Completed" if code == 0 else "Error", c.started_at, self._termination_message(c, code))}
        return code

    async def _run_to_completion(self, c: Container) -> bool:
        """Init container: run until exit 0 (restarting unless Never); False when the pod failed."""
        delay = 1.0
        while True:
            code = await self._spawn(c)
            if code is None:
                self.phase = "Pending"
                if not self.simulated:  # a simulated one completes at once: one patch, not two
                    await self._patch_status()
                code = await self._wait(c)
            if code == 0:
                await self._patch_status()
                return True
            if self.restart_policy == "Never":
                self.phase, self.reason = "Failed", ""
                await self._patch_status()
                return False
            c.last_state, c.restarts = c.state, c.restarts + 1
            c.state = {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off {delay:.0f}s restarting failed container"}}
            await self._patch_status()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_BACKOFF_MAX)

    async def _supervise(self, c: Container) -> None:
        delay = 1.0
        probe: asyncio.Task[None] | None = None
        try:
            while True:
                code = await self._spawn(c)
                if code is None:
                    if c.spec.get("readinessProbe"):
                        probe = self.agent.tasks.spawn(self._probe(c), f"readiness probe {self.ns}/{self.name}/{c.name}")
                    else:
                        c.ready = True
                    self._update_phase()
                    await self._patch_status()
                    code = await self._wait(c)
                    if probe is not None:
                        probe.cancel()
                        probe = None
                if self.stopping:
                    return  # whoever stops the pod reports it
                restart = self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0)
                if not restart:
                    self._update_phase()
                    await self._patch_status()
                    return
                c.last_state, c.restarts = c.state, c.restarts + 1
                c.state = {"waiting": {"reason": "CrashLoopBackOff", "message": f"back-off {delay:.0f}s restarting failed container={c.name}"}}
                self._update_phase()
                await self._patch_status()
                await asyncio.sleep(delay)
                delay = min(delay * 2, RESTART_BACKOFF_MAX)
        finally:
            if probe is not None:
                probe.cancel()

    def _update_phase(self) -> None:
        if all(c.terminated for c in self.containers):
            codes = [c.state["terminated"]["exitCode"] for c in self.containers]
            self.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        else:
            self.phase = "Running"

    async def _probe(self, c: Container) -> None:
        probe = c.spec.get("readinessProbe") or {}
        await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
        period = float(probe.get("periodSeconds", 10))
        success_needed = int(probe.get("successThreshold", 1))
        failure_needed = int(probe.get("failureThreshold", 3))
        ok_streak = fail_streak = 0
        while True:
            ok = await self._probe_once(c, probe)
            ok_streak, fail_streak = (ok_streak + 1, 0) if ok else (0, fail_streak + 1)
            ready = c.ready
            if ok_streak >= success_needed:
                ready = True
            elif fail_streak >= failure_needed:
                ready = False
            if ready != c.ready:
                c.ready = ready
                await self._patch_status()
            await asyncio.sleep(period)

    async def _probe_once(self, c: Container, probe: Obj) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if probe.get("exec"):
                _argv, env, cwd = self._plan(c)
                cmd = [str(a) for a in probe["exec"].get("command") or []]
                proc = await asyncio.create_subprocess_exec(
                    *cmd, cwd=cwd, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                    start_new_session=True, preexec_fn=_pdeathsig,
                )
                try:
                    return await asyncio.wait_for(proc.wait(), timeout) == 0
                except TimeoutError:
                    killpg(proc.pid, signal.SIGKILL)
                    return False
            port = self._port((probe.get("tcpSocket") or probe.get("httpGet") or {}).get("port"), c)
            if probe.get("tcpSocket"):
                _, writer = await asyncio.wait_for(asyncio.open_connection(self.node.ip, port), timeout)
                writer.close()
                return True
            if probe.get("httpGet"):
                path = str(probe["httpGet"].get("path", "/"))
                async with aiohttp.ClientSession() as s, s.get(
                    f"http://{self.node.ip}:{port}{path}", timeout=aiohttp.ClientTimeout(total=timeout)
                ) as resp:
                    return 200 <= resp.status < 400
        except (OSError, TimeoutError, aiohttp.ClientError, ContainerConfigError):
            return False
        return True

    def _port(self, port: Any, c: Container) -> int:
        if isinstance(port, int):
            return port
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p.get("containerPort", 0))
        return int(port or 0)

    async def _stop_processes(self, grace: int) -> None:
        for pgid in self.pgids():
            killpg(pgid, signal.SIGTERM)
            killpg(pgid, signal.SIGCONT)
        if not await self._reap(float(grace)):
            for pgid in self.pgids():
                killpg(pgid, signal.SIGKILL)
                killpg(pgid, signal.SIGCONT)
            await self._reap(5.0)
        # grandchildren left in the groups (the leader exited on SIGTERM) are killed too
        for c in self.init + self.containers:
            if c.pgid:
                killpg(c.pgid, signal.SIGKILL)

    async def _reap(self, timeout: float) -> bool:
        procs = [c.proc for c in self.init + self.containers if c.proc is not None and c.proc.returncode is None]
        if not procs:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), timeout)
            return True
        except TimeoutError:
            return False

    def _cleanup(self) -> None:
        shutil.rmtree(self.pod_dir, ignore_errors=True)

    # --- status ---
    def _cond(self, kind: str, ok: bool) -> Obj:
        status = "True" if ok else "False"
        prev = self.transitions.get(kind)
        if prev is None or prev[0] != status:
            prev = (status, now_iso())
            self.transitions[kind] = prev
        return {"type": kind, "status": status, "lastTransitionTime": prev[1], "lastProbeTime": None}

    def build_status(self) -> Obj:
        ready = self.phase == "Running" and all(c.ready for c in self.containers)
        status: Obj = {
            "phase": self.phase,
            "hostIP": self.node.ip,
            "hostIPs": [{"ip": self.node.ip}],
            "podIP": self.node.ip,
            "podIPs": [{"ip": self.node.ip}],
            "startTime": self.start_time,
            "conditions": [
                self._cond("PodScheduled", True),
                self._cond("Initialized", self.initialized or not self.init),
                self._cond("ContainersReady", ready),
                self._cond("Ready", ready),
            ],
            "containerStatuses": [c.status(self.node.name) for c in self.containers],
        }
        if self.init:
            status["initContainerStatuses"] = [c.status(self.node.name) for c in self.init]
        status["reason"] = self.reason or None
        status["message"] = self.message or None
        return status

    async def _patch_status(self) -> None:
        async with self._status_lock:
            body = {"status": self.build_status()}
            try:
                await retry(
                    lambda: self.agent.client.patch(f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status", body),
                    what=f"status {self.ns}/{self.name}",
                )
            except ApiError as exc:
                log.warning("status of %s/%s not written: %s", self.ns, self.name, exc)
        self.agent.on_processes_changed(self.node.name)


class Agent:
    """All pods on all simulated nodes of this runtime."""

    def __init__(
        self,
        client: KubeClient,
        state_dir: Path,
        nodes: list[NodeSpec],
        *,
        log_dir: Path,
        shared_host_paths: tuple[str, ...] = DEFAULT_SHARED_HOST_PATHS,
        kubeconfig: str = "",
    ) -> None:
        self.client = client
        self.kubeconfig = kubeconfig
        self.shared_host_paths = tuple(p.rstrip("/") for p in shared_host_paths if p.strip("/"))
        self.state_dir = state_dir
        self.nodes = {n.name: n for n in nodes}
        self.log_dir = log_dir
        self.workers: dict[str, PodWorker] = {}
        self.controls: dict[str, NodeControl] = {}
        self.pods: Informer | None = None
        self.services: Mapping[str, Obj] = {}
        self.hosts_file = state_dir / "hosts"
        self.resolver_dir = state_dir / "resolver"
        self._slow_tasks: dict[str, asyncio.Task[None]] = {}
        self._hosts_dirty = asyncio.Event()
        self._seen_at_start: set[str] = set()
        self._started = False
        self.on_change: Callable[[], None] | None = None
        self._finishing: set[str] = set()
        self._done: set[str] = set()
        self.tasks = TaskSet("node agent")
        self.resolver_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(RESOLVER_SOURCE, self.resolver_dir / "sitecustomize.py")
        self._write_hosts()

    # --- paths and env ---
    def node_dir(self, node: str) -> Path:
        return self.state_dir / "nodes" / node

    def device_file(self, node: str) -> Path:
        """The node's simulated accelerator (railyard.protocol.device), read by the trainer."""
        return self.node_dir(node) / "device.json"

    def _publish_device(self, node: str) -> None:
        write_device(self.device_file(node), SimulatedDevice(slow_factor=self.control(node).slow_factor))

    def host_path(self, node: str, path: str) -> Path:
        """A hostPath's folder: per node, except under a shared prefix (a network filesystem
        mounted on every node, like /mnt/lustre), which all nodes see as one folder."""
        clean = "/" + path.strip("/")
        for prefix in self.shared_host_paths:
            if clean == prefix or clean.startswith(prefix + "/"):
                return self.state_dir / "shared" / clean.lstrip("/")
        return self.node_dir(node) / "hostpath" / clean.lstrip("/")

    def log_path(self, ns: str, name: str, container: str, previous: bool = False) -> Path:
        """The container's log (``previous``: of its run before the last restart), as the
        embedded API server's pods/log and the kubelet endpoint (kubelet.py) serve it."""
        return podlogs.log_file(self.log_dir, ns, name, container, previous)

    def cached_pod(self, key: str) -> Obj | None:
        """The pod ``namespace/name`` as the agent last saw it."""
        return self.pods.cache.get(key) if self.pods is not None else None

    def control(self, node: str) -> NodeControl:
        return self.controls.get(node, NodeControl())

    def base_env(self, node: NodeSpec) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PYTHONSTARTUP", None)
        if self.kubeconfig:
            env["KUBECONFIG"] = self.kubeconfig  # the local stand-in for in-cluster credentials
        else:
            env.pop("KUBECONFIG", None)
        bindir = os.path.dirname(sys.executable)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.resolver_dir), env.get("PYTHONPATH", "")) if p)
        env["RAILYARD_HOSTS_FILE"] = str(self.hosts_file)
        env["RAILYARD_LOCAL_STATE_DIR"] = str(self.state_dir)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    async def pod_context(self, pod: Obj, node: NodeSpec) -> PodContext:
        ns = str((pod.get("metadata") or {}).get("namespace", "default"))
        cm_names, secret_names = podenv.referenced_objects(pod)

        async def fetch(kind: str, name: str) -> tuple[str, Obj | None]:
            return name, await retry(lambda: self.client.get(f"/api/v1/namespaces/{ns}/{kind}/{name}"))

        cms = await asyncio.gather(*(fetch("configmaps", n) for n in cm_names))
        secrets = await asyncio.gather(*(fetch("secrets", n) for n in secret_names))
        return PodContext(
            pod=pod,
            pod_ip=node.ip,
            host_ip=node.ip,
            node_allocatable=node.capacity(),
            configmaps={n: o for n, o in cms if o is not None},
            secrets={n: o for n, o in secrets if o is not None},
        )

    def materialise_volumes(
        self, pod: Obj, node: NodeSpec, pod_dir: Path, ctx: PodContext, *, create: bool = True
    ) -> dict[str, str]:
        """Create each volume's folder; returns volume name -> real path.

        ``create=False`` (a simulated pod: no process will read them) resolves the same paths and
        raises the same :class:`ContainerConfigError` for a missing object or key, but touches no
        disk: at a 1,000-pod gang the folders and files were most of the agent's time.
        """
        out: dict[str, str] = {}

        def mkdir(path: Path) -> None:
            if create:
                path.mkdir(parents=True, exist_ok=True)

        mkdir(pod_dir)
        for vol in (pod.get("spec") or {}).get("volumes") or []:
            name = str(vol.get("name", ""))
            if vol.get("hostPath"):
                hp = vol["hostPath"]
                real = self.host_path(node.name, str(hp.get("path", "")))
                if hp.get("type") in ("File", "FileOrCreate", "Socket", "CharDevice", "BlockDevice"):
                    mkdir(real.parent)
                    if create and hp.get("type") == "FileOrCreate":
                        real.touch(exist_ok=True)
                else:
                    mkdir(real)
                out[name] = str(real)
                continue
            if vol.get("persistentVolumeClaim"):
                ns = str((pod.get("metadata") or {}).get("namespace", "default"))
                real = self.state_dir / "shared" / "pvc" / ns / str(vol["persistentVolumeClaim"].get("claimName", name))
                mkdir(real)
                out[name] = str(real)
                continue
            real = pod_dir / "volumes" / name
            if create and real.exists():
                shutil.rmtree(real, ignore_errors=True)
            mkdir(real)
            out[name] = str(real)
            if vol.get("configMap") or vol.get("secret"):
                secret = bool(vol.get("secret"))
                src = vol.get("secret") or vol.get("configMap") or {}
                obj_name = src.get("secretName") if secret else src.get("name")
                self._write_keys(real, ctx, str(obj_name), src, secret=secret, field=f"volumes[{name}]", write=create)
            elif vol.get("projected"):
                # serviceAccountToken sources get no file: this agent issues no tokens (the
                # service-account volume admission adds still carries ca.crt and namespace)
                for s in vol["projected"].get("sources") or []:
                    for kind, secret in (("configMap", False), ("secret", True)):
                        if s.get(kind):
                            self._write_keys(
                                real, ctx, str(s[kind].get("name")), s[kind], secret=secret, field=f"volumes[{name}]", write=create
                            )
                    if s.get("downwardAPI"):
                        self._write_field_refs(real, ctx, s["downwardAPI"], write=create)
            elif vol.get("downwardAPI"):
                self._write_field_refs(real, ctx, vol["downwardAPI"], write=create)
        return out

    @staticmethod
    def _write_field_refs(folder: Path, ctx: PodContext, src: Obj, *, write: bool = True) -> None:
        for item in src.get("items") or []:
            if item.get("fieldRef"):
                value = podenv.resolve_field_ref(ctx, str(item["fieldRef"].get("fieldPath")))
                if write:
                    target = folder / str(item.get("path"))
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(value)

    def _write_keys(
        self, folder: Path, ctx: PodContext, obj_name: str, src: Obj, *, secret: bool, field: str, write: bool = True
    ) -> None:
        obj = (ctx.secrets if secret else ctx.configmaps).get(obj_name)
        if obj is None:
            if src.get("optional"):
                return
            kind = "secret" if secret else "configmap"
            raise ContainerConfigError(f"{field}: {kind} {obj_name!r} not found")
        data = podenv.object_bytes(obj, secret=secret)
        items = src.get("items")
        pairs = [(str(i.get("key")), str(i.get("path")), i.get("mode")) for i in items] if items else [(k, k, None) for k in data]
        mode_default = int(src.get("defaultMode", 0o644))
        for key, rel, mode in pairs:
            if key not in data:
                if src.get("optional"):
                    continue
                raise ContainerConfigError(f"{field}.items: key {key!r} not found in {obj_name!r}")
            if not write:
                continue
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data[key])
            with contextlib.suppress(OSError):
                target.chmod(int(mode) if mode is not None else mode_default)

    # --- informer handlers ---
    def apply_controls(self, controls: Mapping[str, NodeControl]) -> None:
        """The node controls read at start-up (a node slowed before a restart stays slow)."""
        self.controls = dict(controls)
        for node in self.nodes:
            self._publish_device(node)
        for node, control in self.controls.items():
            if control.slow_factor > 1.0:
                self._restart_slow(node)

    def _bg(self, coro: Any, what: str = "") -> None:
        self.tasks.spawn(coro, what)

    def on_pod(self, kind: str, pod: Obj, old: Obj | None) -> None:
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if node not in self.nodes:
            return
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        worker = self.workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                self._bg(worker.kill(reason="Deleted", message="", report=False))
            return
        if meta.get("deletionTimestamp"):
            if worker is not None:
                if not worker.stopping:
                    grace = meta.get("deletionGracePeriodSeconds")
                    if grace is None:
                        grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE)
                    self._bg(worker.delete(int(grace)))
            elif uid not in self._finishing:
                self._finishing.add(uid)
                self._bg(self._finish_delete(pod))
            return
        if worker is not None:
            worker.pod = pod
            return
        status = pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed") or self.control(str(node)).failed or uid in self._done:
            return
        if status.get("containerStatuses"):
            # Started by an earlier run of the agent; its processes died with that run.
            self._done.add(uid)
            if spec.get("restartPolicy", "Always") != "Always":
                self._bg(self._report_lost(pod))
                return
        self._start(pod, self.nodes[str(node)])

    def _start(self, pod: Obj, node: NodeSpec) -> None:
        worker = PodWorker(self, pod, node)
        self.workers[worker.uid] = worker
        self._done.add(worker.uid)
        worker.start()
        self._hosts_dirty.set()

    async def _finish_delete(self, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        ns, name, uid = meta.get("namespace", "default"), meta.get("name", ""), meta.get("uid", "")
        try:
            await retry(
                lambda: self.client.delete(
                    f"/api/v1/namespaces/{ns}/pods/{name}",
                    {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                )
            )
        except ApiError as exc:
            if exc.status != 409:
                log.warning("could not finish deletion of %s/%s: %s", ns, name, exc)
        finally:
            self._finishing.discard(str(uid))

    async def _report_lost(self, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        statuses = []
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            state = cs.get("state") or {}
            if "terminated" not in state:
                started = (state.get("running") or {}).get("startedAt", now_iso())
                state = {"terminated": {"exitCode": 137, "reason": "NodeRestart", "signal": 9, "startedAt": started, "finishedAt": now_iso()}}
            statuses.append({**cs, "state": state, "ready": False})
        body = {
            "status": {
                "phase": "Failed",
                "reason": "NodeRestart",
                "message": "the local cluster's node agent stopped while this pod ran; its processes are gone",
                "containerStatuses": statuses,
            }
        }
        with contextlib.suppress(ApiError):
            await retry(lambda: self.client.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", body))

    def forget(self, worker: PodWorker) -> None:
        if self.workers.get(worker.uid) is worker:
            del self.workers[worker.uid]
        self._hosts_dirty.set()

    def on_control(self, node: str, before: NodeControl, after: NodeControl) -> None:
        self.controls[node] = after
        if after.failed and not before.failed:
            for w in [w for w in self.workers.values() if w.node.name == node]:
                self._bg(w.kill(reason="NodeFailed", message=f"node {node} failed (railyard local node fail)", report=True))
        if before.failed and not after.failed and self.pods is not None:
            for pod in list(self.pods.cache.values()):
                if (pod.get("spec") or {}).get("nodeName") == node:
                    self.on_pod("MODIFIED", pod, None)
        if after.slow_factor != before.slow_factor:
            self._publish_device(node)
            self._restart_slow(node)

    def on_service(self, kind: str, svc: Obj, old: Obj | None) -> None:
        self._hosts_dirty.set()

    def on_processes_changed(self, node: str) -> None:
        self._hosts_dirty.set()

    # --- slow nodes: SIGSTOP/SIGCONT duty cycle ---
    def _restart_slow(self, node: str) -> None:
        task = self._slow_tasks.pop(node, None)
        if task is not None:
            task.cancel()
        if self.control(node).slow_factor > 1.0:
            self._slow_tasks[node] = self.tasks.spawn(self._duty_cycle(node), f"slow-down of {node}")

    def pgids_on(self, node: str) -> list[int]:
        return [pg for w in list(self.workers.values()) if w.node.name == node and not w.stopping for pg in w.pgids()]

    async def _duty_cycle(self, node: str) -> None:
        """Let the node's processes run 1/factor of the time, so CPU-bound work takes factor x
        longer. Timers on a busy machine overshoot by about a millisecond, a large part of a
        4 ms period, so the cycle keeps count: it runs the processes only while their running
        time is behind ``elapsed / factor``, and the overshoot of one run is taken off the next."""
        pids: list[int] = []
        refreshed = 0.0
        loop = asyncio.get_running_loop()
        factor, start, ran = 0.0, 0.0, 0.0
        try:
            while True:
                now = loop.time()
                if self.control(node).slow_factor != factor or now - start > 2.0:
                    # a new factor, or a fresh window so an old debt cannot starve or burst
                    factor, start, ran = self.control(node).slow_factor, now, 0.0
                share = 1.0 / max(factor, 1.0)
                if now - refreshed > 0.5:  # pods and their workers come and go
                    pids = process_tree(self.pgids_on(node))
                    refreshed = now
                if ran <= share * (now - start):
                    signal_pids(pids, signal.SIGCONT)
                    await asyncio.sleep(SLOW_PERIOD * share)
                    signal_pids(pids, signal.SIGSTOP)
                    ran += loop.time() - now
                else:
                    await asyncio.sleep(SLOW_PERIOD * (1.0 - share))
        finally:
            signal_pids(process_tree(self.pgids_on(node)) + pids, signal.SIGCONT)

    # --- DNS ---
    def build_hosts(self) -> str:
        lines = ["# written by the railyard local node agent: IP NAME...", "127.0.0.1 localhost"]
        running = [w for w in self.workers.values() if w.running]
        for w in sorted(running, key=lambda w: (w.ns, w.name)):
            names = podenv.dns_names(w.pod)
            if names:
                lines.append(f"{w.node.ip} {' '.join(names)}")
        for svc in self.services.values():
            meta = svc.get("metadata") or {}
            selector = (svc.get("spec") or {}).get("selector") or {}
            ns = meta.get("namespace", "default")
            ips = sorted(
                {
                    w.node.ip
                    for w in running
                    if w.ns == ns and podenv.selector_matches(selector, (w.pod.get("metadata") or {}).get("labels") or {})
                }
            )
            names = podenv.service_names(str(meta.get("name")), ns)
            lines.extend(f"{ip} {' '.join(names)}" for ip in ips)
        return "\n".join(lines) + "\n"

    def _write_hosts(self) -> None:
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text(self.build_hosts())
        os.replace(tmp, self.hosts_file)

    async def run_hosts_writer(self) -> None:
        while True:
            await self._hosts_dirty.wait()
            self._hosts_dirty.clear()
            self._write_hosts()
            if self.on_change is not None:
                self.on_change()
            await asyncio.sleep(0.05)  # coalesce bursts (a gang starting) into one rewrite

    # --- shutdown ---
    async def stop(self) -> None:
        """Kill every pod process (SIGTERM, short grace, SIGKILL) without touching the API."""
        for task in self._slow_tasks.values():
            task.cancel()
        workers = list(self.workers.values())
        for w in workers:
            w.stopping = True
            for pg in w.pgids():
                killpg(pg, signal.SIGTERM)
                killpg(pg, signal.SIGCONT)
        deadline = time.monotonic() + 3.0
        for w in workers:
            await w._reap(max(0.0, deadline - time.monotonic()))
            for c in w.init + w.containers:
                if c.pgid:
                    killpg(c.pgid, signal.SIGKILL)
            if w.task is not None:
                w.task.cancel()
        for w in workers:
            if w.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await w.task
        # Like a kubelet's graceful node shutdown: pods that will not be restarted are Failed.
        reports = [w.report_shutdown() for w in workers if w.restart_policy != "Always" and w.phase in ("Pending", "Running")]
        if reports:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.gather(*reports, return_exceptions=True), 3.0)


def dump_status(agent: Agent) -> str:
    return json.dumps({uid: w.build_status()["phase"] for uid, w in agent.workers.items()})


__all__ = ["Agent", "PodWorker", "key_of"]
