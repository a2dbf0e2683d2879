"""Crash safety: an operator killed mid-creation, or while a failure happens, resumes from the
cluster without duplicating pods or losing restart counts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.clusters import own_namespace
from tests.operator.builders import make_node
from tests.operator.conftest import Api, OperatorProcess, Workload, base_spec
from tests.waiting import wait_until

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests import (
    build_configmap,
    build_gang_pods,
    build_trainer_config,
    owner_reference,
)

pytestmark = pytest.mark.cluster
NS = own_namespace("railyard-optest-crash")


async def _create(kubeconfig: Path, path: str, obj: dict[str, Any]) -> None:
    from railyard.k8s.client import Kube

    kube = Kube.from_config(str(kubeconfig))
    try:
        await kube.create(path, obj)
    finally:
        await kube.close()


def _pods(api: Api, job: str) -> list[Any]:
    return api.pods(NS, job)


def test_killed_mid_creation_then_restarted_creates_no_duplicates(
    api: Api, workload: Workload, job_name: str, tmp_path: Path
) -> None:
    from railyard.logic.placement import build_placement_input, plan_placement

    api.ensure_namespace(NS)
    spec_dict = base_spec(workload, nodes=2)
    created = api.create_job(NS, job_name, spec_dict)
    # what an operator killed between the first pod and the second would have left behind
    from railyard.api.trainingjob import TrainingJob

    job = TrainingJob.model_validate({"metadata": {"name": job_name, "namespace": NS}, "spec": spec_dict})
    spec: TrainingJobSpec = job.spec
    node_dicts = [make_node(n.metadata.name, labels=api.node_selector) for n in api.own_nodes()]
    placed = plan_placement(build_placement_input(job, nodes=node_dicts))
    owner = owner_reference(created)
    from railyard.logic.manifests import with_addresses

    cm = build_configmap(job_name, NS, owner, attempt=0, rank_table=with_addresses(placed.rank_table, NS),  # type: ignore[union-attr]
                         config=build_trainer_config(spec, job=job_name, namespace=NS, attempt=0))
    pods = build_gang_pods(spec, job=job_name, namespace=NS, owner=owner, attempt=0, nodes=placed.nodes,  # type: ignore[union-attr]
                           heartbeat_url="http://127.0.0.1:1/v1/heartbeats")
    asyncio.run(_create(api.kubeconfig, f"/api/v1/namespaces/{NS}/configmaps", cm))
    asyncio.run(_create(api.kubeconfig, f"/api/v1/namespaces/{NS}/pods", pods[0]))
    first_uid = _pods(api, job_name)[0].metadata.uid

    op = OperatorProcess(api.kubeconfig, tmp_path / "op1.log", [NS])
    try:
        wait_until(lambda: (api.status(NS, job_name).get("phase") == "Running"), timeout=90, message="gang Running", retry_on=(Exception,))
        names = sorted(p.metadata.name for p in _pods(api, job_name))
        assert names == [f"{job_name}-a0-0", f"{job_name}-a0-1"], names
        assert next(p for p in _pods(api, job_name) if p.metadata.name.endswith("-0")).metadata.uid == first_uid, "resumed, not recreated"
        assert api.status(NS, job_name)["attempt"] == 0
        # killed hard while a rank fails: the new operator still counts the restart exactly once
        op.kill()
        workload.exit(1, attempt=0, pod=1)
        wait_until(lambda: any(p.status.phase == "Failed" for p in _pods(api, job_name)), timeout=90, message="pod 1 Failed", retry_on=(Exception,))
    finally:
        op.kill()
    op2 = OperatorProcess(api.kubeconfig, tmp_path / "op2.log", [NS])
    try:
        wait_until(lambda: (st := api.status(NS, job_name)).get("attempt") == 1 and st.get("phase") == "Running", timeout=90, message="attempt 1 Running", retry_on=(Exception,))
        op2.kill()
    finally:
        op2.kill()
    op3 = OperatorProcess(api.kubeconfig, tmp_path / "op3.log", [NS])
    try:
        # a third operator finds everything in order and changes nothing
        wait_until(lambda: api.status(NS, job_name).get("phase") == "Running", timeout=90, message="phase still Running", retry_on=(Exception,))
        st = api.status(NS, job_name)
        assert st["attempt"] == 1 and st["restarts"]["application"] == 1 and st["restarts"]["total"] == 1
        pods_now = _pods(api, job_name)
        assert sorted(p.metadata.name for p in pods_now) == [f"{job_name}-a1-0", f"{job_name}-a1-1"]
    finally:
        api.delete_job(NS, job_name)
        op3.stop()
