"""Background tasks of the local cluster's runtime that cannot die unnoticed.

Two kinds, two rules:

- :class:`Supervisor` runs the runtime's long-lived loops (the informers, the scheduler, node
  heartbeats, the hosts-file writer). Each must run as long as the process does: a cluster whose
  pod watch or scheduler loop has died leaves every pod waiting forever while the process looks
  alive. A loop that raises (or returns) is logged with its traceback and restarted with
  backoff; one that keeps dying (``max_restarts`` times within ``window_s``) stops the runtime
  with a message that names it, so that whoever started the cluster sees it exit.
- :class:`TaskSet` keeps the short fire-and-forget tasks (one binding, one status patch, one pod
  deletion). asyncio holds only weak references to tasks, and an exception in one would surface
  at best as "Task exception was never retrieved" when it is garbage-collected; here each task
  is kept until it ends and its failure is logged with its name.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any

log = logging.getLogger(__name__)


class TaskSet:
    """Short tasks that are kept until done; an exception is logged, never lost."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name or None)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("%s: background task %s failed", self.owner, task.get_name(), exc_info=exc)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    async def cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Supervisor:
    """Long-lived loops: restarted when they die, fatal when they keep dying."""

    def __init__(
        self,
        *,
        max_restarts: int = 5,
        window_s: float = 60.0,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
    ) -> None:
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        #: Why the runtime must stop (a loop that kept dying); None while all is well.
        self.fatal: str | None = None
        #: name -> how many times the loop was restarted.
        self.restarts: dict[str, int] = {}
        self._failed = asyncio.Event()
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        """Run ``factory()`` under supervision; ``factory`` is called again for each restart."""
        if name in self._tasks:
            raise ValueError(f"a supervised task named {name!r} is already running")
        self.restarts[name] = 0
        self._tasks[name] = asyncio.get_running_loop().create_task(self._guard(name, factory), name=name)

    async def _guard(self, name: str, factory: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        deaths: collections.deque[float] = collections.deque()
        delay = self.backoff_s
        while True:
            try:
                await factory()
                exc: BaseException = RuntimeError(f"{name} returned; it must run until the runtime stops")
            except asyncio.CancelledError:
                raise
            except Exception as error:
                exc = error
            now = loop.time()
            deaths.append(now)
            while deaths and now - deaths[0] > self.window_s:
                deaths.popleft()
            if len(deaths) > self.max_restarts:
                self.fatal = (
                    f"runtime task {name!r} died {len(deaths)} times within {self.window_s:g}s "
                    f"(last: {exc!r}); stopping the runtime, since the cluster cannot work without it. "
                    f"The traceback is above; restart the cluster with `railyard local up`."
                )
                log.critical("%s", self.fatal, exc_info=exc)
                self._failed.set()
                return
            self.restarts[name] += 1
            log.error("runtime task %r died; restarting it in %.1fs", name, delay, exc_info=exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)

    async def wait(self, stop: asyncio.Event) -> str | None:
        """Until ``stop`` is set (returns None) or a loop kept dying (returns why)."""
        stopper = asyncio.get_running_loop().create_task(stop.wait())
        failer = asyncio.get_running_loop().create_task(self._failed.wait())
        try:
            await asyncio.wait([stopper, failer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            failer.cancel()
        return self.fatal

    async def cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
