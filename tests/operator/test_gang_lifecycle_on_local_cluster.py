"""The operator end to end on the local cluster (or RAILYARD_TEST_KUBECONFIG's API server): what
needs a real API server, scheduler and node agent: a gang created and succeeding, a node that
really fails (quarantine and its release), deletion of what the job owns, metrics and the
heartbeat endpoint over HTTP, checkpoint cleanup pods on the nodes.

The decisions themselves (restarts by class, permanent exits, unplaceable jobs, suspend/resume,
gang timeouts, invalid specs) are rows of the in-process tables: tests/operator/
test_reconcile_state_machine.py and test_lifecycle_decisions.py."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.operator.conftest import (
    MAIN_NS,
    Api,
    OperatorProcess,
    Workload,
    _apply_crd,
    base_spec,
    on_exit_dump,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster
NS = MAIN_NS


def _phase(api: Api, name: str) -> str:
    return str(api.status(NS, name).get("phase", ""))


def _running_pods(api: Api, name: str, attempt: int) -> list[Any]:
    return [
        p for p in api.pods(NS, name)
        if p.metadata.labels.get("railyard.dev/attempt") == str(attempt) and p.status.phase == "Running"
    ]


def test_gang_is_created_whole_gated_owned_and_succeeds(api: Api, operator: OperatorProcess, workload: Workload, job_name: str) -> None:
    api.create_job(NS, job_name, base_spec(workload, nodes=2))
    try:
        wait_until(lambda: _phase(api, job_name) == "Running", timeout=90, message="phase Running", retry_on=(Exception,))
        pods = api.pods(NS, job_name)
        assert sorted(p.metadata.name for p in pods) == [f"{job_name}-a0-0", f"{job_name}-a0-1"]
        assert len({p.spec.node_name for p in pods}) == 2, "one pod per node"
        for p in pods:
            assert not p.spec.scheduling_gates, "every gate lifted"
            owner = p.metadata.owner_references[0]
            assert owner.kind == "TrainingJob" and owner.controller is True
            assert p.spec.restart_policy == "Never" and p.spec.automount_service_account_token is False
            term = p.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[0]
            assert term.match_fields[0].values == [p.spec.node_name]
            sc = p.spec.containers[0].security_context
            assert sc.allow_privilege_escalation is False and sc.capabilities.drop == ["ALL"]
        started = wait_until(lambda: len(workload.started(0)) == 2 and workload.started(0), timeout=30, message="both pods to start", retry_on=(Exception,))
        env0 = started[0]["env"]
        assert env0["MASTER_ADDR"] == f"{job_name}-0.{job_name}.{NS}.svc"
        assert env0["RAILYARD_ATTEMPT"] == "0" and env0["NCCL_CROSS_NIC"] == "0"
        assert env0["RAILYARD_HEARTBEAT_TOKEN"] and env0["RAILYARD_HEARTBEAT_URL"].endswith(f"/v1/heartbeats/{NS}/{job_name}")
        with open(env0["RAILYARD_RANK_TABLE"]) as fh:
            table = json.load(fh)
        assert [p["node"] for p in sorted(table["pods"], key=lambda p: p["pod_index"])] == api.status(NS, job_name)["placement"]["nodes"]
        st = api.status(NS, job_name)
        conds = {c["type"]: c["status"] for c in st["conditions"]}
        assert conds["Placed"] == conds["GangReady"] == conds["Running"] == "True"
        assert st["timeToAllReadySeconds"] is not None and st["startTime"]
        assert api.core.read_namespaced_service(job_name, NS).spec.cluster_ip == "None"

        workload.exit(0)
        wait_until(lambda: _phase(api, job_name) == "Succeeded", timeout=90, message="phase Succeeded", retry_on=(Exception,))
        # the finished pods stay (spec.cleanup: Keep, for a day by default) for kubectl logs
        kept = wait_until(lambda: (ps := api.pods(NS, job_name)) and all(p.status.phase == "Succeeded" for p in ps) and ps, timeout=90, message="both pods Succeeded", retry_on=(Exception,))
        assert sorted(p.metadata.name for p in kept) == [f"{job_name}-a0-0", f"{job_name}-a0-1"]
        st = api.status(NS, job_name)
        assert st["completionTime"] and st["restarts"]["total"] == 0
        wanted = {"GangCreated", "AllPodsRunning", "AllRanksSucceeded"}
        wait_until(lambda: wanted <= {e.reason for e in api.events(NS, job_name)}, timeout=30, message=f"Events {sorted(wanted)}", retry_on=(Exception,))
    except AssertionError:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        api.delete_job(NS, job_name)


RESOURCE = ("resource.k8s.io", "v1")


@pytest.fixture
def gpus_by_claim(request: pytest.FixtureRequest, api: Api, local_cluster: Any) -> dict[str, Any]:
    """The spec fields that ask for the GPUs: nvidia.com/gpu (nothing to add), or Dynamic
    Resource Allocation with a ComputeDomain (spec.gpuClaim), on an embedded local cluster (its
    nodes publish ResourceSlices; it plays NVIDIA's driver for the ComputeDomain, whose minimal
    CRD is installed here)."""
    if request.param == "nvidia.com/gpu":
        return {}
    if local_cluster.mode != "embedded":
        pytest.skip("ComputeDomains need NVIDIA's DRA driver; the embedded API server plays it")
    from railyard_local.apiserver.dra import compute_domain_crd

    asyncio.run(_apply_crd(api.kubeconfig, compute_domain_crd()))
    wait_until(lambda: api.custom.list_namespaced_custom_object("resource.nvidia.com", "v1beta1", NS, "computedomains") is not None, timeout=30, message="the ComputeDomain CRD to serve", retry_on=(Exception,))
    return {"gpuClaim": {"deviceClassName": "gpu.nvidia.com", "computeDomain": True}}


def _claims_on_their_nodes(api: Api, pods: list[Any]) -> dict[str, list[str]]:
    """pod -> "<claim>@<node>" of each of its ResourceClaims' allocated devices."""
    out: dict[str, list[str]] = {}
    for p in pods:
        for s in p.status.resource_claim_statuses or []:
            claim = api.custom.get_namespaced_custom_object(*RESOURCE, NS, "resourceclaims", s.resource_claim_name)
            results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
            out.setdefault(p.metadata.name, []).extend(f"{s.name}@{r['pool']}" for r in results)
    return out


