"""The checkpoint manifest: the one file that makes a checkpoint exist.

A checkpoint directory ``<tier root>/<job>/step-<NNNNNNNN>/`` holds shard files and, written
last and atomically (write to a temp name, fsync, rename), ``manifest.json``. A directory without
a manifest is an interrupted save and does not exist. The manifest lists every shard with its
size and checksum (``sha256``, under the algorithm named by ``algorithm``) so a restore can verify
before loading; it records whether the SDC checks at that step passed, so a restore never picks a
suspect checkpoint. ``shards_digest`` (SHA-256 of the shard list) lets a restore tell in O(1)
whether two pods' manifests list the same shards: every pod's copy lists every shard of the gang,
so comparing the lists themselves costs pods x shards.

The operator reads manifests (through the trainer's heartbeats and the shared tier) to report
the last verified checkpoint per tier and to choose what the next attempt restores from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
TIERS = ("memory", "local", "shared")


class ManifestError(ValueError):
    """A manifest that cannot be trusted; the message names the field."""


@dataclass(frozen=True, slots=True)
class ShardInfo:
    #: Path relative to the checkpoint directory.
    path: str
    bytes: int
    #: The file's hex digest under ``algorithm``. (The field keeps its first algorithm's name so
    #: that manifests written before ``algorithm`` existed read unchanged.)
    sha256: str
    #: The rank (or pod index for per-pod files) that wrote it; -1 for shared metadata.
    owner: int = -1
    #: The checksum algorithm of ``sha256``: "sha256", or "xxh3-128" (XXH3, 128 bits), which the
    #: trainer writes. Absent in a manifest: "sha256".
    algorithm: str = "sha256"


@dataclass(frozen=True, slots=True)
class Manifest:
    job: str
    step: int
    tier: str
    attempt: int
    pp: int
    dp: int
    tp: int
    shards: tuple[ShardInfo, ...]
    #: Trainer state beyond tensors: data position, rng, lr scheduler step.
    data_position: dict[str, Any] = field(default_factory=dict)
    sdc_passed: bool = True
    created_at: float = 0.0
    version: int = SCHEMA_VERSION
    #: :func:`compute_shards_digest` of ``shards``, computed on construction (never passed in,
    #: so it cannot go stale); written to the file, and checked against the list when read.
    shards_digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shards_digest", compute_shards_digest(self.shards))

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        try:
            d = json.loads(text)
            if not isinstance(d, dict):
                raise ManifestError("manifest: expected a JSON object")
            version = int(d.get("version", SCHEMA_VERSION))
            if version > SCHEMA_VERSION:
                raise ManifestError(f"version: {version} is newer than this reader ({SCHEMA_VERSION})")
            tier = str(d["tier"])
            if tier not in TIERS:
                raise ManifestError(f"tier: {tier!r} is not one of {TIERS}")
            shard_fields = set(ShardInfo.__dataclass_fields__)
            manifest = cls(
                job=str(d["job"]),
                step=int(d["step"]),
                tier=tier,
                attempt=int(d.get("attempt", 0)),
                pp=int(d["pp"]),
                dp=int(d["dp"]),
                tp=int(d["tp"]),
                shards=tuple(ShardInfo(**{k: v for k, v in s.items() if k in shard_fields}) for s in d["shards"]),
                data_position=dict(d.get("data_position", {})),
                sdc_passed=bool(d.get("sdc_passed", True)),
                created_at=float(d.get("created_at", 0.0)),
                version=version,
            )
        except ManifestError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"malformed manifest: {exc!r}") from exc
        # Manifests written before the digest existed have none: it is computed from the list.
        written = d.get("shards_digest")
        if written is not None and written != manifest.shards_digest:
            raise ManifestError(
                f"shards_digest: {written!r} does not match the shard list ({manifest.shards_digest!r}); "
                "the manifest is damaged, this checkpoint is not used"
            )
        return manifest


def compute_shards_digest(shards: Iterable[ShardInfo]) -> str:
    """SHA-256 (hex) of the compact JSON array ``[[path, bytes, sha256, owner], ...]`` in the
    manifest's order (a row ends with ``algorithm`` when that is not "sha256", so digests of
    lists written before the field existed are unchanged): equal digests mean equal shard lists."""
    rows = [
        (s.path, s.bytes, s.sha256, s.owner)
        if s.algorithm == "sha256"
        else (s.path, s.bytes, s.sha256, s.owner, s.algorithm)
        for s in shards
    ]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def step_dirname(step: int) -> str:
    return f"step-{step:08d}"
