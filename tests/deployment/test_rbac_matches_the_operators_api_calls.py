"""The chart's ClusterRole holds exactly what the operator's code calls, no more, no less."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from railyard.k8s import rbac
from railyard.k8s.rbac import Permission, build_rules, rules_to_permissions, scan_source

from .chart import CHART, find, render_objects


def test_rules_file_is_what_the_generator_writes_now() -> None:
    current = (CHART / "rbac-rules.yaml").read_text()
    assert current == rbac.render_rules_yaml(build_rules(rbac.required_permissions())), (
        "helm/railyard/rbac-rules.yaml is stale: run `python -m railyard.k8s.rbac`"
    )


def test_rendered_cluster_role_equals_the_permissions_the_code_needs() -> None:
    role = find(render_objects({}), "ClusterRole")
    granted = rules_to_permissions(role["rules"])
    needed = rbac.required_permissions()
    assert granted - needed == set(), "granted but never used"
    assert needed - granted == set(), "used but not granted"


def test_scan_finds_the_calls_the_operator_is_known_to_make() -> None:
    """Spot checks against calls visible in railyard.k8s.gang and the kopf handlers."""
    found = rbac.scan_operator()
    for p in [
        Permission("", "pods", "create"),  # create_pods
        Permission("", "pods", "delete"),  # delete_pods
        Permission("", "pods", "patch"),  # lift_gates
        Permission("", "pods", "watch"),  # @kopf.index("pods")
        Permission("", "nodes", "patch"),  # quarantine_node
        Permission("", "events", "create"),  # create_event
        Permission("railyard.dev", "trainingjobs/status", "patch"),  # patch_job_status
        Permission("railyard.dev", "trainingjobs", "watch"),  # @kopf.on.event(GROUP, VERSION, PLURAL)
        Permission("railyard.dev", "trainingjobs/finalizers", "update"),  # blockOwnerDeletion
        Permission("scheduling.k8s.io", "workloads", "create"),  # create_podgroups (Kubernetes' gang scheduling)
        Permission("scheduling.k8s.io", "podgroups", "create"),
        Permission("scheduling.k8s.io", "workloads", "delete"),  # delete_podgroups
        Permission("scheduling.k8s.io", "podgroups", "delete"),
        Permission("scheduling.k8s.io", "podgroups", "get"),  # read_podgroup_condition: why a gang waits
    ]:
        assert p in found, p
    # nothing in the operator updates (PUT) or deletes nodes, or touches RBAC
    assert not {p for p in found if p.resource == "nodes" and p.verb in ("update", "delete")}
    assert not {p for p in found if p.group == "rbac.authorization.k8s.io"}
    # discovery (GET /apis/scheduling.k8s.io/v1alpha2) is no resource: every client may read it;
    # a PodGroup is read by name only (its condition), never listed or watched
    assert not {p for p in found if p.group == "scheduling.k8s.io" and p.verb not in ("create", "delete", "get")}
    assert not {p for p in found if p.group == "scheduling.k8s.io" and p.resource == "workloads" and p.verb == "get"}


def test_scanner_resolves_names_loops_dicts_and_subresources() -> None:
    src = textwrap.dedent('''
        GROUP = "example.dev"

        async def f(kube, ns, obj):
            plural = {"Pod": "pods", "Secret": "secrets"}[obj["kind"]]
            await kube.create(core_path(plural, ns), obj)
            for p in ("services", "configmaps"):
                await kube.list(core_path(p, ns))
            path = custom_path(GROUP, "v1", "widgets", ns, "w", "status")
            await kube.patch(path, {})
            await kube.request("PUT", core_path("nodes", None, "n1"), body={})
            await kube.delete(core_path("pods", ns))

        @kopf.on.update("example.dev", "v1", "gadgets")
        def g(**_): ...
    ''')
    got = scan_source(src, {"GROUP": "example.dev"})
    assert got == {
        Permission("", "pods", "create"), Permission("", "secrets", "create"),
        Permission("", "services", "list"), Permission("", "configmaps", "list"),
        Permission("example.dev", "widgets/status", "patch"),
        Permission("", "nodes", "update"),
        Permission("", "pods", "deletecollection"),
        Permission("example.dev", "gadgets", "list"), Permission("example.dev", "gadgets", "watch"),
        Permission("example.dev", "gadgets", "patch"),
    }


def test_scanner_refuses_paths_it_cannot_resolve() -> None:
    src = "async def f(kube, plural):\n    await kube.get(core_path(plural, 'ns', 'x'))\n"
    with pytest.raises(ValueError, match="cannot tell which resource"):
        scan_source(src, {})


def test_every_framework_rule_says_why() -> None:
    for rule in rbac.FRAMEWORK:
        assert rule.reason and rule.verbs


def test_rules_file_is_valid_yaml_rules() -> None:
    rules = yaml.safe_load((CHART / "rbac-rules.yaml").read_text())
    assert all(set(r) == {"apiGroups", "resources", "verbs"} for r in rules)
    assert "*" not in {v for r in rules for v in r["verbs"]}
