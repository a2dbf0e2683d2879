"""The process node agent: runs every pod bound to a simulated node as local processes.

One :class:`~railyard_local.podworker.PodWorker` per pod (podworker.py) runs it; this module
watches pods, services and node controls and hands them out: it starts workers, finishes
deletions, reports pods lost to an earlier run of the agent, plays node faults (a failed node's
pods are killed; a slow node's processes run a duty cycle, faults.py), and writes the hosts file
pods resolve names with. Volumes live under ``<state>/nodes/<node>/`` (volumes.py). The pod IP is
the node's own loopback address.

Processes never outlive the agent: every group is killed on stop, and each direct child gets
PR_SET_PDEATHSIG so even a SIGKILLed agent takes its children along (processes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from railyard.api.corev1 import labels_match
from railyard.protocol.device import SimulatedDevice, write_device
from railyard_local import podenv, podlogs
from railyard_local.faults import run_duty_cycle
from railyard_local.kube import ApiError, Informer, KubeClient, Obj, key_of, retry
from railyard_local.nodes import NodeControl, now_iso
from railyard_local.podenv import PodContext
from railyard_local.podworker import SIMULATE_ANNOTATION, PodWorker
from railyard_local.processes import killpg
from railyard_local.tasks import TaskSet
from railyard_local.topology import NodeSpec
from railyard_local.volumes import DEFAULT_SHARED_HOST_PATHS, VolumeLayout

log = logging.getLogger(__name__)
RESOLVER_SOURCE = Path(__file__).with_name("_resolver_site.py")
DEFAULT_GRACE = 30


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
        self.volumes = VolumeLayout(state_dir, self.shared_host_paths)
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
        self._hosts_written: str | None = None
        """What the hosts file holds (written by this agent), None before the first write."""
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
        return self.volumes.node_dir(node)

    def device_file(self, node: str) -> Path:
        """The node's simulated accelerator (railyard.protocol.device), read by the trainer."""
        return self.node_dir(node) / "device.json"

    def _publish_device(self, node: str) -> None:
        write_device(self.device_file(node), SimulatedDevice(slow_factor=self.control(node).slow_factor))

    def host_path(self, node: str, path: str) -> Path:
        return self.volumes.host_path(node, path)

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
        """Create each volume's folder (volumes.py); returns volume name -> real path."""
        return self.volumes.materialise_volumes(pod, node, pod_dir, ctx, create=create)

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
                worker.pod = pod  # its finalizers decide whether the terminal phase is written first
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
            phase = (pod.get("status") or {}).get("phase")
            node = str((pod.get("spec") or {}).get("nodeName"))
            if meta.get("finalizers") and phase not in ("Succeeded", "Failed") and not self.control(node).failed:
                await self._report_lost(pod, reason="Deleted", message="the pod was deleted before its node ran it")
            await retry(
                lambda: self.client.delete(
                    f"/api/v1/namespaces/{ns}/pods/{name}",
                    {
                        "kind": "DeleteOptions",
                        "apiVersion": "v1",
                        "gracePeriodSeconds": 0,
                        "preconditions": {"uid": uid},
                    },
                )
            )
        except ApiError as exc:
            if exc.status != 409:
                log.warning("could not finish deletion of %s/%s: %s", ns, name, exc)
        finally:
            self._finishing.discard(str(uid))

    async def _report_lost(
        self,
        pod: Obj,
        *,
        reason: str = "NodeRestart",
        message: str = "the local cluster's node agent stopped while this pod ran; its processes are gone",
    ) -> None:
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        statuses = []
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            state = cs.get("state") or {}
            if "terminated" not in state:
                started = (state.get("running") or {}).get("startedAt", now_iso())
                state = {
                    "terminated": {
                        "exitCode": 137,
                        "reason": reason,
                        "signal": 9,
                        "startedAt": started,
                        "finishedAt": now_iso(),
                    }
                }
            statuses.append({**cs, "state": state, "ready": False})
        body = {
            "status": {
                "phase": "Failed",
                "reason": reason,
                "message": message,
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
                self._bg(
                    w.kill(reason="NodeFailed", message=f"node {node} failed (railyard local node fail)", report=True)
                )
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
        await run_duty_cycle(lambda: self.control(node).slow_factor, lambda: self.pgids_on(node))

    # --- DNS ---
    def build_hosts(self) -> str:
        lines = ["# written by the railyard local node agent: IP NAME...", "127.0.0.1 localhost"]
        running = [w for w in self.workers.values() if w.running]
        named = [w for w in running if w.dns_names]
        for w in sorted(named, key=lambda w: (w.ns, w.name)):
            lines.append(f"{w.node.ip} {' '.join(w.dns_names)}")
        for svc in self.services.values():
            meta = svc.get("metadata") or {}
            selector = (svc.get("spec") or {}).get("selector") or {}
            if not selector:
                continue  # a Service without a selector has no endpoints the agent knows of
            ns = meta.get("namespace", "default")
            ips = sorted(
                {
                    w.node.ip
                    for w in running
                    if w.ns == ns and labels_match(selector, (w.pod.get("metadata") or {}).get("labels") or {})
                }
            )
            names = podenv.service_names(str(meta.get("name")), ns)
            lines.extend(f"{ip} {' '.join(names)}" for ip in ips)
        return "\n".join(lines) + "\n"

    def _write_hosts(self) -> None:
        text = self.build_hosts()
        if text == self._hosts_written:
            return  # a gang's pods without hostnames change nothing in it
        tmp = self.hosts_file.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.hosts_file)
        self._hosts_written = text

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
        reports = [
            w.report_shutdown() for w in workers if w.restart_policy != "Always" and w.phase in ("Pending", "Running")
        ]
        if reports:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(3.0):
                    await asyncio.gather(*reports, return_exceptions=True)



def dump_status(agent: Agent) -> str:
    return json.dumps({uid: w.build_status()["phase"] for uid, w in agent.workers.items()})


# SIMULATE_ANNOTATION and DEFAULT_SHARED_HOST_PATHS: importers of railyard_local.agent keep working
__all__ = ["DEFAULT_SHARED_HOST_PATHS", "SIMULATE_ANNOTATION", "Agent", "PodWorker", "key_of"]
