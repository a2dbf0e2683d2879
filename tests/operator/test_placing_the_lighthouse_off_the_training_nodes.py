"""faultTolerance ReplicaGroups: where the Lighthouse pod goes (logic/manifests/lighthouse.py).

Its own nodeSelector and tolerations replace the job's when the spec gives them; whatever they
select, it prefers nodes without the job's training pods and without GPUs, never requires it
(a cluster of GPU nodes only must still run it), and asks for a little CPU and no GPU. The
groups' torchft Managers retry a quorum the Lighthouse does not answer long enough for the
operator to recreate it (protocol/trainerconfig.py, lighthouse_quorum_retries)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests import (
    JOB_LABEL,
    LIGHTHOUSE_LABEL,
    build_lighthouse_pod,
    build_trainer_config,
)
from railyard.protocol.trainerconfig import (
    LIGHTHOUSE_QUORUM_RETRY_INTERVAL_S,
    lighthouse_quorum_retries,
)

OWNER = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "name": "llm", "uid": "u-1", "controller": True}
JOB_SELECTOR = {"pool": "h100"}
JOB_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def _lighthouse(lighthouse: dict[str, Any] | None) -> dict[str, Any]:
    spec = TrainingJobSpec.model_validate({
        "nodes": 4, "procsPerNode": 2, "gpusPerPod": 2, "nodeSelector": JOB_SELECTOR, "tolerations": JOB_TOLERATIONS,
        "parallelism": {"dataReplicas": 2},
        "faultTolerance": {"mode": "ReplicaGroups", **({"lighthouse": lighthouse} if lighthouse is not None else {})},
    })
    return build_lighthouse_pod(spec, job="llm", namespace="ml", owner=OWNER)["spec"]


ROWS = [
    # (faultTolerance.lighthouse, nodeSelector, tolerations)
    pytest.param(None, JOB_SELECTOR, JOB_TOLERATIONS, id="unset: where the job may run"),
    pytest.param({"nodeSelector": {"pool": "cpu"}}, {"pool": "cpu"}, JOB_TOLERATIONS, id="its own selector"),
    pytest.param({"nodeSelector": {}}, None, JOB_TOLERATIONS, id="an empty selector: any node"),
    pytest.param({"tolerations": [{"key": "infra", "operator": "Exists"}]}, JOB_SELECTOR, [{"key": "infra", "operator": "Exists"}],
                 id="its own tolerations"),
    pytest.param({"nodeSelector": {"pool": "cpu"}, "tolerations": []}, {"pool": "cpu"}, None, id="on untainted CPU nodes"),
]


@pytest.mark.parametrize(("lighthouse", "selector", "tolerations"), ROWS)
def test_the_lighthouse_has_its_own_node_selector_and_tolerations(lighthouse: dict[str, Any] | None,
                                                                   selector: dict[str, str] | None,
                                                                   tolerations: list[dict[str, Any]] | None) -> None:
    s = _lighthouse(lighthouse)
    assert s.get("nodeSelector") == selector
    assert s.get("tolerations") == tolerations


@pytest.mark.parametrize("lighthouse", [None, {"nodeSelector": {"pool": "cpu"}}])
def test_the_lighthouse_prefers_nodes_off_the_training_pods_and_without_gpus(lighthouse: dict[str, Any] | None) -> None:
    affinity = _lighthouse(lighthouse)["affinity"]
    assert set(affinity) == {"podAntiAffinity", "nodeAffinity"}
    for kind in affinity.values():
        assert set(kind) == {"preferredDuringSchedulingIgnoredDuringExecution"}, "a preference only: GPU-only clusters run it"
    (away,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = away["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    expressions = {e["key"]: e for e in term["labelSelector"]["matchExpressions"]}
    assert expressions[JOB_LABEL] == {"key": JOB_LABEL, "operator": "In", "values": ["llm"]}
    assert expressions[LIGHTHOUSE_LABEL]["operator"] == "DoesNotExist", "the job's training pods, not itself"
    (gpus,) = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert gpus["preference"]["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"}]
    assert away["weight"] > gpus["weight"], "sharing a training node costs a group and the quorum at once"


def test_the_lighthouse_asks_for_a_little_cpu_and_no_gpu() -> None:
    resources = _lighthouse(None)["containers"][0]["resources"]
    assert set(resources["requests"]) == {"cpu", "memory"}
    assert not any("gpu" in k for part in resources.values() for k in part)


def test_the_lighthouse_placement_stays_out_of_the_trainers_config() -> None:
    spec = TrainingJobSpec.model_validate({
        "nodes": 2, "procsPerNode": 1, "gpusPerPod": 0, "parallelism": {"dataReplicas": 2},
        "faultTolerance": {"mode": "ReplicaGroups", "lighthouse": {"nodeSelector": {"pool": "cpu"},
                                                                  "tolerations": [{"key": "a", "operator": "Exists"}]}},
    })
    config = json.loads(json.dumps(build_trainer_config(spec, job="llm", namespace="ml", attempt=0)))
    assert config["faultTolerance"] == {"mode": "ReplicaGroups", "minReplicas": 1, "healNetwork": {}}


@pytest.mark.parametrize(("quorum_timeout_s", "retries"), [(120.0, 119), (30.0, 29), (2.5, 2), (1.0, 1), (0.2, 1)])
def test_the_groups_retry_the_quorum_about_once_a_second_for_the_whole_quorum_timeout(quorum_timeout_s: float,
                                                                                       retries: int) -> None:
    assert lighthouse_quorum_retries(quorum_timeout_s) == retries
    # torchft 0.2.0 waits quorum_timeout / (retries + 1) between tries: never longer than the interval
    assert quorum_timeout_s / (retries + 1) <= LIGHTHOUSE_QUORUM_RETRY_INTERVAL_S
