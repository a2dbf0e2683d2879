"""The rank table: which global rank runs where, and with which mesh coordinates.

The operator's placement produces it; the operator writes it as JSON into the job's ConfigMap;
every pod's launcher reads it to start its local ranks. The mesh order is ``pp x dp x tp`` with
``tp`` innermost, so ``rank == (pp * dp_size + dp) * tp_size + tp``; this is exactly the rank
order of ``torch.distributed.device_mesh.init_device_mesh(..., (pp, dp, tp))``. Which node a rank
runs on is free: the placement picks it so that TP groups stay inside a node and DP groups share
a rail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1


class RankTableError(ValueError):
    """A rank table that cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class RankEntry:
    rank: int
    node: str
    pod_index: int
    local_rank: int
    rail: int
    pp: int
    dp: int
    tp: int


@dataclass(frozen=True, slots=True)
class PodEntry:
    """One pod of the gang. ``address`` is filled by the operator (pod DNS name or IP)."""

    pod_index: int
    node: str
    address: str = ""
    #: Pod index whose memory tier holds this pod's checkpoint replica (-1: none).
    replica_peer: int = -1


@dataclass(frozen=True, slots=True)
class RankTable:
    job: str
    attempt: int
    pp: int
    dp: int
    tp: int
    procs_per_node: int
    pods: tuple[PodEntry, ...]
    ranks: tuple[RankEntry, ...]
    master_addr: str = ""
    master_port: int = 29500
    version: int = field(default=SCHEMA_VERSION)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def ranks_of_pod(self, pod_index: int) -> list[RankEntry]:
        """This pod's ranks, ordered by local rank."""
        return sorted((r for r in self.ranks if r.pod_index == pod_index), key=lambda r: r.local_rank)

    def validate(self) -> None:
        """Raise :class:`RankTableError` unless the table is a consistent pp x dp x tp layout."""
        problems: list[str] = []
        if min(self.pp, self.dp, self.tp, self.procs_per_node) < 1:
            problems.append("pp, dp, tp and procs_per_node must all be >= 1")
        if len(self.ranks) != self.world_size:
            problems.append(f"ranks: {len(self.ranks)} entries, expected world size {self.world_size}")
        seen: set[int] = set()
        slots: set[tuple[int, int]] = set()
        pod_idx = {p.pod_index for p in self.pods}
        for e in self.ranks:
            if e.rank in seen:
                problems.append(f"ranks[{e.rank}]: duplicate rank")
            seen.add(e.rank)
            expect = (e.pp * self.dp + e.dp) * self.tp + e.tp
            if expect != e.rank:
                problems.append(f"ranks[{e.rank}]: coordinates (pp={e.pp}, dp={e.dp}, tp={e.tp}) give rank {expect}")
            if e.pod_index not in pod_idx:
                problems.append(f"ranks[{e.rank}]: pod_index {e.pod_index} is not in pods")
            if not 0 <= e.local_rank < self.procs_per_node:
                problems.append(f"ranks[{e.rank}]: local_rank {e.local_rank} outside [0, {self.procs_per_node})")
            if (e.pod_index, e.local_rank) in slots:
                problems.append(f"ranks[{e.rank}]: pod {e.pod_index} local rank {e.local_rank} used twice")
            slots.add((e.pod_index, e.local_rank))
        if problems:
            raise RankTableError("; ".join(problems))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def to_dict(self) -> dict[str, Any]:
        """The table as plain JSON types (what ``dataclasses.asdict`` gives, several times faster:
        a 16,384-rank table is written for every attempt and digested for every restart)."""
        return {
            "job": self.job,
            "attempt": self.attempt,
            "pp": self.pp,
            "dp": self.dp,
            "tp": self.tp,
            "procs_per_node": self.procs_per_node,
            "master_addr": self.master_addr,
            "master_port": self.master_port,
            "version": self.version,
            "pods": [
                {"pod_index": p.pod_index, "node": p.node, "address": p.address, "replica_peer": p.replica_peer}
                for p in self.pods
            ],
            "ranks": [
                {
                    "rank": r.rank,
                    "node": r.node,
                    "pod_index": r.pod_index,
                    "local_rank": r.local_rank,
                    "rail": r.rail,
                    "pp": r.pp,
                    "dp": r.dp,
                    "tp": r.tp,
                }
                for r in self.ranks
            ],
        }

    @classmethod
    def from_json(cls, text: str) -> RankTable:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankTable:
        try:
            version = int(d.get("version", SCHEMA_VERSION))
            if version > SCHEMA_VERSION:
                raise RankTableError(
                    f"version: {version} is newer than this reader ({SCHEMA_VERSION}); upgrade the trainer image"
                )
            table = cls(
                job=str(d["job"]),
                attempt=int(d["attempt"]),
                pp=int(d["pp"]),
                dp=int(d["dp"]),
                tp=int(d["tp"]),
                procs_per_node=int(d["procs_per_node"]),
                pods=tuple(PodEntry(**_known(PodEntry, p)) for p in d["pods"]),
                ranks=tuple(RankEntry(**_known(RankEntry, r)) for r in d["ranks"]),
                master_addr=str(d.get("master_addr", "")),
                master_port=int(d.get("master_port", 29500)),
                version=version,
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, RankTableError):
                raise
            raise RankTableError(f"malformed rank table: {exc!r}") from exc
        table.validate()
        return table


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """Drop fields this reader does not know (newer writers may add some)."""
    names = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    return {k: v for k, v in d.items() if k in names}
