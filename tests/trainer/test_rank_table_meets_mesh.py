"""The operator's rank table and the trainer's mesh agree.

Two pods on two "nodes", started by two launchers like the operator's pods. The table is
deliberately not in natural order: pod 0 runs ranks 2 and 3 with their local ranks swapped,
pod 1 runs ranks 0 and 1. MASTER_ADDR is a DNS name (resolved by the launcher).
"""

from __future__ import annotations

import json

import pytest

from railyard.protocol.ports import free_port
from railyard.protocol.ranktable import PodEntry, RankEntry, RankTable

from .launch import BASE_TRAINER, launcher_env, parse_events, start_launcher

pytestmark = pytest.mark.torch


def build_table(port: int) -> RankTable:
    pp, dp, tp = 1, 2, 2
    placement = {2: ("node-b", 0, 1), 3: ("node-b", 0, 0), 0: ("node-a", 1, 0), 1: ("node-a", 1, 1)}
    ranks = []
    for rank, (node, pod, local) in placement.items():
        ranks.append(RankEntry(rank=rank, node=node, pod_index=pod, local_rank=local, rail=local,
                               pp=rank // (dp * tp), dp=(rank // tp) % dp, tp=rank % tp))
    table = RankTable(job="t", attempt=0, pp=pp, dp=dp, tp=tp, procs_per_node=2,
                      pods=(PodEntry(0, "node-b", "localhost"), PodEntry(1, "node-a", "localhost")),
                      ranks=tuple(ranks), master_addr="localhost", master_port=port)
    table.validate()
    return table


def test_each_rank_gets_the_coordinates_of_the_rank_table(tmp_path) -> None:  # type: ignore[no-untyped-def]
    table = build_table(free_port())
    table_path = tmp_path / "ranktable.json"
    table_path.write_text(table.to_json())
    config = {"job": "t", "trainer": {**BASE_TRAINER, "steps": 2}, "parallelism": {"tensor": 2}}
    procs = []
    for pod in (0, 1):
        env = launcher_env(RAILYARD_RANK_TABLE=str(table_path), RAILYARD_POD_INDEX=str(pod),
                       RAILYARD_NODE_NAME=table.pods[pod].node, MASTER_ADDR="localhost",
                       MASTER_PORT=str(table.master_port))
        procs.append(start_launcher(tmp_path / f"pod{pod}", [], config, env))
    outs = [p.communicate(timeout=150) for p in procs]
    events = {pod: parse_events(out) for pod, (out, _) in enumerate(outs)}
    for pod, p in enumerate(procs):
        assert p.returncode == 0, f"pod {pod}: {outs[pod][1][-3000:]}\n{json.dumps(events[pod][-10:])}"

    for pod in (0, 1):
        starts = {e["rank"]: e for e in events[pod] if e["event"] == "start"}
        expected = table.ranks_of_pod(pod)
        assert sorted(starts) == sorted(e.rank for e in expected)
        for entry in expected:
            got = starts[entry.rank]
            assert got["coords"] == got["mesh_coords"] == [entry.pp, entry.dp, entry.tp]
            assert got["local_rank"] == entry.local_rank
            assert got["node"] == entry.node
