"""The rank's own hang detector: no step reported for ``limit_s`` exits the process with
HANG_OR_STRAGGLER (76). Torch-free: the bundled trainer and the SDK (for programs that report
their steps) use this one class.

It runs in a thread because a hung rank's main thread is stuck (in a collective, in a fault's
sleep, in a deadlock). It is paused around checkpoint saves, which may legitimately be long, and
wherever the program says no step is due (``railyard_trainer.sdk.paused``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

from railyard.protocol.exitcodes import ExitCode
from railyard_trainer.events import log_event


class Watchdog:
    def __init__(self, limit_s: float, *, rank: int) -> None:
        self.limit_s = limit_s
        self.rank = rank
        self._last = time.monotonic()
        self._allowance = limit_s
        self._paused = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="railyard-watchdog", daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def start(self, *, first_step_factor: float = 5.0) -> None:
        """Start watching (once; later calls only beat): the first step may take
        ``first_step_factor`` times the limit (compilation, warm-up)."""
        self.beat(allowance_factor=first_step_factor)
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()

    def beat(self, *, allowance_factor: float = 1.0) -> None:
        self._last = time.monotonic()
        self._allowance = self.limit_s * allowance_factor

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1
            self.beat()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.limit_s / 4)):
            idle = time.monotonic() - self._last
            if not self._paused and idle > self._allowance:
                log_event("hang_detected", rank=self.rank, idle_s=round(idle, 2), limit_s=self.limit_s)
                os._exit(ExitCode.HANG_OR_STRAGGLER)

    def stop(self) -> None:
        self._stop.set()
