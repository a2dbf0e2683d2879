"""The Pod Security Standards as the embedded API server checks them (a pure function, no server):
each baseline and restricted control, the order and words kube-apiserver reports them in."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from railyard_local.apiserver.podsecurity import check_pod, describe, policy_of


def make(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    body["spec"].update(spec)
    return body


def restricted_ok() -> dict[str, Any]:
    """A pod that meets the restricted standard."""
    return make(securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                containers=[{"name": "c", "image": "i", "securityContext": {
                    "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}])


def with_container_sc(pod: dict[str, Any], **sc: Any) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"]["containers"][0]["securityContext"].update(sc)
    return out


def test_privileged_allows_everything() -> None:
    pod = make(hostNetwork=True, volumes=[{"name": "h", "hostPath": {"path": "/"}}],
               containers=[{"name": "c", "image": "i", "securityContext": {"privileged": True}}])
    assert check_pod("privileged", pod) == []


@pytest.mark.parametrize(("pod", "violation"), [
    (make(volumes=[{"name": "y", "hostPath": {"path": "/var"}}]), ("hostPath volumes", 'volume "y"')),
    (make(volumes=[{"name": "a", "hostPath": {"path": "/a"}}, {"name": "b", "hostPath": {"path": "/b"}}]),
     ("hostPath volumes", 'volumes "a", "b"')),
    (make(hostNetwork=True, hostPID=True), ("host namespaces", "hostNetwork=true, hostPID=true")),
    (make(containers=[{"name": "c", "image": "i", "securityContext": {"privileged": True}}]),
     ("privileged", 'container "c" must not set securityContext.privileged=true')),
    (make(containers=[{"name": "c", "image": "i", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]),
     ("non-default capabilities", 'container "c" must not include "NET_ADMIN" in securityContext.capabilities.add')),
    (make(containers=[{"name": "c", "image": "i", "ports": [{"containerPort": 80, "hostPort": 8080}]}]),
     ("hostPort", 'container "c" uses hostPort 8080')),
    (make(securityContext={"seccompProfile": {"type": "Unconfined"}}),
     ("seccompProfile", 'pod must not set securityContext.seccompProfile.type to "Unconfined"')),
    (make(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}), ("forbidden sysctls", "kernel.msgmax")),
])
def test_baseline_controls(pod: dict[str, Any], violation: tuple[str, str]) -> None:
    assert check_pod("baseline", pod) == [violation]


def test_baseline_allows_the_default_capabilities_and_a_plain_pod() -> None:
    assert check_pod("baseline", make()) == []
    pod = make(containers=[{"name": "c", "image": "i", "securityContext": {"capabilities": {"add": ["CHOWN", "KILL"]}}}])
    assert check_pod("baseline", pod) == []


def test_restricted_reports_a_plain_pod_in_upstream_order_and_words() -> None:
    got = check_pod("restricted", make())
    assert got == [
        ("allowPrivilegeEscalation != false", 'container "c" must set securityContext.allowPrivilegeEscalation=false'),
        ("unrestricted capabilities", 'container "c" must set securityContext.capabilities.drop=["ALL"]'),
        ("runAsNonRoot != true", 'pod or container "c" must set securityContext.runAsNonRoot=true'),
        ("seccompProfile", 'pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" '
                           'or "Localhost"'),
    ]
    assert describe("restricted", "latest", got[:1]) == (
        'PodSecurity "restricted:latest": allowPrivilegeEscalation != false '
        '(container "c" must set securityContext.allowPrivilegeEscalation=false)')


def test_restricted_accepts_a_compliant_pod_and_the_token_volume() -> None:
    pod = restricted_ok()
    pod["spec"]["volumes"] = [{"name": "kube-api-access-x", "projected": {"sources": []}},
                              {"name": "mem", "emptyDir": {"medium": "Memory"}}]
    assert check_pod("restricted", pod) == []


@pytest.mark.parametrize(("change", "reason"), [
    ({"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation != false"),
    ({"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}, "unrestricted capabilities"),
    ({"runAsNonRoot": False}, "runAsNonRoot != true"),
    ({"runAsUser": 0}, "runAsUser=0"),
    ({"seccompProfile": {"type": "Unconfined"}}, "seccompProfile"),
])
def test_restricted_controls(change: dict[str, Any], reason: str) -> None:
    got = check_pod("restricted", with_container_sc(restricted_ok(), **change))
    assert [r for r, _ in got] == [reason]


def test_restricted_volume_types_replace_the_hostpath_check() -> None:
    pod = restricted_ok()
    pod["spec"]["volumes"] = [{"name": "h", "hostPath": {"path": "/"}}]
    assert check_pod("restricted", pod) == [
        ("restricted volume types", 'volume "h" uses restricted volume type "hostPath"')]


def test_namespace_labels_give_the_policy() -> None:
    p = policy_of({"pod-security.kubernetes.io/enforce": "baseline",
                   "pod-security.kubernetes.io/enforce-version": "v1.36",
                   "pod-security.kubernetes.io/warn": "restricted"})
    assert p.enforce == ("baseline", "v1.36") and p.warn == ("restricted", "latest")
    assert p.audit == ("privileged", "latest")
    assert policy_of({"pod-security.kubernetes.io/enforce": "bogus"}).enforce[0] == "restricted"
    assert policy_of(None).enforce == ("privileged", "latest")
