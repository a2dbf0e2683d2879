"""The node agent ends a deleted pod as a kubelet does: when another finalizer holds the pod (a
controller's, such as Kueue's ``kueue.x-k8s.io/managed``), the terminal phase is in its status
before the agent's final delete, so the pod is Failed or Succeeded while Terminating, not
Pending or Running; the finalizer's owner sees the pod end and releases it (issue 48)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from kubernetes import client as k8s
from tests.waiting import wait_until

from railyard_local.agent import SIMULATE_ANNOTATION

from .builders import make_pod
from .conftest import wait_phase

HOLD = "example.com/hold"


def _held(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["finalizers"] = [HOLD]
    return pod


def _terminal_while_terminating(core: k8s.CoreV1Api, ns: str, name: str) -> Any:
    def check() -> Any:
        pod = core.read_namespaced_pod(name, ns)
        done = pod.status.phase in ("Failed", "Succeeded") and pod.metadata.deletion_timestamp is not None
        return pod if done else None

    return wait_until(check, timeout=60.0, message=f"pod {ns}/{name} terminal while Terminating")


def _release(core: k8s.CoreV1Api, ns: str, name: str) -> None:
    core.patch_namespaced_pod(name, ns, {"metadata": {"finalizers": None}})

    def gone() -> bool:
        try:
            core.read_namespaced_pod(name, ns)
        except k8s.ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, timeout=60.0, message=f"pod {ns}/{name} gone once released")


@pytest.mark.cluster
def test_a_running_pod_held_by_a_finalizer_is_failed_before_the_final_delete(
    core: k8s.CoreV1Api, namespace: str, node_names: list[str]
) -> None:
    pod = make_pod("runs").command(sys.executable, "-c", "import time; time.sleep(600)").on_node(node_names[0]).obj()
    pod["spec"]["restartPolicy"] = "Always"
    core.create_namespaced_pod(namespace, _held(pod))
    wait_phase(core, namespace, "runs", ("Running",))
    core.delete_namespaced_pod("runs", namespace, grace_period_seconds=5)
    ended = _terminal_while_terminating(core, namespace, "runs")
    assert ended.status.phase == "Failed", "a process stopped by SIGTERM exits non-zero"
    (state,) = [c.state.terminated for c in ended.status.container_statuses]
    assert state is not None and state.exit_code == 143 and state.reason == "Error"
    _release(core, namespace, "runs")


@pytest.mark.cluster
def test_a_pod_that_never_started_is_failed_not_left_pending(core: k8s.CoreV1Api, namespace: str, node_names: list[str]) -> None:
    pod = make_pod("waits").on_node(node_names[1]).obj()
    # a ConfigMap that does not exist: the agent waits for it, the pod stays Pending
    pod["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "not-there"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/cfg"}]
    core.create_namespaced_pod(namespace, _held(pod))
    assert core.read_namespaced_pod("waits", namespace).status.phase == "Pending"
    core.delete_namespaced_pod("waits", namespace, grace_period_seconds=5)
    ended = _terminal_while_terminating(core, namespace, "waits")
    assert ended.status.phase == "Failed"
    (state,) = [c.state.terminated for c in ended.status.container_statuses]
    assert state is not None and state.reason == "ContainerStatusUnknown" and state.exit_code == 137
    _release(core, namespace, "waits")


@pytest.mark.cluster
def test_a_simulated_pod_held_by_a_finalizer_ends_too(core: k8s.CoreV1Api, namespace: str, node_names: list[str]) -> None:
    pod = make_pod("sim").on_node(node_names[2]).obj()
    pod["spec"]["restartPolicy"] = "Always"
    pod["metadata"]["annotations"] = {SIMULATE_ANNOTATION: "true"}
    core.create_namespaced_pod(namespace, _held(pod))
    wait_phase(core, namespace, "sim", ("Running",))
    core.delete_namespaced_pod("sim", namespace, grace_period_seconds=5)
    assert _terminal_while_terminating(core, namespace, "sim").status.phase == "Failed"
    _release(core, namespace, "sim")


@pytest.mark.cluster
def test_without_a_finalizer_the_pod_is_simply_gone(core: k8s.CoreV1Api, namespace: str, node_names: list[str]) -> None:
    pod = make_pod("free").command(sys.executable, "-c", "import time; time.sleep(600)").on_node(node_names[0]).obj()
    core.create_namespaced_pod(namespace, pod)
    wait_phase(core, namespace, "free", ("Running",))
    core.delete_namespaced_pod("free", namespace, grace_period_seconds=5)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("free", namespace)
        except k8s.ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, timeout=60.0, message="the pod gone after its processes stopped")
