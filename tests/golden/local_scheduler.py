"""The local scheduler run beside a replayed API server, in a thread of the test process, as
the recorded clusters ran kube-scheduler beside theirs."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path

from railyard_local.devices import RESOURCE_API
from railyard_local.kube import Informer, KubeClient
from railyard_local.scheduler import PODGROUPS, Scheduler

from .replay import Client


class SchedulerThread:
    """The local scheduler with its node, pod and PodGroup (and DRA) informers, on its own event loop."""

    def __init__(self, kubeconfig: Path, *, dra: bool = False, field_manager: str = "sched") -> None:
        """``dra``: also feed it ResourceSlices, DeviceClasses and ResourceClaims; ``field_manager``:
        the name the recorded scheduler's writes carry in managedFields."""
        self.kubeconfig = kubeconfig
        self.dra = dra
        self.field_manager = field_manager
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name="golden-scheduler", daemon=True)
        self._stop: asyncio.Event | None = None
        self._sched: Scheduler | None = None
        self._run_task: asyncio.Task[None] | None = None

    def _main(self) -> None:
        self.loop.run_until_complete(self._run())

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        client = KubeClient.from_kubeconfig(str(self.kubeconfig))
        informers = [Informer(client, p, n) for p, n in (("/api/v1/nodes", "nodes"), ("/api/v1/pods", "pods"),
                                                          (f"{PODGROUPS}/podgroups", "podgroups"))]
        nodes, pods, groups = informers
        plurals = ("resourceslices", "deviceclasses", "resourceclaims") if self.dra else ()
        dra = [Informer(client, f"{RESOURCE_API}/{p}", p) for p in plurals]
        sched = Scheduler(client, pods.cache, podgroups=groups.cache, field_manager=self.field_manager,
                          slices=dra[0].cache if dra else None, device_classes=dra[1].cache if dra else None,
                          claims=dra[2].cache if dra else None)
        nodes.add_handler(sched.on_node)
        pods.add_handler(sched.on_pod)
        groups.add_handler(sched.on_podgroup)
        for informer, handler in zip(dra, (sched.on_slice, sched.on_device_class, sched.on_claim), strict=False):
            informer.add_handler(handler)
        informers = [*dra, *informers]
        self._sched = sched
        tasks = [asyncio.create_task(i.run()) for i in informers]
        self._run_task = asyncio.create_task(sched.run())
        try:
            await self._stop.wait()
        finally:
            for t in [*tasks, self._run_task]:
                t.cancel()
            for t in [*tasks, self._run_task]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            await client.close()

    def start(self) -> None:
        self.thread.start()

    def pause(self, _: Client) -> None:
        """No decisions until :meth:`resume` (changes queue up meanwhile)."""
        def cancel() -> None:
            if self._run_task is not None:
                self._run_task.cancel()
        self.loop.call_soon_threadsafe(cancel)

    def resume(self, _: Client) -> None:
        def restart() -> None:
            if self._sched is not None:
                self._run_task = self.loop.create_task(self._sched.run())
        self.loop.call_soon_threadsafe(restart)

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(timeout=30)
