"""Fixtures for the end-to-end system tests: ONE local cluster and ONE operator per module, the
REAL trainer (``railyard-train``) in every pod, faults injected through ``spec.trainer.faults``
or node annotations (``local.railyard.dev/fail``, ``local.railyard.dev/slow-factor``).

The cluster here is module-scoped and larger than the session one of tests/conftest.py (it has
room for several 2-node gangs in parallel, their hot spares, and nodes that get quarantined or
failed), so the tests of this folder never disturb the nodes of other folders. Like the session
one it joins the API server ``RAILYARD_TEST_KUBECONFIG`` names, if any (tests/clusters.py): the
tests then read only the API and what the node agent writes here, and label only their own nodes.
"""

from __future__ import annotations

import copy
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.clusters import running_local_cluster
from tests.operator.conftest import ROOT, Api, OperatorProcess, _apply_crd
from tests.waiting import wait_until

from railyard_local import podlogs

SYSTEM_NS = "railyard-system-e2e"
NODES = 16

__all__ = ["BASE", "SYSTEM_NS", "Api", "OperatorProcess", "base_spec", "cluster_nodes", "pod_events", "wait_status"]


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # lease every 1 s: a failed node is NotReady within a couple of seconds. Nodes of their own
    # (names and addresses): on a given API server they sit beside the session's and the server's
    with running_local_cluster(tmp_path_factory.mktemp("railyard-system"), nodes=NODES, gpus_per_node=2,
                               topology="spine=1,leaf=2", lease_interval=1.0, node_prefix="sys-",
                               node_ip_offset=40) as cluster:
        yield cluster


def cluster_nodes(local_cluster: Any) -> list[str]:
    """This cluster's own nodes, by name (a given API server has others: never label those)."""
    return sorted(spec.name for spec in local_cluster.node_specs)


@pytest.fixture(scope="module")
def api(local_cluster: Any) -> Api:
    import asyncio

    a = Api(Path(local_cluster.kubeconfig))
    crd = yaml.safe_load((ROOT / "crds" / "trainingjob.yaml").read_text())
    asyncio.run(_apply_crd(a.kubeconfig, crd))
    wait_until(lambda: a.custom.list_namespaced_custom_object("railyard.dev", "v1alpha1", "default", "trainingjobs") is not None,
               timeout=30,
               message="the TrainingJob CRD to serve",
               retry_on=(Exception,))
    a.ensure_namespace(SYSTEM_NS)
    return a


@pytest.fixture(scope="module")
def operator(api: Api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(api.kubeconfig, log, [SYSTEM_NS])
    try:
        yield op
    finally:
        op.stop()


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:4]}"


BASE: dict[str, Any] = {
    "nodes": 2,
    "procsPerNode": 1,
    "trainer": {
        "preset": "tiny", "steps": 60, "batchSize": 8, "seqLen": 64, "logEverySteps": 1,
        "collectiveTimeoutSeconds": 60, "watchdogSeconds": 40,
    },
    "checkpoint": {
        "memory": {"intervalSteps": 5, "keep": 2},
        "local": {"enabled": False},
        "shared": {"intervalSteps": 1000, "keep": 1},
    },
    "health": {
        "heartbeatIntervalSeconds": 0.5,
        "heartbeatTimeoutSeconds": 20,
        "hangTimeoutSeconds": 10,
        "straggler": {"windowSteps": 10},
    },
    "gang": {"scheduleTimeoutSeconds": 180},
    "restartPolicy": {
        "application": {"limit": 2, "backoffSeconds": 0},
        "infrastructure": {"limit": 3, "backoffSeconds": 0},
        "sdc": {"limit": 2, "backoffSeconds": 0},
        "straggler": {"limit": 2, "backoffSeconds": 0},
    },
}


def base_spec(**overrides: Any) -> dict[str, Any]:
    """A 2-node x 1-rank tiny-preset job of the real trainer; ``overrides`` merge one level deep."""
    spec = copy.deepcopy(BASE)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key].update(value)
        else:
            spec[key] = value
    # the default host paths: memory /dev/shm/railyard is per node, shared /mnt/railyard-shared
    # is one folder for every node (the local cluster's shared host path), both under the
    # cluster's state dir and then <namespace>/<job>
    return spec


def wait_status(api: Api, name: str, what: str, pred: Callable[[dict[str, Any]], Any], timeout: float,
                op: OperatorProcess | None = None) -> Any:
    """Poll the job's status until ``pred(status)`` is truthy; on timeout show status + logs."""
    try:
        return wait_until(lambda: pred(api.status(SYSTEM_NS, name)), timeout=timeout, message=what, interval=0.2, retry_on=(Exception,))
    except AssertionError as exc:
        extra = json.dumps(api.status(SYSTEM_NS, name), indent=1)[:3000]
        if op is not None:
            extra += "\n--- operator log ---\n" + op.log_tail(40)
        raise AssertionError(f"{exc}\n--- status ---\n{extra}") from None


def pod_events(local_cluster: Any, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The JSON lines of a pod's containers, from the node agent's log files
    (:func:`railyard_local.podlogs.pod_events`)."""
    return podlogs.pod_events(Path(local_cluster.log_dir), namespace, pod)


def refused_heartbeats(local_cluster: Any, pod: str, *, over: tuple[int, ...] = ()) -> list[str]:
    """The pod's log lines that say the operator refused a heartbeat or a POST failed (the
    aggregator logs the first failure of every minute with its HTTP status, and a 409, which says
    its attempt is over, once), but for the 409s of the attempts in ``over``: a restart in place
    may overtake the last post of the attempt it ends."""
    lines = podlogs.pod_log_lines(Path(local_cluster.log_dir), SYSTEM_NS, pod)
    expected = tuple(f"attempt {a} is over" for a in over)
    return [ln for ln in lines if "heartbeat POST" in ln and ("failed" in ln or "refused" in ln)
            and not any(e in ln for e in expected)]


def now() -> float:
    return time.time()


os.environ.setdefault("RAILYARD_KILL_GRACE_S", "3")
