"""Node selection is written once (railyard.api.corev1): the operator's placement
(``spec.nodeSelector``) and the local cluster's scheduler (a pod's ``nodeSelector``) keep the same
nodes, and a node-affinity term matches as kube-scheduler matches it."""

from __future__ import annotations

from typing import Any

import pytest

from railyard.api.corev1 import labels_match, match_node_selector_term
from railyard.logic.placement import matches_node_selector
from railyard_local.scheduling import build_node_info, check_node

from .builders import make_node, make_pod

LABELS = {"railyard.dev/leaf": "leaf-0", "gen": "5"}


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        ({}, True),
        ({"gen": "5"}, True),
        ({"gen": "5", "railyard.dev/leaf": "leaf-0"}, True),
        ({"gen": "4"}, False),
        ({"gen": "5", "missing": "x"}, False),
        ({"missing": ""}, False),  # an absent label is not an empty one
    ],
)
def test_placement_and_the_local_scheduler_agree_on_a_node_selector(selector: dict[str, str], selected: bool) -> None:
    node = make_node("node-0", labels=LABELS)
    assert labels_match(selector, LABELS) is selected
    assert labels_match(tuple(selector.items()), LABELS) is selected
    assert matches_node_selector(node, selector) is selected
    verdict = check_node(make_pod().node_selector(**selector).obj(), build_node_info(node), {})
    assert (verdict is None) is selected, verdict


def test_a_selector_of_a_mapping_and_of_its_items_agree_on_odd_values() -> None:
    """labels_match tests a dict selector as one subset test of its items; the pairwise rule it
    stands for answers the same, a None value (which a missing label matches) included."""
    for selector in ({"missing": None}, {"gen": None}, {"gen": "5", "missing": None}, {"gen": 5}):
        assert labels_match(selector, LABELS) is labels_match(tuple(selector.items()), LABELS), selector
    assert labels_match({"missing": None}, LABELS) is True


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


@pytest.mark.parametrize(
    ("term", "matches"),
    [
        ({}, False),  # an empty term matches nothing
        ({"matchExpressions": [expr("gen", "In", "4", "5")]}, True),
        ({"matchExpressions": [expr("gen", "NotIn", "5")]}, False),
        ({"matchExpressions": [expr("missing", "NotIn", "5")]}, True),
        ({"matchExpressions": [expr("gen", "Exists")]}, True),
        ({"matchExpressions": [expr("gen", "DoesNotExist")]}, False),
        ({"matchExpressions": [expr("gen", "Gt", "4")]}, True),
        ({"matchExpressions": [expr("gen", "Lt", "5")]}, False),
        ({"matchExpressions": [expr("gen", "Gt", "x")]}, False),
        ({"matchExpressions": [expr("gen", "In", "5"), expr("railyard.dev/leaf", "In", "leaf-1")]}, False),
        ({"matchFields": [expr("metadata.name", "In", "node-0")]}, True),
        ({"matchFields": [expr("metadata.name", "NotIn", "node-0")]}, False),
        ({"matchFields": [expr("spec.other", "Exists")]}, False),
    ],
)
def test_a_node_affinity_term_matches_as_kube_scheduler_matches_it(term: dict[str, Any], matches: bool) -> None:
    assert match_node_selector_term(term, name="node-0", labels=LABELS) is matches
