"""Trainer-side monitor and reporter -> per-pod aggregator -> the operator's ingest route -> the store.

The train loop reports its steps through the rank's reporter (what ``railyard_trainer.sdk.report_step``
does); the monitor adds its check results to the same reporter."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch
from tests.health.ingest import Server
from tests.waiting import wait_until

from railyard.logic.health import FaultKind, HealthPolicy, HealthState, PodStatus, decide_health
from railyard_trainer.health import build_health_monitor
from railyard_trainer.health.harness import build_model, flip_bit
from railyard_trainer.hooks import SDCDetected, StepMetrics, TrainContext


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    s = Server()
    monkeypatch.setenv("RAILYARD_HEARTBEAT_URL", s.url)
    monkeypatch.setenv("RAILYARD_HEARTBEAT_TOKEN", "s3cret")
    yield s
    s.close()


def _ctx(rank: int, local_rank: int, model: torch.nn.Module, job: str) -> TrainContext:
    return TrainContext(
        rank=rank, local_rank=local_rank, world_size=2, node="node-a", pod_index=0, job=job, attempt=0,
        dims=None, mesh=None, model_parts=[model], optimizer=None, lr_scheduler=None, data=None,
    )


def test_two_ranks_of_a_pod_arrive_in_one_batch_and_a_confirmed_sdc_reaches_the_operator(server: Server) -> None:
    config = {"health": {"heartbeatIntervalSeconds": 0.2, "sdc": {"intervalSteps": 1000}}}
    models = [build_model(0), build_model(0)]
    ctxs = [_ctx(0, 0, models[0], "job"), _ctx(1, 1, models[1], "job")]
    monitors = [build_health_monitor(config, c) for c in ctxs]
    try:
        for m, c in zip(monitors, ctxs, strict=True):
            m.preflight(c)
        for step in range(1, 4):
            for m, c in zip(monitors, ctxs, strict=True):
                c.step = step
                m.after_step(c, StepMetrics(step, 2.0, 1.0, 0.1, 0.05 * (1 + c.rank), 100.0, 1e-3))
                m.reporter.report_step(step, step_time_s=0.1, compute_s=0.05 * (1 + c.rank), loss=2.0, grad_norm=1.0, tokens_per_s=100.0)
        wait_until(lambda: server.read(lambda s: sorted((r.rank, r.step) for r in s.job("ns", "job").ranks.values())) == [(0, 3), (1, 3)],
                   timeout=15, interval=0.05, message="both ranks at step 3 in the ingest")
        jw = server.store.job("ns", "job")
        assert jw is not None
        assert server.read(lambda s: s.job("ns", "job").rank_beats) >= 2 * server.read(lambda s: s.job("ns", "job").batches) - 1
        assert list(jw.ranks[1].recent_compute(8))[-1] == pytest.approx(0.1)

        # A bit flips in rank 1's parameters at rest: its next check raises and reports it.
        p = next(iter(models[1].parameters()))
        flip_bit(p.data, 3, 30)
        ctxs[1].step = 4
        with pytest.raises(SDCDetected) as err:
            monitors[1].after_backward(ctxs[1], torch.tensor(2.0), torch.tensor(1.0))
        assert (err.value.rank, err.value.node) == (1, "node-a")
        wait_until(lambda: bool(server.read(lambda s: s.job("ns", "job").health_events())), timeout=15, interval=0.05,
                   message="a health event in the ingest")
        pods = {0: PodStatus(0, "Running", "node-a", 0.0)}
        d = server.read(lambda s: decide_health(s.job("ns", "job"), pods, HealthState(), HealthPolicy(), time.time()))
        [v] = [v for v in d.verdicts if v.kind is FaultKind.SDC]
        assert (v.rank, v.node, v.quarantine_node) == (1, "node-a", True)
        assert d.restart
    finally:
        for m in reversed(monitors):
            m.close()


def test_a_monitor_without_an_operator_url_never_fails_training(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAILYARD_HEARTBEAT_URL", "http://127.0.0.1:9/v1/heartbeats/ns/job")  # nothing listens
    monkeypatch.setenv("RAILYARD_HEARTBEAT_TOKEN", "x")
    model = build_model(1)
    ctx = _ctx(0, 0, model, "job-unreachable")
    m = build_health_monitor({"health": {"heartbeatIntervalSeconds": 0.1}}, ctx)
    try:
        m.preflight(ctx)
        for step in range(1, 4):
            ctx.step = step
            m.after_step(ctx, StepMetrics(step, 2.0, 1.0, 0.1, 0.05, 100.0, 1e-3))
            m.reporter.report_step(step, step_time_s=0.1, compute_s=0.05)
        assert m.aggregator is not None
        wait_until(lambda: m.aggregator is not None and m.aggregator.failures >= 1, timeout=15, interval=0.05,
                   message="a failed send counted")
        assert m.checks_passed()
    finally:
        m.close()
