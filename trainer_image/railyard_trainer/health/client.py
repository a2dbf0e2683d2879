"""Heartbeats from the trainer: per-rank senders and one aggregator per pod.

Batching per pod (the operator sees 2,048 POSTs per interval, not 16,384): every rank sends
its latest beat as one datagram over a Unix socket private to the pod (namespace, job, attempt, pod index
in the name); local rank 0 runs :class:`PodAggregator` in a daemon thread, which keeps the
newest beat per rank and POSTs one :class:`HeartbeatBatch` per interval. Datagrams never block
(a full buffer or a missing aggregator drops the beat), and the POST runs in the aggregator's
thread, so nothing here can stall a training step. Failed POSTs are logged (rate limited) and
retried at the next interval with what accumulated (health results and checkpoint events are
kept until delivered, bounded). A rank that stops sending (its process died) drops out of the
batch after ``3 x interval`` so the operator's dead-rank rule sees it; a rank whose main thread
hangs keeps beating from its sender thread with a step that no longer advances (a hang).

The end of an attempt: ranks close one by one, not together, and local rank 0's aggregator must
not post its last batch before the others' last beats arrived (the job's status would end a step
short). A closing rank marks its last datagram ``final``; the stopping aggregator waits, bounded
by :data:`FINAL_WAIT_INTERVALS` intervals (at least :data:`FINAL_WAIT_MIN_S`), for the final beat
of every rank still beating, and a rank that fell silent is not waited for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from railyard.protocol.heartbeat import (
    MAX_HEALTH_RESULTS,
    MAX_RECENT_STEPS,
    CheckpointEvent,
    HealthResult,
    HeartbeatBatch,
    RankBeat,
    heartbeat_from_dict,
)

log = logging.getLogger(__name__)

#: post(url, token, body) -> HTTP status; raises OSError on transport errors.
Poster = Callable[[str, str, bytes], int]


def aggregator_path(namespace: str, job: str, attempt: int, pod_index: int) -> str:
    """A socket path unique to the pod: several pods may share a machine (the local cluster, or
    two jobs of the same name in different namespaces on one host)."""
    key = hashlib.sha1(f"{namespace}/{job}/{attempt}/{pod_index}/{os.getuid()}".encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"railyard-hb-{key}.sock")


def post_json(url: str, token: str, body: bytes, timeout_s: float = 5.0) -> int:
    req = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


#: How long a stopping aggregator waits for the final beats of its pod's other ranks, in
#: heartbeat intervals and at least ``FINAL_WAIT_MIN_S`` (a bound: a clean end takes milliseconds).
FINAL_WAIT_INTERVALS = 4
FINAL_WAIT_MIN_S = 2.0


class BeatSender:
    """The rank's end: fire-and-forget datagrams to the pod's aggregator."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.dropped = 0

    def send(self, message: dict[str, Any]) -> bool:
        try:
            self.sock.sendto(json.dumps(message, separators=(",", ":")).encode(), self.path)
            return True
        except OSError:
            self.dropped += 1
            return False

    def close(self) -> None:
        self.sock.close()


