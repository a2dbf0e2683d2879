"""The manifest's shard-list digest: filled on construction, written, checked when read, and
computed for manifests written before it existed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from railyard.protocol.manifest import Manifest, ManifestError, ShardInfo, compute_shards_digest


def _manifest(*shards: ShardInfo) -> Manifest:
    return Manifest(job="j", step=10, tier="memory", attempt=0, pp=1, dp=2, tp=1, shards=shards)


SHARDS = (ShardInfo("rank-00000/__0_0.distcp", 10, "aa", 0), ShardInfo("rank-00001/__0_0.distcp", 10, "bb", 1))


def test_digest_is_filled_on_construction_and_survives_a_round_trip() -> None:
    m = _manifest(*SHARDS)
    assert m.shards_digest == compute_shards_digest(SHARDS) and len(m.shards_digest) == 64
    raw = json.loads(m.to_json())
    assert raw["shards_digest"] == m.shards_digest
    back = Manifest.from_json(m.to_json())
    assert back == m and back.shards_digest == m.shards_digest


@pytest.mark.parametrize(
    "changed",
    [
        ShardInfo("rank-00000/__0_1.distcp", 10, "aa", 0),
        ShardInfo("rank-00000/__0_0.distcp", 11, "aa", 0),
        ShardInfo("rank-00000/__0_0.distcp", 10, "ab", 0),
        ShardInfo("rank-00000/__0_0.distcp", 10, "aa", 1),
        ShardInfo("rank-00000/__0_0.distcp", 10, "aa", 0, "xxh3-128"),
    ],
    ids=["path", "bytes", "sha256", "owner", "algorithm"],
)
def test_any_changed_shard_field_changes_the_digest(changed: ShardInfo) -> None:
    assert _manifest(changed, SHARDS[1]).shards_digest != _manifest(*SHARDS).shards_digest


def test_replace_recomputes_the_digest() -> None:
    m = _manifest(*SHARDS)
    shorter = replace(m, shards=SHARDS[:1])
    assert shorter.shards_digest == compute_shards_digest(SHARDS[:1]) != m.shards_digest


def test_a_manifest_written_without_a_digest_is_read_and_given_one() -> None:
    raw = json.loads(_manifest(*SHARDS).to_json())
    del raw["shards_digest"]
    old = Manifest.from_json(json.dumps(raw))
    assert old.shards_digest == compute_shards_digest(SHARDS)


def test_a_digest_that_disagrees_with_the_shard_list_is_refused() -> None:
    raw = json.loads(_manifest(*SHARDS).to_json())
    raw["shards"][1]["sha256"] = "cc"
    with pytest.raises(ManifestError, match="shards_digest"):
        Manifest.from_json(json.dumps(raw))


def test_shards_written_before_the_algorithm_field_read_as_sha256_with_their_old_digest() -> None:
    raw = json.loads(_manifest(*SHARDS).to_json())
    for s in raw["shards"]:
        del s["algorithm"]
    old = Manifest.from_json(json.dumps(raw))  # its written shards_digest still matches
    assert [s.algorithm for s in old.shards] == ["sha256", "sha256"]
    rows = [[s.path, s.bytes, s.sha256, s.owner] for s in SHARDS]
    assert old.shards_digest == hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def test_the_algorithm_of_each_shard_survives_a_round_trip() -> None:
    m = _manifest(replace(SHARDS[0], algorithm="xxh3-128"), SHARDS[1])
    assert [s.algorithm for s in Manifest.from_json(m.to_json()).shards] == ["xxh3-128", "sha256"]
