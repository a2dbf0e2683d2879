"""One pod on a simulated node, run as local processes by :class:`PodWorker`.

It fetches the ConfigMaps/Secrets the pod refers to, has its volumes materialised
(volumes.py), starts each container's command in its own process group (cwd: the pod's folder;
stdout+stderr appended to the file the API server's pods/log serves), restarts containers as the
restart policy says, probes readiness, reports phases, container states, restart counts and
conditions through pods/status, and stops the processes on deletion (SIGTERM, grace period,
SIGKILL, then DELETE with gracePeriodSeconds=0, as a kubelet does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from railyard.protocol import podenv as contract
from railyard.protocol.device import SIMULATED_DEVICE_ENV
from railyard_local import podenv
from railyard_local.kube import ApiError, Obj, retry
from railyard_local.nodes import now_iso
from railyard_local.podenv import ContainerConfigError
from railyard_local.processes import die_with_agent, killpg, process_tree, signal_pids
from railyard_local.termination import build_termination_message, termination_message_path
from railyard_local.topology import NodeSpec

if TYPE_CHECKING:
    from railyard_local.agent import Agent

log = logging.getLogger(__name__)
RESTART_BACKOFF_MAX = 10.0
#: A pod with this annotation set to "true" is reported Running without starting processes
#: (as kwok does): for scale tests of 1,000-pod gangs on a 2-core machine. Its init containers
#: complete at once (exit 0), its containers run until the pod is deleted or its node fails.
SIMULATE_ANNOTATION = "local.railyard.dev/simulate"


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
        #: the names the hosts file gives the pod (``self.pod`` is the pod as it was when started:
        #: the agent rewrites the file for every pod started or ended, a gang's worth of times)
        self.dns_names = podenv.dns_names(pod)
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
        return [
            c.pgid for c in self.init + self.containers if c.pgid and c.proc is not None and c.proc.returncode is None
        ]

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
        if (self.pod.get("metadata") or {}).get("finalizers"):
            await self._report_terminal()  # before forget(): the agent ends forgotten pods its own way
        self.agent.forget(self)
        self._cleanup()
        await retry(
            lambda: self.agent.client.delete(
                f"/api/v1/namespaces/{self.ns}/pods/{self.name}",
                {
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": self.uid},
                },
            ),
            what=f"delete {self.ns}/{self.name}",
        )

    async def _report_terminal(self) -> None:
        """Write the terminal phase a kubelet writes before its final delete: with another
        finalizer holding the pod that delete only marks it, and the pod would stay Pending or
        Running while Terminating (a controller waiting for Failed/Succeeded, Kueue's pod
        integration among them, would wait forever)."""
        for c in self.init + self.containers:
            if c.terminated:
                continue
            if c.proc is not None and c.proc.returncode is not None:
                rc = c.proc.returncode
                code = 128 - rc if rc < 0 else rc
                c.state = {"terminated": self._terminated(code, "Completed" if code == 0 else "Error", c.started_at)}
            elif "running" in c.state:  # simulated: its process would have ended on SIGTERM
                c.state = {"terminated": self._terminated(143, "Error", c.started_at)}
            else:  # never started: what a kubelet says of a container it cannot find
                c.state = {
                    "terminated": self._terminated(
                        137,
                        "ContainerStatusUnknown",
                        c.started_at,
                        "The container could not be located when the pod was terminated",
                    )
                }
            c.ready = False
        self._update_phase()
        await self._patch_status()

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
                contract.POD_IP.name: self.node.ip,
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
                    preexec_fn=die_with_agent,
                )
            except (FileNotFoundError, PermissionError, NotADirectoryError) as exc:
                out.write(f"railyard local: cannot start {argv[0]!r}: {exc}\n".encode())
                c.state = {
                    "terminated": self._terminated(
                        127 if isinstance(exc, FileNotFoundError) else 126, "StartError", c.started_at, str(exc)
                    )
                }
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
        c.state = {
            "terminated": self._terminated(
                code, "Completed" if code == 0 else "Error", c.started_at, self._termination_message(c, code)
            )
        }
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
            c.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {delay:.0f}s restarting failed container",
                }
            }
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
                        probe = self.agent.tasks.spawn(
                            self._probe(c), f"readiness probe {self.ns}/{self.name}/{c.name}"
                        )
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
                c.state = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {delay:.0f}s restarting failed container={c.name}",
                    }
                }
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
                    start_new_session=True, preexec_fn=die_with_agent,
                )
                try:
                    async with asyncio.timeout(timeout):
                        return await proc.wait() == 0
                except TimeoutError:
                    killpg(proc.pid, signal.SIGKILL)
                    return False
            port = self._port((probe.get("tcpSocket") or probe.get("httpGet") or {}).get("port"), c)
            if probe.get("tcpSocket"):
                async with asyncio.timeout(timeout):
                    _, writer = await asyncio.open_connection(self.node.ip, port)
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
            async with asyncio.timeout(timeout):
                await asyncio.gather(*(p.wait() for p in procs))
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
                    # the pod answered is not read (decoding it was a tenth of the runtime's CPU)
                    lambda: self.agent.client.patch(f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status", body,
                                                    answer=False),
                    what=f"status {self.ns}/{self.name}",
                )
            except ApiError as exc:
                log.warning("status of %s/%s not written: %s", self.ns, self.name, exc)
        self.agent.on_processes_changed(self.node.name)
