"""``status.qosClass`` is the API server's, computed once at creation from cpu and memory only
(railyard.api.corev1.compute_pod_qos_class, kube's ComputePodQOS). The embedded server writes it
and refuses a change; the local node agent never sends it. A GPU pod must not become Burstable
because of ``nvidia.com/gpu`` (../shared/kube-golden/v1.36-workload 033-034 record a real server)."""

from __future__ import annotations

from typing import Any

import pytest

from railyard.api.corev1 import compute_pod_qos_class


def _c(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    return {"name": "c", "image": "x", "resources": res}


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("nothing set", {"containers": [_c()]}, "BestEffort"),
    ("GPU limit only: extended resources do not count (034)",
     {"containers": [_c(limits={"nvidia.com/gpu": "1"})]}, "BestEffort"),
    ("GPU limit, cpu/memory request in an init container (033)",
     {"containers": [_c(limits={"nvidia.com/gpu": "1"})],
      "initContainers": [_c(requests={"cpu": "100m", "memory": "64Mi"})]}, "Burstable"),
    ("cpu request only", {"containers": [_c(requests={"cpu": "1"})]}, "Burstable"),
    ("cpu+memory limits, requests defaulted from them",
     {"containers": [_c(limits={"cpu": "1", "memory": "1Gi"})]}, "Guaranteed"),
    ("cpu+memory+GPU limits: the GPU does not spoil Guaranteed",
     {"containers": [_c(limits={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "8"})]}, "Guaranteed"),
    ("requests below limits", {"containers": [_c(requests={"cpu": "500m", "memory": "1Gi"},
                                                 limits={"cpu": "1", "memory": "1Gi"})]}, "Burstable"),
    ("equal quantities written differently", {"containers": [_c(requests={"cpu": "1000m", "memory": "1024Mi"},
                                                                limits={"cpu": "1", "memory": "1Gi"})]}, "Guaranteed"),
    ("one container Guaranteed, the other only a memory limit",
     {"containers": [_c(limits={"cpu": "1", "memory": "1Gi"}), _c(limits={"memory": "1Gi"})]}, "Burstable"),
    ("an init container without limits spoils Guaranteed",
     {"containers": [_c(limits={"cpu": "1", "memory": "1Gi"})], "initContainers": [_c(requests={"cpu": "1"})]},
     "Burstable"),
    ("zero counts as unset", {"containers": [_c(requests={"cpu": "0", "memory": "0"})]}, "BestEffort"),
    ("pod-level resources replace the containers'",
     {"resources": {"limits": {"cpu": "2", "memory": "2Gi"}}, "containers": [_c(requests={"cpu": "1"})]},
     "Guaranteed"),
]


@pytest.mark.parametrize(("spec", "want"), [(s, w) for _, s, w in CASES], ids=[n for n, _, _ in CASES])
def test_qos_class_is_computed_from_cpu_and_memory_of_every_container(spec: dict[str, Any], want: str) -> None:
    assert compute_pod_qos_class(spec) == want