@pytest.mark.parametrize("gpus_by_claim", ["nvidia.com/gpu", "dra"], indirect=True)
def test_failed_node_moves_only_its_ranks_to_a_spare_and_is_quarantined(api: Api, operator: OperatorProcess, workload: Workload, job_name: str,
                                                                       gpus_by_claim: dict[str, Any]) -> None:
    from railyard_local.nodes import FAIL_ANNOTATION

    api.create_job(NS, job_name, base_spec(workload, nodes=2, gang={"scheduleTimeoutSeconds": 60, "hotSpares": 1}, **gpus_by_claim))
    victim = ""
    try:
        wait_until(lambda: len(_running_pods(api, job_name, 0)) == 2, timeout=90, message="running", retry_on=(Exception,))
        placement = wait_until(lambda: (pl := api.status(NS, job_name)["placement"]) and pl.get("spares") and pl, timeout=60, message="the spare held", retry_on=(Exception,))
        before, spares = placement["nodes"], placement["spares"]
        victim = before[1]
        api.annotate_node(victim, {FAIL_ANNOTATION: "true"})
        wait_until(lambda: len(_running_pods(api, job_name, 1)) == 2, timeout=60, message="attempt 1 running", retry_on=(Exception,))
        st = api.status(NS, job_name)
        after = st["placement"]["nodes"]
        assert after[0] == before[0], "the healthy node keeps its pod index and ranks"
        assert after[1] != victim and after[1] in spares, f"the replacement takes the spare: {before} -> {after}, spares {spares}"
        if gpus_by_claim:
            pods = _running_pods(api, job_name, 1)
            claims = {pod: sorted(c) for pod, c in _claims_on_their_nodes(api, pods).items()}
            assert claims == {p.metadata.name: sorted([f"gpus@{p.spec.node_name}", f"channel@{p.spec.node_name}"]) for p in pods}, claims
            domain = api.custom.get_namespaced_custom_object("resource.nvidia.com", "v1beta1", NS, "computedomains", f"{job_name}-nvlink-2")
            assert domain["spec"]["numNodes"] == 2 and domain["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
            assert all(not (c.resources.limits or {}).get("nvidia.com/gpu") for p in pods for c in p.spec.containers)
        assert st["restarts"]["infrastructure"] == 1 and st["restarts"]["application"] == 0
        assert [q["node"] for q in st["quarantinedNodes"]] == [victim]
        node = api.node(victim)
        assert node.metadata.labels.get("railyard.dev/quarantined") == "true"
        assert any(t.key == "railyard.dev/quarantined" and t.effect == "NoSchedule" for t in node.spec.taints or [])
        wait_until(lambda: any(e.reason == "NodeQuarantined" for e in api.events(NS, job_name)), timeout=30, message="the NodeQuarantined Event", retry_on=(Exception,))
        assert wait_until(lambda: _phase(api, job_name) == "Running", timeout=90, message="Running again", retry_on=(Exception,))
        # a person releases the node: the operator removes the label and the taint
        api.annotate_node(victim, {FAIL_ANNOTATION: None, "railyard.dev/release": "true"})
        wait_until(lambda: not any(t.key == "railyard.dev/quarantined" for t in api.node(victim).spec.taints or [])
                 and "railyard.dev/quarantined" not in (api.node(victim).metadata.labels or {}),
                   timeout=90,
                   message="release honoured",
                   retry_on=(Exception,))
        wait_until(lambda: api.status(NS, job_name)["quarantinedNodes"] == [], timeout=90, message="status forgets the released node", retry_on=(Exception,))
    except AssertionError:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        if victim:
            api.annotate_node(victim, {FAIL_ANNOTATION: None, "railyard.dev/release": "true"})
            wait_until(lambda: any(c.type == "Ready" and c.status == "True" for c in api.node(victim).status.conditions), timeout=90, message="node Ready", retry_on=(Exception,))
        api.delete_job(NS, job_name)


def test_deleting_the_job_removes_everything_it_owns(api: Api, operator: OperatorProcess, workload: Workload, job_name: str) -> None:
    api.create_job(NS, job_name, base_spec(workload, nodes=2))
    wait_until(lambda: _phase(api, job_name) == "Running", timeout=90, message="running", retry_on=(Exception,))
    api.delete_job(NS, job_name)

    def owned() -> list[str]:
        sel = f"railyard.dev/job={job_name}"
        names = [p.metadata.name for p in api.core.list_namespaced_pod(NS, label_selector=sel).items]
        names += [c.metadata.name for c in api.core.list_namespaced_config_map(NS, label_selector=sel).items]
        names += [s.metadata.name for s in api.core.list_namespaced_service(NS, label_selector=sel).items]
        names += [s.metadata.name for s in api.core.list_namespaced_secret(NS, label_selector=sel).items]
        return names

    wait_until(lambda: not owned(), timeout=90, message="nothing owned left", retry_on=(Exception,))


def test_metrics_are_served_and_count_restarts_by_class(api: Api, operator: OperatorProcess, workload: Workload, job_name: str) -> None:
    def restarts(cls: str) -> float:
        for fam in text_string_to_metric_families(operator.metrics_text()):
            if fam.name == "railyard_restarts":
                for s in fam.samples:
                    if s.name == "railyard_restarts_total" and s.labels.get("class") == cls:
                        return float(s.value)
        return 0.0

    before = restarts("Application")
    api.create_job(NS, job_name, base_spec(workload, nodes=2))
    try:
        wait_until(lambda: len(_running_pods(api, job_name, 0)) == 2, timeout=90, message="running", retry_on=(Exception,))
        workload.exit(3, attempt=0, pod=0)
        wait_until(lambda: api.status(NS, job_name).get("attempt") == 1 and _phase(api, job_name) == "Running", timeout=90, message="attempt 1 Running", retry_on=(Exception,))
        assert restarts("Application") == before + 1
        families = {f.name: f for f in text_string_to_metric_families(operator.metrics_text())}
        for name in ("railyard_jobs", "railyard_gang_ready_seconds", "railyard_failure_to_restarted_seconds",
                     "railyard_placement_decision_seconds", "railyard_quarantined_nodes", "railyard_reconcile_errors",
                     "railyard_spine_crossing_bytes_per_step"):
            assert name in families, name
        running = [s for s in families["railyard_jobs"].samples if s.labels.get("phase") == "Running"]
        assert running and running[0].value >= 1
        restarted = [s for s in families["railyard_failure_to_restarted_seconds"].samples if s.name.endswith("_count")]
        assert restarted and restarted[0].value >= 1
        # the heartbeat ingest is mounted on the same server and refuses a missing token
        req = urllib.request.Request(f"http://127.0.0.1:{operator.port}/v1/heartbeats/{NS}/{job_name}", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=5)
        assert err.value.code == 401
    except AssertionError:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        api.delete_job(NS, job_name)


def test_confirmed_sdc_heartbeat_restarts_the_gang_and_quarantines_the_node(api: Api, operator: OperatorProcess, workload: Workload, job_name: str) -> None:
    import base64
    import time

    api.create_job(NS, job_name, base_spec(workload, nodes=2))
    victim = ""
    try:
        wait_until(lambda: _phase(api, job_name) == "Running", timeout=90, message="Running", retry_on=(Exception,))
        victim = api.status(NS, job_name)["placement"]["nodes"][1]
        token = base64.b64decode(api.core.read_namespaced_secret(f"{job_name}-heartbeat", NS).data["token"]).decode()
        beat = {
            "job": job_name, "attempt": 0, "pod_index": 1, "node": victim, "sent_at": time.time(),
            "ranks": [{"rank": 1, "step": 7, "step_time_s": 0.1, "compute_s": 0.05,
                       "health": [{"kind": "replay", "ok": False, "step": 7, "confirmed": True, "suspect_rank": 1,
                                   "detail": "replay of step 7 differs"}]}],
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{operator.port}/v1/heartbeats/{NS}/{job_name}", data=json.dumps(beat).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"}, method="POST",
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 204
        wait_until(lambda: api.status(NS, job_name)["restarts"]["sdc"] == 1, timeout=90, message="SDC restart", retry_on=(Exception,))
        st = api.status(NS, job_name)
        assert [q["node"] for q in st["quarantinedNodes"]] == [victim]
        assert st["restarts"]["lastReason"].startswith("SDCVerdict")
        wait_until(lambda: len(_running_pods(api, job_name, 1)) == 2, timeout=90, message="attempt 1 Running", retry_on=(Exception,))
        assert victim not in api.status(NS, job_name)["placement"]["nodes"]
    except AssertionError:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        if victim:
            api.annotate_node(victim, {"railyard.dev/release": "true"})
            wait_until(lambda: "railyard.dev/quarantined" not in (api.node(victim).metadata.labels or {}), timeout=90, message="released", retry_on=(Exception,))
        api.delete_job(NS, job_name)


def test_cleanup_on_delete_removes_checkpoints_then_the_finalizer(api: Api, operator: OperatorProcess, workload: Workload, job_name: str) -> None:
    from pathlib import Path

    spec = base_spec(workload, nodes=2)
    spec["checkpoint"]["cleanupOnDelete"] = True
    api.create_job(NS, job_name, spec)
    try:
        wait_until(lambda: "railyard.dev/checkpoint-cleanup" in (api.job(NS, job_name)["metadata"].get("finalizers") or []), timeout=90, message="our finalizer", retry_on=(Exception,))
        started = wait_until(lambda: len(workload.started(0)) == 2 and workload.started(0), timeout=90, message="both pods started", retry_on=(Exception,))
        markers = [Path(s["env"][var]) / job_name / f"marker-{i}" for i, s in started.items()
                   for var in ("RAILYARD_CHECKPOINT_MEMORY_DIR", "RAILYARD_CHECKPOINT_SHARED_DIR")]
        assert all(m.exists() for m in markers), markers
        api.delete_job(NS, job_name)

        def gone() -> bool:
            from kubernetes.client.rest import ApiException

            try:
                api.job(NS, job_name)
            except ApiException as exc:
                return exc.status == 404
            return False

        wait_until(gone, timeout=60, message="job gone after cleanup", retry_on=(Exception,))
        assert not any(m.exists() for m in markers), [m for m in markers if m.exists()]
        assert not api.pods(NS, job_name), "gang and cleanup pods removed"
    except AssertionError:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        api.delete_job(NS, job_name)
