"""The pod-local heartbeat socket is unique per namespace, job, attempt and pod index: two jobs
of the same name in different namespaces on one host must not share an aggregator."""

from __future__ import annotations

from railyard_trainer.health.client import aggregator_path


def test_same_job_name_in_two_namespaces_gets_two_sockets() -> None:
    assert aggregator_path("team-a", "llama", 0, 0) != aggregator_path("team-b", "llama", 0, 0)


def test_the_path_is_stable_and_distinct_per_attempt_and_pod() -> None:
    base = aggregator_path("ns", "job", 1, 2)
    assert base == aggregator_path("ns", "job", 1, 2)
    others = {aggregator_path("ns", "job", 2, 2), aggregator_path("ns", "job", 1, 3), aggregator_path("ns", "job2", 1, 2)}
    assert base not in others and len(others) == 3
    # the namespace is part of the key, not just glued to the job name
    assert aggregator_path("a-b", "c", 0, 0) != aggregator_path("a", "b-c", 0, 0)