class PodAggregator(threading.Thread):
    """Local rank 0's thread: gathers the pod's rank beats and posts one batch per interval."""

    def __init__(
        self,
        *,
        url: str,
        token: str,
        job: str,
        attempt: int,
        pod_index: int,
        node: str,
        interval_s: float,
        path: str,
        post: Poster = post_json,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(name="railyard-heartbeats", daemon=True)
        self.url, self.token = url, token
        self.job, self.attempt, self.pod_index, self.node = job, attempt, pod_index, node
        self.interval_s = interval_s
        self.path = path
        self.post, self.clock = post, clock
        self._latest: dict[int, tuple[float, dict[str, Any]]] = {}
        self._health: dict[int, list[dict[str, Any]]] = {}
        self._recent: dict[int, list[float]] = {}
        self._checkpoints: list[dict[str, Any]] = []
        self._restored: tuple[str, int] = ("", -1)
        self._final: set[int] = set()
        self.final_wait_s = max(FINAL_WAIT_MIN_S, FINAL_WAIT_INTERVALS * interval_s)
        self._halt = threading.Event()
        self._urgent = threading.Event()
        self.posted = 0
        self.failures = 0
        #: the operator answered 409: a newer attempt started, this process's beats are over
        self.superseded = False
        self._last_error_log = 0.0
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(min(0.2, interval_s / 4))

    def run(self) -> None:
        next_post = self.clock() + self.interval_s
        try:
            while not self._halt.is_set():
                self._receive_until(next_post)
                if self._halt.is_set():
                    break
                self.flush()
                next_post = self.clock() + self.interval_s
        finally:
            # the ranks' last beats (sent just before stop, e.g. the final step) may still be
            # queued in the socket: read them before the final post, or the status misses them
            with contextlib.suppress(OSError):
                self._drain()
                self._await_final_beats()
            self.flush()
            self.sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def _drain(self) -> None:
        """Accept every datagram already queued, without waiting for more."""
        self.sock.setblocking(False)
        while True:
            try:
                data = self.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                return
            self.accept(data)

    def waiting_for(self) -> list[int]:
        """The ranks still beating whose final beat has not arrived."""
        now, stale = self.clock(), 3 * self.interval_s
        return [r for r, (at, _) in sorted(self._latest.items()) if r not in self._final and now - at <= stale]

    def _await_final_beats(self) -> None:
        deadline = time.monotonic() + self.final_wait_s
        self.sock.settimeout(min(0.05, self.interval_s / 4))
        while self.waiting_for() and time.monotonic() < deadline:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            self.accept(data)
        if self.waiting_for():
            log.info(
                "heartbeat aggregator: no final beat from ranks %s within %.1fs; posting without it",
                self.waiting_for(),
                self.final_wait_s,
            )

    def _receive_until(self, deadline: float) -> None:
        while not self._halt.is_set() and not self._urgent.is_set() and self.clock() < deadline:
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                return
            self.accept(data)
        self._urgent.clear()

    def accept(self, data: bytes) -> None:
        """Take one rank datagram (bad ones are dropped: they come from our own pod)."""
        try:
            msg = json.loads(data)
            beat = msg["beat"]
            rank = int(beat["rank"])
        except (ValueError, KeyError, TypeError):
            log.debug("heartbeat aggregator: dropped a malformed datagram")
            return
        recent = self._recent.setdefault(rank, [])
        recent.extend(float(x) for x in beat.pop("recent_compute_s", []))
        del recent[:-MAX_RECENT_STEPS]
        health = self._health.setdefault(rank, [])
        health.extend(beat.pop("health", []))
        del health[:-MAX_HEALTH_RESULTS]
        self._latest[rank] = (self.clock(), beat)
        self._checkpoints.extend(msg.get("checkpoints", []))
        del self._checkpoints[:-32]
        if msg.get("restored_tier"):
            self._restored = (str(msg["restored_tier"]), int(msg.get("restored_step", -1)))
        if msg.get("final"):
            self._final.add(rank)
        if msg.get("urgent"):
            self._urgent.set()

    def build_batch(self) -> HeartbeatBatch | None:
        now = self.clock()
        stale = 3 * self.interval_s
        ranks = []
        for rank, (at, beat) in sorted(self._latest.items()):
            if now - at > stale:
                continue
            raw = dict(beat, health=self._health.get(rank, []), recent_compute_s=self._recent.get(rank, []))
            ranks.append(raw)
        if not ranks:
            return None
        raw_batch = {
            "job": self.job,
            "attempt": self.attempt,
            "pod_index": self.pod_index,
            "node": self.node,
            "sent_at": now,
            "ranks": ranks,
            "checkpoints": self._checkpoints,
            "restored_tier": self._restored[0],
            "restored_step": self._restored[1],
        }
        return heartbeat_from_dict(raw_batch)

    def flush(self) -> bool:
        if self.superseded:
            return False
        try:
            batch = self.build_batch()
        except ValueError as exc:  # a rank sent something the protocol refuses: drop it all
            log.warning("heartbeat aggregator: dropping an invalid batch: %s", exc)
            self._health.clear()
            self._checkpoints.clear()
            return False
        if batch is None:
            return False
        try:
            status = self.post(self.url, self.token, batch.to_json().encode())
        except OSError as exc:
            status = 0
            err = repr(exc)
        else:
            err = f"HTTP {status}"
        if 200 <= status < 300:
            self.posted += 1
            self._health.clear()
            self._recent.clear()
            self._checkpoints.clear()
            return True
        self.failures += 1
        if status == 409:
            # the one 409 the operator sends: the job's attempt is newer than ours. Expected when a
            # restart overtakes a process's last post; nothing this process says counts any more
            self.superseded = True
            log.warning(
                "heartbeat POST to %s refused (HTTP 409): attempt %d is over, a newer one started; "
                "this process posts no more beats",
                self.url,
                self.attempt,
            )
            return False
        if status in (400, 401, 403, 404, 413):  # will not get better by resending the same
            self._health.clear()
            self._checkpoints.clear()
        now = self.clock()
        if now - self._last_error_log > 60:
            self._last_error_log = now
            log.warning(
                "heartbeat POST to %s failed (%s); %d failures so far, retrying every %.1fs",
                self.url,
                err,
                self.failures,
                self.interval_s,
            )
        return False

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after the final post (which waits up to ``final_wait_s`` for the other ranks)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout_s + self.final_wait_s)


def beat_message(
    beat: RankBeat,
    *,
    checkpoints: list[CheckpointEvent] | None = None,
    restored: tuple[str, int] | None = None,
    urgent: bool = False,
    final: bool = False,
) -> dict[str, Any]:
    from dataclasses import asdict

    msg: dict[str, Any] = {"beat": asdict(beat)}
    if checkpoints:
        msg["checkpoints"] = [asdict(c) for c in checkpoints]
    if restored is not None:
        msg["restored_tier"], msg["restored_step"] = restored
    if urgent:
        msg["urgent"] = True
    if final:
        msg["final"] = True
    return msg


__all__ = ["BeatSender", "HealthResult", "PodAggregator", "aggregator_path", "beat_message", "post_json"]
