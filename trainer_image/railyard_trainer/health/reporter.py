"""One rank's heartbeats: what it tells the operator, and the threads that carry it.

Every rank keeps its latest beat here (step, step time, the speed probe's compute time, loss,
throughput), the health results and checkpoint events not yet delivered, and the restore point
of its attempt. A daemon thread sends the beat as a datagram to the pod's aggregator every half
interval (so a rank whose main thread hangs keeps beating with a step that no longer advances:
the hang signal); local rank 0 runs the aggregator (:class:`~.client.PodAggregator`), which
posts one batch per pod and interval. Torch-free: the SDK (railyard_trainer.sdk) owns one per
process and the health monitor adds its results to the same one, so the bundled trainer and a
program of one's own report through the same path.

A rank starts with ``progress`` false: it is alive, but its step means nothing, and the
operator's hang and straggler rules skip it until the program reports a step
(:meth:`Reporter.report_step`) or opts in (:meth:`Reporter.begin_progress`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from railyard.protocol import podenv
from railyard.protocol.heartbeat import MAX_RECENT_STEPS, CheckpointEvent, HealthResult, RankBeat
from railyard_trainer.health.client import BeatSender, PodAggregator, aggregator_path, beat_message

log = logging.getLogger(__name__)

#: Most undelivered health results a rank keeps (the newest win).
MAX_PENDING_RESULTS = 32


class Reporter:
    def __init__(
        self,
        *,
        rank: int,
        local_rank: int,
        pod_index: int,
        node: str,
        job: str,
        namespace: str,
        attempt: int,
        url: str = "",
        token: str = "",
        interval_s: float = 2.0,
        progress: bool = False,
    ) -> None:
        self.rank, self.local_rank, self.pod_index, self.node = rank, local_rank, pod_index, node
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._beat = RankBeat(rank=rank, step=0, step_time_s=0.0, progress=progress)
        self._results: list[HealthResult] = []
        self._recent: list[float] = []
        self._checkpoints: list[CheckpointEvent] = []
        self._restored: tuple[str, int] | None = None
        self._saving: list[Callable[[], bool]] = []
        self._waiting: list[Callable[[], bool]] = []
        self._fingerprint: tuple[int, str] = (-1, "")
        self._paused = 0
        self._last_sent = 0.0
        self._stop = threading.Event()
        self.aggregator: PodAggregator | None = None
        self.sender: BeatSender | None = None
        self._thread: threading.Thread | None = None
        if url:
            path = aggregator_path(namespace, job, attempt, pod_index)
            if local_rank == 0:
                self.aggregator = PodAggregator(
                    url=url, token=token, job=job, attempt=attempt, pod_index=pod_index, node=node,
                    interval_s=interval_s, path=path,
                )
                self.aggregator.start()
            self.sender = BeatSender(path)
            self._thread = threading.Thread(target=self._beat_loop, name="railyard-rank-beat", daemon=True)
            self._thread.start()

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, rank: int, local_rank: int, pod_index: int, node: str, job: str,
        namespace: str, attempt: int, interval_s: float, progress: bool = False,
    ) -> Reporter:
        """Heartbeats to ``RAILYARD_HEARTBEAT_URL`` with ``RAILYARD_HEARTBEAT_TOKEN`` (the pod
        contract); without a URL nothing is sent and every call is cheap."""
        return cls(
            rank=rank, local_rank=local_rank, pod_index=pod_index, node=node, job=job, namespace=namespace,
            attempt=attempt, url=podenv.HEARTBEAT_URL.get(env), token=podenv.HEARTBEAT_TOKEN.get(env),
            interval_s=interval_s, progress=progress,
        )

    # ------------------------------------------------------------------ what the rank says
    @property
    def active(self) -> bool:
        """Whether beats go anywhere (the pod has an operator to talk to)."""
        return self.sender is not None

    @property
    def progress(self) -> bool:
        return self._beat.progress

    @property
    def step(self) -> int:
        return self._beat.step

    def begin_progress(self) -> None:
        """From now on the rank's step is its progress: the operator's hang rule applies."""
        with self._lock:
            self._beat = replace(self._beat, progress=True)

    def set_step(self, step: int) -> None:
        """The step the rank stands at without having trained it (after a restore)."""
        with self._lock:
            self._beat = replace(self._beat, step=max(0, step))

    def report_step(
        self,
        step: int,
        *,
        step_time_s: float,
        compute_s: float = 0.0,
        loss: float | None = None,
        grad_norm: float | None = None,
        tokens_per_s: float = 0.0,
    ) -> None:
        """A finished step (opts the rank into progress reports). Sent at once when half an
        interval passed since the last beat, else by the beat thread."""
        with self._lock:
            if math.isfinite(compute_s) and compute_s > 0:
                self._recent.append(compute_s)
                del self._recent[:-MAX_RECENT_STEPS]
            self._beat = RankBeat(
                rank=self.rank, step=max(0, int(step)), step_time_s=_non_negative(step_time_s),
                compute_s=_non_negative(compute_s), loss=loss, grad_norm=grad_norm,
                tokens_per_s=_non_negative(tokens_per_s), progress=True,
            )
        if time.monotonic() - self._last_sent >= self.interval_s / 2:
            self.send()

    def add_result(self, result: HealthResult) -> None:
        with self._lock:
            self._results.append(result)
            del self._results[:-MAX_PENDING_RESULTS]

    def note_checkpoint(self, event: CheckpointEvent) -> None:
        """A committed (or failed) save or a restore; forwarded to the operator."""
        with self._lock:
            self._checkpoints.append(event)

    def note_restore(self, tier: str, step: int) -> None:
        with self._lock:
            self._restored = (tier, step)

    def add_saving_probe(self, is_saving: Callable[[], bool]) -> None:
        """A callable that says a save is in flight (heartbeat ``saving``: no hang verdict)."""
        with self._lock:
            if is_saving not in self._saving:
                self._saving.append(is_saving)

    def add_waiting_probe(self, is_waiting: Callable[[], bool]) -> None:
        """A callable that says the rank waits for the other replica groups (heartbeat
        ``waiting_for_groups``: a hang of another group stalls it, the verdict names that group)."""
        with self._lock:
            if is_waiting not in self._waiting:
                self._waiting.append(is_waiting)

    def set_fingerprint(self, step: int, fingerprint: str) -> None:
        """The rank's state fingerprint after ``step`` (faultTolerance ReplicaGroups: the
        operator compares it with the same rank of the other groups). Sent with every beat
        until the next one."""
        with self._lock:
            self._fingerprint = (step, fingerprint)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No step is due while inside (an evaluation, a long save): the beats say ``saving``,
        which the operator's hang rule honours, and the clock restarts when it ends."""
        with self._lock:
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    # ------------------------------------------------------------------ sending
    def send(self, *, force: bool = False, urgent: bool = False, final: bool = False) -> None:
        """One datagram with the latest beat and what accumulated (``force``: even when the beat
        thread just sent; ``urgent``: the aggregator posts at once; ``final``: the rank's last,
        which the pod's aggregator waits for before its own last post)."""
        if self.sender is None:
            with self._lock:
                self._results.clear()
                self._checkpoints.clear()
            return
        with self._lock:
            saving = self._paused > 0 or _any(self._saving)
            b = self._beat
            beat = replace(
                b,
                loss=_finite_or_none(b.loss),
                grad_norm=_finite_or_none(b.grad_norm),
                saving=saving,
                fingerprint_step=self._fingerprint[0],
                fingerprint=self._fingerprint[1],
                waiting_for_groups=_any(self._waiting),
                health=tuple(self._results[-MAX_PENDING_RESULTS:]),
                recent_compute_s=tuple(x for x in self._recent if x >= 0 and math.isfinite(x)),
            )
            msg = beat_message(
                beat, checkpoints=list(self._checkpoints), restored=self._restored, urgent=urgent, final=final
            )
            if self.sender.send(msg):
                self._results.clear()
                self._recent.clear()
                self._checkpoints.clear()
            self._last_sent = time.monotonic()

    def flush(self) -> None:
        """Post the pod's batch now (local rank 0; others' datagrams are posted with it)."""
        if self.aggregator is not None:
            self.aggregator.flush()

    def _beat_loop(self) -> None:
        period = max(0.05, self.interval_s / 2)
        while not self._stop.wait(period):
            if time.monotonic() - self._last_sent >= period:
                self.send()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.send(force=True, final=True)  # after the beat thread stopped: nothing follows it
        if self.aggregator is not None:
            self.aggregator.stop()
        if self.sender is not None:
            self.sender.close()


def _any(probes: list[Callable[[], bool]]) -> bool:
    """Whether a probe says yes (a probe that raises says nothing)."""
    for probe in probes:
        try:
            if probe():
                return True
        except Exception:
            continue
    return False


def _non_negative(v: float) -> float:
    return v if math.isfinite(v) and v > 0 else 0.0


def _finite_or_none(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


__all__ = ["Reporter"]
