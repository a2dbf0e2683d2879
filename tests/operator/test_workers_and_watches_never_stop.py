"""The operator never waits forever: a job's worker that dies is logged and restarted, and every
kopf watch is bounded (server timeout, client timeout, and an inactivity timeout longer than
any API server's bookmark interval)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from prometheus_client import CollectorRegistry

from railyard.handlers import runtime as runtime_mod
from railyard.handlers.kopf_handlers import (
    WATCH_INACTIVITY_S,
    WATCH_SERVER_TIMEOUT_S,
    apply_watch_settings,
)
from railyard.handlers.runtime import JobWorker, OperatorSettings, Runtime

#: Only catches a hang: the wait ends as soon as the worker has run again.
HANG = 20.0


class WorkerKilled(BaseException):
    """Escapes the worker's ``except Exception`` (as a bug in the loop itself would)."""


def test_a_dead_job_worker_is_logged_and_restarted(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_mod, "WORKER_RESTART_DELAY_S", 0.01)
    registry = CollectorRegistry()
    calls: list[int] = []
    again = asyncio.Event()

    async def reconcile(_rt: Runtime, w: JobWorker) -> float | None:
        calls.append(1)
        if len(calls) == 1:
            raise WorkerKilled("the loop itself broke")
        again.set()
        return None

    rt = Runtime(OperatorSettings(metrics_port=0, registry=registry, coalesce_s=0.0), reconcile)

    async def scenario() -> None:
        first = rt.upsert_job("ns", "job", {"metadata": {"uid": "u1"}})
        dead = first.task
        await asyncio.wait_for(again.wait(), HANG)
        assert rt.workers[("ns", "job")] is first and first.task is not dead and not first.task.done()  # type: ignore[union-attr]
        await rt.close()

    with caplog.at_level("ERROR", logger="railyard.handlers.runtime"):
        asyncio.run(scenario())
    assert len(calls) == 2
    assert any("worker of ns/job ended unexpectedly" in r.getMessage() and r.exc_info for r in caplog.records)
    assert registry.get_sample_value("railyard_reconcile_errors_total", {"kind": "WorkerDied"}) == 1.0


def test_a_deleted_jobs_worker_is_not_restarted() -> None:
    started = asyncio.Event()

    async def reconcile(_rt: Runtime, w: JobWorker) -> float | None:
        started.set()
        return None

    rt = Runtime(OperatorSettings(metrics_port=0, registry=CollectorRegistry(), coalesce_s=0.0), reconcile)

    async def scenario() -> Any:
        w = rt.upsert_job("ns", "job", {"metadata": {"uid": "u1"}})
        await asyncio.wait_for(started.wait(), HANG)
        await rt.remove_job("ns", "job")
        return w

    w = asyncio.run(scenario())
    assert w.gone and w.task is not None and w.task.cancelled()
    assert ("ns", "job") not in rt.workers


def test_every_watch_is_bounded_and_a_silent_one_is_reconnected() -> None:
    settings = kopf.OperatorSettings()
    apply_watch_settings(settings)
    w = settings.watching
    assert w.server_timeout == WATCH_SERVER_TIMEOUT_S
    # the client ends a request the server should have ended (a connection dead without a FIN)
    assert w.client_timeout is not None and w.client_timeout > w.server_timeout
    assert w.connect_timeout is not None and w.connect_timeout > 0
    # kopf >= 1.44 reconnects a stream quiet for this long; bookmarks come every 60 s at most
    if hasattr(w, "inactivity_timeout"):
        assert w.inactivity_timeout == WATCH_INACTIVITY_S
        assert 60.0 < w.inactivity_timeout < w.server_timeout
