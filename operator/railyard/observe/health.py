"""One object for the operator to hold: the heartbeat store, per-job detection state, metrics.

The kopf timer of a running job calls :meth:`HealthService.evaluate` with the pods it sees and
gets a :class:`~railyard.logic.health.HealthDecision`; everything else (windows, hysteresis
state, the Prometheus series) is kept here, keyed by (namespace, job).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from railyard.logic.health import (
    HealthDecision,
    HealthPolicy,
    HealthState,
    PodStatus,
    decide_health,
)
from railyard.logic.health.window import HeartbeatStore
from railyard.observe.health_metrics import HealthMetrics
from railyard.observe.heartbeats import TokenLookup, add_heartbeat_routes


class HealthService:
    def __init__(self, store: HeartbeatStore | None = None, metrics: HealthMetrics | None = None) -> None:
        self.store = store if store is not None else HeartbeatStore()
        self.metrics = metrics
        self._state: dict[tuple[str, str], HealthState] = {}

    def add_routes(self, app: web.Application, token_for: TokenLookup) -> None:
        """Mount ``POST /v1/heartbeats/{namespace}/{job}`` on the operator's aiohttp app."""
        add_heartbeat_routes(app, self.store, token_for, metrics=self.metrics)

    def begin_attempt(self, namespace: str, job: str, attempt: int) -> None:
        """Call when the job's attempt starts: older attempts' heartbeats are refused (409)."""
        self.store.begin_attempt(namespace, job, attempt)

    def evaluate(
        self,
        namespace: str,
        job: str,
        attempt: int,
        pods: Mapping[int, PodStatus],
        health_spec: Mapping[str, Any] | None,
        now: float,
    ) -> HealthDecision:
        """Judge the job now. ``health_spec`` is ``spec.health`` as a camelCase dict."""
        jw = self.store.job(namespace, job)
        if jw is None or jw.attempt < attempt:
            jw = self.store.begin_attempt(namespace, job, attempt)
        key = (namespace, job)
        decision = decide_health(
            jw, pods, self._state.get(key, HealthState()), HealthPolicy.from_spec(health_spec), now
        )
        self._state[key] = decision.state
        if self.metrics is not None:
            self.metrics.observe_decision(namespace, job, decision)
        return decision

    def forget(self, namespace: str, job: str) -> None:
        self.store.forget_job(namespace, job)
        self._state.pop((namespace, job), None)
        if self.metrics is not None:
            self.metrics.forget_job(namespace, job)
