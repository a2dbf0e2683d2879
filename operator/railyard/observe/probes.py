"""What ``/healthz`` (liveness) and ``/readyz`` (readiness) answer: facts the operator keeps about
itself, not "200 because the process exists".

* **Live** while no job's reconcile cycle has been running longer than ``stuck_after_s``. A cycle
  makes a bounded number of API calls, each with a timeout; one that has not returned in minutes
  is waiting on something that will not come (a wedged worker), and only a restart helps. The
  asyncio loop itself is covered by the probe answering at all: a loop blocked by synchronous
  work answers no HTTP request, and the kubelet's probe times out.
* **Ready** once started (kopf ran our start-up handler: API client and HTTP server up), synced
  (kopf has delivered an event to a non-index handler: kopf holds those back until every index
  -- pods by job, pods by node, nodes -- has its initial list, so the operator's view of the
  cluster is complete) and live.

Kubernetes restarts a container whose liveness fails and sends no traffic (heartbeats) to one
that is not ready; the chart points its probes here (helm/railyard/templates/deployment.yaml).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

Key = tuple[str, str]
#: Longer than any healthy cycle: a 1,000-pod gang is created in seconds, and one API call gives
#: up after its retries within about 7 minutes even against a server that accepts connections
#: and never answers (60 s per try, 6 retries).
DEFAULT_STUCK_AFTER_S = 600.0


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str


@dataclass
class Probes:
    """The facts, written by the runtime and kopf glue, read by the HTTP handlers."""

    stuck_after_s: float = DEFAULT_STUCK_AFTER_S
    clock: Callable[[], float] = time.monotonic
    started: bool = False
    synced: bool = False
    _in_flight: dict[Key, float] = field(default_factory=dict)

    def cycle_started(self, key: Key) -> None:
        self._in_flight[key] = self.clock()

    def cycle_finished(self, key: Key) -> None:
        self._in_flight.pop(key, None)

    def liveness(self) -> Verdict:
        now = self.clock()
        stuck = sorted((now - t0, key) for key, t0 in self._in_flight.items() if now - t0 > self.stuck_after_s)
        if stuck:
            age, (ns, name) = stuck[-1]
            more = f" (and {len(stuck) - 1} more)" if len(stuck) > 1 else ""
            return Verdict(False, f"the reconcile of {ns}/{name} has run for {age:.0f} s, over the "
                                  f"{self.stuck_after_s:.0f} s a cycle may take{more}: the worker is wedged")
        return Verdict(True, "ok")

    def readiness(self) -> Verdict:
        if not self.started:
            return Verdict(False, "starting: kopf has not run the operator's start-up yet")
        if not self.synced:
            return Verdict(False, "syncing: waiting for the initial list of nodes and pods")
        live = self.liveness()
        if not live.ok:
            return Verdict(False, live.reason)
        return Verdict(True, "ready")
