"""A refusal by the API server itself, on the local cluster (or RAILYARD_TEST_KUBECONFIG's API
server): one every conformant kube-apiserver makes, triggered from the TrainingJob, never by
changing the server. A permanent one fails the job with the server's message and an Event.

Which refusal waits and which fails, and what the job says, is decided by a table and tested
in-process for every kind (tests/operator/test_refusals_of_gang_objects.py); this file keeps one
real refusal so the path from the server's answer to the job's status is exercised for real."""

from __future__ import annotations

import pytest
from tests.operator.conftest import (
    MAIN_NS,
    Api,
    OperatorProcess,
    Workload,
    base_spec,
    on_exit_dump,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster
NS = MAIN_NS


def _phase(api: Api, ns: str, name: str) -> str:
    return str(api.status(ns, name).get("phase", ""))


def _no_failed_reconciles(operator: OperatorProcess) -> None:
    """A refusal is a decision, not a reconcile that failed and is retried with a traceback."""
    errors = [line for line in operator.metrics_text().splitlines() if line.startswith("railyard_reconcile_errors_total")]
    assert not any("ApiError" in e or "GangRefused" in e for e in errors), errors


def test_a_service_the_api_server_refuses_fails_the_job_with_its_message(api: Api, operator: OperatorProcess, workload: Workload, job_name: str) -> None:
    # A dotted name is a valid TrainingJob name, but not a Service name (a DNS label): the API
    # server refuses the gang's Service with 422.
    name = f"v1.{job_name}"[:50]
    api.create_job(NS, name, base_spec(workload, nodes=2))
    try:
        cond = wait_until(lambda: (c := api.condition(NS, name, "Failed")) and c["status"] == "True" and c, timeout=90, message="Failed", retry_on=(Exception,))
        assert cond["reason"] == "ObjectInvalid", cond
        assert f"Service {name}" in cond["message"] and "(422 Invalid)" in cond["message"] and "is invalid" in cond["message"], cond
        assert _phase(api, NS, name) == "Failed" and not api.pods(NS, name), "no pod of a refused gang"
        event = wait_until(lambda: next((e for e in api.events(NS, name) if e.reason == "ObjectInvalid"), None), timeout=30, message="the ObjectInvalid Event", retry_on=(Exception,))
        assert event.type == "Warning" and "is invalid" in event.message
        _no_failed_reconciles(operator)
    except AssertionError:
        print(on_exit_dump(api, NS, name, operator))
        raise
    finally:
        api.delete_job(NS, name)
