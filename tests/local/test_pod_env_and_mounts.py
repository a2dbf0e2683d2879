"""How a pod spec becomes a process: env (valueFrom, downward API, expansion), mounts, names."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from railyard_local.podenv import (
    ContainerConfigError,
    PodContext,
    build_command,
    build_env,
    build_mounts,
    dns_names,
    expand,
    referenced_objects,
    rewrite_paths,
)

from .builders import make_pod


def ctx_for(pod: dict[str, Any], **kw: Any) -> PodContext:
    cm = {"data": {"mode": "fast", "level": "3"}}
    secret = {"data": {"token": base64.b64encode(b"s3cret").decode()}}
    return PodContext(pod=pod, pod_ip="127.0.0.11", host_ip="127.0.0.11", node_allocatable={"cpu": "16", "memory": "64Gi"},
                      configmaps=kw.get("configmaps", {"cfg": cm}), secrets=kw.get("secrets", {"sec": secret}))


def test_env_sources_in_kubernetes_order() -> None:
    pod = make_pod("trainer-0", "team").on_node("node-1").env(
        {"name": "A", "value": "1"},
        {"name": "B", "value": "$(A)-$(MISSING)-$$(A)"},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
        {"name": "GONE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "nope", "optional": True}}},
        {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Gi"}}},
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
    ).obj()
    pod["metadata"]["labels"]["role"] = "worker"
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "250m"}}
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}]
    env = build_env(ctx_for(pod), pod["spec"]["containers"][0])
    assert env["B"] == "1-$(MISSING)-$(A)"
    assert (env["POD"], env["NS"], env["NODE"], env["IP"], env["HOST"]) == ("trainer-0", "team", "node-1", "127.0.0.11", "127.0.0.11")
    assert env["ROLE"] == "worker"
    assert (env["MODE"], env["TOKEN"]) == ("fast", "s3cret")
    assert "GONE" not in env
    assert env["MEM"] == "64"  # no limit: node allocatable
    assert env["CPU"] == "250"
    assert env["CFG_level"] == "3"


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}, "configmap 'absent' not found"),
        ({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "absent"}}}, "key 'absent' not found"),
        ({"name": "X", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}, "secret 'absent' not found"),
        ({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}, "fieldPath"),
    ],
)
def test_missing_references_fail_the_container_with_the_field(item: dict[str, Any], fragment: str) -> None:
    pod = make_pod().env(item).obj()
    with pytest.raises(ContainerConfigError, match=fragment):
        build_env(ctx_for(pod), pod["spec"]["containers"][0])


def test_referenced_objects_are_collected_from_env_and_volumes() -> None:
    pod = make_pod().env({"name": "X", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "k"}}}).obj()
    pod["spec"]["volumes"] = [{"name": "v", "configMap": {"name": "c1"}}, {"name": "w", "secret": {"secretName": "s2"}}]
    assert referenced_objects(pod) == ({"c1"}, {"s1", "s2"})


def test_mount_paths_are_rewritten_as_whole_path_prefixes() -> None:
    container = {"volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}, {"name": "ckpt", "mountPath": "/ckpt/deep", "subPath": "d"},
                                  {"name": "shm", "mountPath": "/dev/shm"}]}
    mounts = build_mounts(container, {"ckpt": "/s/n0/p/ckpt", "shm": "/s/n0/hostpath/dev/shm"})
    assert mounts["/ckpt/deep"] == "/s/n0/p/ckpt/d"
    assert rewrite_paths("--dir=/ckpt/run1", mounts) == "--dir=/s/n0/p/ckpt/run1"
    assert rewrite_paths("/ckpt/deep/x /ckpt", mounts) == "/s/n0/p/ckpt/d/x /s/n0/p/ckpt"
    assert rewrite_paths("/ckpts x/ckpt /dev/shm/a", mounts) == "/ckpts x/ckpt /s/n0/hostpath/dev/shm/a"
    env = {"OUT": "/ckpt/out"}
    argv = build_command({"command": ["sh", "-c"], "args": ["ls $(OUT) /ckpt"]}, env, mounts)
    assert argv == ["sh", "-c", "ls /s/n0/p/ckpt/out /s/n0/p/ckpt"]
    with pytest.raises(ContainerConfigError, match="no volume"):
        build_mounts({"volumeMounts": [{"name": "x", "mountPath": "/x"}]}, {})


def test_expand_leaves_unknown_and_unterminated_references() -> None:
    assert expand("$(A)$(B)$(", {"A": "a"}) == "a$(B)$("


def test_pod_dns_names_follow_hostname_and_subdomain() -> None:
    pod = make_pod("job-0", "ml").obj()
    assert dns_names(pod) == []
    pod["spec"].update({"hostname": "job-0", "subdomain": "job"})
    assert dns_names(pod) == ["job-0.job.ml.svc.cluster.local", "job-0.job.ml.svc", "job-0.job.ml", "job-0.job"]


def test_existing_host_paths_outside_the_mount_are_kept() -> None:
    host = {"/work/venv/bin/python"}
    real = {"/s/work/data"}

    def exists(p: str) -> bool:
        return p in host or p in real

    mounts = {"/work": "/s/work"}
    assert rewrite_paths("/work/venv/bin/python /work/data /work/new", mounts, exists) == "/work/venv/bin/python /s/work/data /s/work/new"
