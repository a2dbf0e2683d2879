"""The steps every recovery that keeps pods takes to open a new attempt (an in-place restart, a
replica-group repair, a shrink, a grow back), written once: read the running attempt's rank
table, write the new attempt's ConfigMap (adopting the one an earlier try of the same step
wrote), name each pod index's member of the new attempt."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from railyard.api.trainingjob import TrainingJob
from railyard.handlers.cycle import Cycle
from railyard.logic.gang import pod_index_of, pod_name_of
from railyard.logic.manifests import (
    build_configmap,
    build_trainer_config,
    owner_reference,
    pod_name,
)
from railyard.protocol.ranktable import RankTable

Obj = Mapping[str, Any]


async def running_table(cycle: Cycle) -> RankTable | None:
    """The rank table the current attempt runs (the control board's copy, else its ConfigMap;
    None: gone)."""
    table = cycle.runtime.control.table(cycle.ns, cycle.name, cycle.status.attempt)
    if table is None:
        table = await cycle.io.read_rank_table(cycle.ns, cycle.name, cycle.status.attempt)
    return table


async def write_attempt(
    cycle: Cycle, job: TrainingJob, attempt: int, table: RankTable, restore: dict[str, Any] | None
) -> tuple[RankTable, Any]:
    """Write ``attempt``'s ConfigMap (rank table, trainer config with ``restore``). One written by
    an earlier try of this same step (an operator that died before its status patch) is the one
    that counts: some launchers may already run its table. Returns the table and restore hint
    the launchers are given."""
    spec = job.spec
    config = build_trainer_config(spec, job=cycle.name, namespace=cycle.ns, attempt=attempt, restore=restore)
    if not await cycle.io.create_object(
        build_configmap(
            cycle.name,
            cycle.ns,
            owner_reference(cycle.body),
            attempt=attempt,
            rank_table=table,
            config=config,
            replica_groups=spec.replica_groups,
        )
    ):
        again = await cycle.io.read_rank_table(cycle.ns, cycle.name, attempt)
        if again is not None and len(again.pods) == len(table.pods):
            table = again
            written = await cycle.io.read_attempt_config(cycle.ns, cycle.name, attempt)
            return table, (written or {}).get("restore", restore)
    return table, restore


def member_names(
    cycle: Cycle, members: Sequence[Obj], attempt: int, pods: int, replaced: Collection[int]
) -> dict[int, str]:
    """Pod index -> the name of its member in ``attempt``: the pod that stays, or the name of the
    pod that replaces it (``replaced``, and indices without a pod)."""
    by_index = {pod_index_of(p): pod_name_of(p) for p in members}
    return {
        i: (by_index[i] if i in by_index and i not in replaced else pod_name(cycle.name, attempt, i))
        for i in range(pods)
    }
