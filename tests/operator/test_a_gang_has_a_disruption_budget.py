"""The gang's PodDisruptionBudget (logic/manifests/disruption.py): what it selects and how it
counts, as the real API server's record says it must (../shared/kube-golden/v1.36-disruption:
``maxUnavailable`` over pods without a scalable controller never allows anything; an integer
``minAvailable`` works), and that the creation path makes one per job, kept across attempts."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.builders import make_node
from tests.operator.fake_cluster import Harness, make_job

from railyard.logic.manifests import (
    LIGHTHOUSE_LABEL,
    POD_INDEX_LABEL,
    SPARE_LABEL,
    build_disruption_budget,
    disruption_budget_differs,
)

OWNER = {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "name": "j", "uid": "uid-j", "controller": True}


def selects(budget: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's verdict, as the API server evaluates matchLabels and Exists."""
    sel = budget["spec"]["selector"]
    if any(labels.get(k) != v for k, v in sel["matchLabels"].items()):
        return False
    return all(e["operator"] == "Exists" and e["key"] in labels for e in sel["matchExpressions"])


ROWS = [
    ("a training pod", {"railyard.dev/job": "j", POD_INDEX_LABEL: "0"}, True),
    ("a hot spare's placeholder", {"railyard.dev/job": "j", SPARE_LABEL: "true"}, False),
    ("the Lighthouse", {"railyard.dev/job": "j", LIGHTHOUSE_LABEL: "true"}, False),
    ("another job's training pod", {"railyard.dev/job": "k", POD_INDEX_LABEL: "0"}, False),
]


@pytest.mark.parametrize(("what", "labels", "covered"), ROWS, ids=[r[0] for r in ROWS])
def test_the_budget_covers_training_pods_only(what: str, labels: dict[str, str], covered: bool) -> None:
    assert selects(build_disruption_budget("j", "ns", OWNER, pods=4), labels) is covered, what


def test_the_budget_counts_with_an_integer_min_available() -> None:
    spec = build_disruption_budget("j", "ns", OWNER, pods=4)["spec"]
    # maxUnavailable or a percentage over pods without a /scale controller allows nothing ever
    assert spec["minAvailable"] == 4 and isinstance(spec["minAvailable"], int) and "maxUnavailable" not in spec


def test_a_budget_over_no_pod_is_refused_with_the_field() -> None:
    with pytest.raises(ValueError, match="pods=0"):
        build_disruption_budget("j", "ns", OWNER, pods=0)


def test_another_pod_count_replaces_the_budget() -> None:
    four = build_disruption_budget("j", "ns", OWNER, pods=4)
    assert not disruption_budget_differs(four, build_disruption_budget("j", "ns", OWNER, pods=4))
    assert disruption_budget_differs(four, build_disruption_budget("j", "ns", OWNER, pods=2))


async def test_the_gang_is_created_with_its_budget_owned_by_the_job() -> None:
    h = Harness([make_node(f"node-{i}", gpus=2) for i in range(4)], make_job(gang={"hotSpares": 1}))
    await h.cycle()
    budget = h.cluster.objects[("PodDisruptionBudget", "j")]
    assert budget["metadata"]["ownerReferences"][0]["uid"] == "uid-j"
    assert budget["spec"]["minAvailable"] == len(h.cluster.pods_of(0)) == 2
    writes = [w for v, w in h.cluster.calls if v == "create"]
    first_pod = next(i for i, w in enumerate(writes) if w.startswith("Pod/"))
    assert writes.index("PodDisruptionBudget/j") < first_pod, "the pods are covered from their creation on"
    # a full restart's next attempt keeps the one budget
    h.run_pods()
    await h.cycle(1.0)
    h.exit_pod(0, 1)
    await h.cycle(1.0)
    h.cluster.finish_deletions()
    for _ in range(4):
        await h.cycle(30.0)
    assert h.status.attempt >= 1 and h.cluster.pods_of(h.status.attempt)
    assert [w for v, w in h.cluster.calls if v == "create" and w.startswith("PodDisruptionBudget/")] == ["PodDisruptionBudget/j"]


def _ready(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    return pod


async def test_a_drain_waits_for_the_operator_as_the_real_servers_rules_say() -> None:
    """The gang's budget under the disruption rules of the embedded API server (those of a real
    v1.36 control plane, replayed against its recorded exchanges): a training pod's eviction is
    refused 429 with the DisruptionBudget cause; a placeholder goes at once; once the operator
    deleted the pod on the going node, the drain's eviction of it passes."""
    from railyard_local.apiserver.disruption import compute_pdb_status, decide_eviction
    from railyard_local.apiserver.errors import APIError

    h = Harness([make_node(f"node-{i}", gpus=2) for i in range(3)], make_job(gang={"hotSpares": 1}))
    await h.cycle()
    budget = h.cluster.objects[("PodDisruptionBudget", "j")]
    training = [_ready(p) for p in h.cluster.pods_of(0)]
    spares = [_ready(p) for p in h.cluster.pods_of(spare=True)]
    assert training and spares
    covered = [p for p in training + spares if selects(budget, p["metadata"]["labels"])]
    computed = compute_pdb_status(budget, covered, lambda pod: None, now=0.0)  # a TrainingJob has no /scale
    assert not computed.unmanaged and computed.status["expectedPods"] == 2 and computed.status["disruptionsAllowed"] == 0
    budget = {**budget, "metadata": {**budget["metadata"], "generation": 1}, "status": computed.status}
    with pytest.raises(APIError) as refused:
        decide_eviction(training[1], [budget], now=0.0, dry_run=False)
    assert refused.value.code == 429
    assert refused.value.details["causes"][0]["reason"] == "DisruptionBudget"
    assert decide_eviction(spares[0], [budget], now=0.0, dry_run=False).budget is None, "a placeholder may go"
    training[1]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # the operator moved it
    assert decide_eviction(training[1], [budget], now=0.0, dry_run=False).budget is None, "the drain completes"
