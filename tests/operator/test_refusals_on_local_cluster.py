"""The API server refusing the gang's own objects, on the local cluster (or RAILYARD_TEST_KUBECONFIG's
API server): each refusal is one every conformant kube-apiserver makes, triggered from the
TrainingJob or its namespace, never by changing the server. A permanent one fails the job with the
server's message and an Event; one that can pass waits, says why, and creates the gang once it can."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.operator.conftest import (
    MAIN_NS,
    Api,
    OperatorProcess,
    Workload,
    base_spec,
    on_exit_dump,
    wait_for,
)

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
        cond = wait_for("Failed", lambda: (c := api.condition(NS, name, "Failed")) and c["status"] == "True" and c, 90)
        assert cond["reason"] == "ObjectInvalid", cond
        assert f"Service {name}" in cond["message"] and "(422 Invalid)" in cond["message"] and "is invalid" in cond["message"], cond
        assert _phase(api, NS, name) == "Failed" and not api.pods(NS, name), "no pod of a refused gang"
        event = wait_for("the ObjectInvalid Event", lambda: next((e for e in api.events(NS, name) if e.reason == "ObjectInvalid"), None), 30)
        assert event.type == "Warning" and "is invalid" in event.message
        _no_failed_reconciles(operator)
    except AssertionError:
        print(on_exit_dump(api, NS, name, operator))
        raise
    finally:
        api.delete_job(NS, name)


@pytest.fixture
def priority_class(api: Api) -> Iterator[str]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    name = f"railyard-test-{uuid.uuid4().hex[:6]}"
    yield name
    try:
        client.SchedulingV1Api(api.client).delete_priority_class(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


def test_pods_refused_for_a_missing_priority_class_wait_and_start_once_it_exists(
    api: Api, operator: OperatorProcess, workload: Workload, job_name: str, priority_class: str
) -> None:
    from kubernetes import client

    api.create_job(NS, job_name, base_spec(workload, nodes=2, gang={"scheduleTimeoutSeconds": 60, "priorityClassName": priority_class}))
    try:
        cond = wait_for("Placed=False PriorityClassNotFound", lambda: (c := api.condition(NS, job_name, "Placed"))
                        and c["reason"] == "PriorityClassNotFound" and c, 90)
        assert cond["status"] == "False" and f"no PriorityClass with name {priority_class} was found" in cond["message"], cond
        assert "the gang's pods (403 Forbidden)" in cond["message"] and "trying again in 10s" in cond["message"]
        assert _phase(api, NS, job_name) == "Placing"
        event = wait_for("the PriorityClassNotFound Event", lambda: next(
            (e for e in api.events(NS, job_name) if e.reason == "PriorityClassNotFound"), None), 30)
        assert event.type == "Warning" and priority_class in event.message
        wait_for("no half gang while it waits", lambda: not api.pods(NS, job_name), 30)
        _no_failed_reconciles(operator)

        client.SchedulingV1Api(api.client).create_priority_class(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": priority_class}, "value": 1000})
        wait_for("Running once the PriorityClass exists", lambda: _phase(api, NS, job_name) == "Running", 90)
        pods = api.pods(NS, job_name)
        assert len(pods) == 2 and all(p.spec.priority_class_name == priority_class and p.spec.priority == 1000 for p in pods)
        assert api.status(NS, job_name)["attempt"] == 0, "a refusal is no restart"
    except AssertionError:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        api.delete_job(NS, job_name)


def test_pods_refused_by_pod_security_fail_the_job(api: Api, workload: Workload, job_name: str, tmp_path: Path) -> None:
    # the gang's checkpoint tiers are hostPath volumes, which the baseline level forbids: the
    # PodSecurity admission of any API server refuses the pods with 403
    from kubernetes.client.rest import ApiException

    ns = f"railyard-pss-{uuid.uuid4().hex[:6]}"
    api.core.create_namespace({"metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    op = OperatorProcess(api.kubeconfig, tmp_path / "operator.log", [ns])
    try:
        api.create_job(ns, job_name, base_spec(workload, nodes=2))
        cond = wait_for("Failed", lambda: (c := api.condition(ns, job_name, "Failed")) and c["status"] == "True" and c, 90)
        assert cond["reason"] == "PodSecurityViolation", cond
        assert 'violates PodSecurity "baseline:latest"' in cond["message"] and "hostPath" in cond["message"], cond
        assert "(403 Forbidden)" in cond["message"] and "pod-security.kubernetes.io/enforce" in cond["message"], "says what to change"
        event = wait_for("the PodSecurityViolation Event", lambda: next(
            (e for e in api.events(ns, job_name) if e.reason == "PodSecurityViolation"), None), 30)
        assert event.type == "Warning" and "violates PodSecurity" in event.message
        assert not api.pods(ns, job_name), "no half gang"
        _no_failed_reconciles(op)
    except AssertionError:
        print(on_exit_dump(api, ns, job_name, op))
        raise
    finally:
        api.delete_job(ns, job_name)
        op.stop()
        try:
            api.core.delete_namespace(ns)
        except ApiException as exc:
            if exc.status != 404:
                raise
