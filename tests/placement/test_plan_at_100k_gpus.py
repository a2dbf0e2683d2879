"""`railyard plan` for the 98,304-GPU replica-group example (issue 49): it prints the number of
replica groups the operator would choose (parallelism.dataReplicas: 0) with its reason, each
group's failure domains, and the checkpoint intervals the spec leaves open with their reasons.
How long it takes is bench/placement.py's figure, not this test's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from railyard.cli import main
from railyard.logic.groups import GroupShape, decide_replica_groups

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-405b-98k-gpus.yaml"
#: 8 spines x 17 leaves x 96 nodes of 8 GPUs: 13,056 nodes, room for the 12,288 and the spares
NODES = "spine=8,leaf=17,nodes=96,gpus=8"


def test_the_plan_names_the_groups_their_failure_domains_and_the_intervals(capsys: Any) -> None:
    assert main(["plan", str(EXAMPLE), "--nodes", NODES, "--show-pods", "2"]) == 0
    out = capsys.readouterr().out
    # the count is the operator's rule's, for this job on this topology (12,288 nodes, leaves of 96)
    chosen = decide_replica_groups(GroupShape(nodes=12_288, procs_per_node=8, pp=16, dp=768, tp=8, leaf_nodes=96))
    assert f"replica groups chosen (parallelism.dataReplicas: 0): {chosen.groups} groups" in out
    rows = [line for line in out.splitlines() if line.strip().split(" ", 1)[0].isdigit() and "leaf" in line]
    assert len(rows) == chosen.groups, "one line per group with its failure domains"
    assert "failure domains: no leaf or NVLink domain holds two replica groups" in out
    intervals = out.split("checkpoint intervals", 1)[1].splitlines()[1:4]
    assert [line.split()[0] for line in intervals] == ["memory", "local", "shared"]
    assert all("Young/Daly" in line and "protects against" in line for line in intervals), intervals


def test_a_compact_spec_that_describes_millions_of_nodes_is_refused_naming_what_nodes_counts(capsys: Any) -> None:
    # nodes= counts nodes per leaf: this misreading is 12.6 million nodes, which ran a 24 GiB machine out of memory
    assert main(["plan", str(EXAMPLE), "--nodes", "spine=8,leaf=128,nodes=12288"]) != 0
    err = capsys.readouterr().err
    assert "nodes counts nodes per leaf" in err and "spine=8,leaf=16,nodes=96" in err
