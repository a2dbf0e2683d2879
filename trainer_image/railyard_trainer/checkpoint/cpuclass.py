"""The background CPU class: how the checkpoint's background threads (the writer, and the
threads of the checkpoint's own gloo group) share the CPU with training (Linux, per thread; see
settings.CPU_CLASSES), and that gloo group itself (:func:`checkpoint_group`). Torch-light: only
``torch.distributed`` for the group.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

from railyard_trainer.checkpoint.settings import DEFAULT_CPU_CLASS

#: The background threads' nice value (Linux, per thread), in and out of the idle class.
WRITER_NICE = 10


_T = TypeVar("_T")


def _set_class(tid: int, idle: bool) -> bool:
    """Put thread ``tid`` in the idle class, or in the normal class at its nice value."""
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
        return True
    except (AttributeError, OSError):
        return False


def _scheduling(tid: int) -> tuple[int, int] | None:
    try:
        return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)
    except (AttributeError, OSError):
        return None


def _background_once() -> None:
    """The calling thread at nice :data:`WRITER_NICE`, then in the idle class, then out of it:
    raises OSError where the kernel refuses any of it."""
    tid = threading.get_native_id()
    os.setpriority(os.PRIO_PROCESS, tid, WRITER_NICE)
    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def can_leave_idle_class() -> bool:
    """Whether this process may take a thread out of Linux's idle class again (CAP_SYS_NICE, or
    an RLIMIT_NICE that allows nice :data:`WRITER_NICE`): tried on a thread of its own."""
    ok: list[bool] = []

    def probe() -> None:
        try:
            _background_once()
            ok.append(True)
        except (AttributeError, OSError):
            ok.append(False)

    t = threading.Thread(target=probe, name="railyard-ckpt-probe", daemon=True)
    t.start()
    t.join()
    return bool(ok and ok[0])


def resolve_cpu_class(setting: str, can_leave_idle: Callable[[], bool] = can_leave_idle_class) -> str:
    """``auto`` is ``idle`` where the idle class can be left again (so that a save training
    waits for is never starved: :meth:`BackgroundCpu.boost`), else ``nice``."""
    if setting != "auto":
        return setting
    return "idle" if can_leave_idle() else "nice"


class BackgroundCpu:
    """How the checkpoint's background threads (the writer, and the threads of the checkpoint's
    own gloo group, which move the replica's bytes) share the CPU with training (Linux, per
    thread; see settings.CPU_CLASSES).

    ``idle``: Linux's SCHED_IDLE at nice :data:`WRITER_NICE`; they run on CPU time no other
    thread wants, so a save beside training that keeps the cores busy delays it least (the bench
    measured the training threads' wait for a CPU per save at a fraction of nice 10's). Where
    other work keeps every core busy, an idle-class thread gets almost nothing (the multiprocess
    checkpoint tests beside two busy loops on 2 cores: 295 s against 52 s at nice 10), so
    whenever training has to wait for them (:meth:`boost`: a save waiting behind the one in
    flight, ``wait``, ``close``) or a save overran its interval, they run at nice 10 until the
    writer is idle again. ``nice``: nice :data:`WRITER_NICE`, a small share of a busy core."""

    def __init__(self, cpu_class: str) -> None:
        self.cpu_class = cpu_class
        self._tids: list[int] = []
        self._lock = threading.Lock()
        self._boosts = 0

    @property
    def idle(self) -> bool:
        return self.cpu_class == "idle"

    @property
    def boosted(self) -> bool:
        return self._boosts > 0

    def apply(self) -> None:
        """The calling thread in the background class, as it is now (it is not boosted with
        the others: a thread that ends soon, such as the bench's)."""
        with self._lock:
            self._apply_locked(threading.get_native_id())

    def _apply_locked(self, tid: int) -> None:
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, tid, WRITER_NICE)
        if self.idle:
            _set_class(tid, idle=not self.boosted)

    def join(self) -> None:
        """Put the calling thread (for good: it does nothing else) in the background class, and
        boost it with the others until it leaves (:meth:`leave`)."""
        tid = threading.get_native_id()
        with self._lock:  # one hold: a boost cannot fall between the class and the list
            self._apply_locked(tid)
            self._tids.append(tid)

    def leave(self) -> None:
        """The calling thread ends: no longer boosted (its id may be reused by another)."""
        tid = threading.get_native_id()
        with self._lock:
            self._tids = [t for t in self._tids if t != tid]

    def start(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` on a helper thread in the background class; the threads it starts (which
        inherit the class) are the object's too. Exceptions are raised on the calling thread."""
        out: list[_T] = []
        failed: list[BaseException] = []
        before = set(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else set()
        helper_sched: list[tuple[int, int] | None] = []

        def run() -> None:
            self.apply()
            helper_sched.append(_scheduling(threading.get_native_id()))
            try:
                out.append(fn())
            except BaseException as exc:
                failed.append(exc)

        helper = threading.Thread(target=run, name="railyard-ckpt-helper", daemon=True)
        helper.start()
        helper.join()
        if failed:
            raise failed[0]
        if before and helper_sched and helper_sched[0] is not None:
            # Only the threads that inherited the helper's scheduling (gloo's): none that some
            # other thread happened to start meanwhile.
            new = sorted(int(t) for t in set(os.listdir("/proc/self/task")) - before)
            with self._lock:
                self._tids += [t for t in new if t != helper.native_id and _scheduling(t) == helper_sched[0]]
        return out[0]

    @property
    def tids(self) -> list[int]:
        with self._lock:
            return list(self._tids)

    def boost(self) -> None:
        """Training waits for the background threads: out of the idle class until :meth:`unboost`
        (counted; a no-op for ``nice``)."""
        if not self.idle:
            return
        with self._lock:
            self._boosts += 1
            if self._boosts == 1:
                for tid in self._tids:
                    _set_class(tid, idle=False)

    def unboost(self) -> None:
        if not self.idle:
            return
        with self._lock:
            self._boosts = max(0, self._boosts - 1)
            if self._boosts == 0:
                for tid in self._tids:
                    _set_class(tid, idle=True)

    @contextlib.contextmanager
    def boosting(self) -> Iterator[None]:
        """Boosted for the block: training runs a collective on the checkpoint group (its gloo
        threads do the work while training waits), e.g. the manager's start and a restore."""
        self.boost()
        try:
            yield
        finally:
            self.unboost()


def checkpoint_group(timeout_s: float, background: BackgroundCpu | None = None) -> dist.ProcessGroup:
    """The checkpoint's own gloo process group (collective: every rank, in the same order as
    its other groups). It is made on a helper thread in the background CPU class
    (:class:`BackgroundCpu`, by default the ``nice`` class): gloo's threads (the socket loop that
    moves the replica's bytes, and the work runners) inherit the scheduling of the thread that
    creates them, so the save's transfers yield the CPU to training as the writer thread does."""
    cpu = background or BackgroundCpu(resolve_cpu_class(DEFAULT_CPU_CLASS))
    return cpu.start(lambda: dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)))
