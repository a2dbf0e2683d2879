"""Table-driven checks of the pure restore choice and GC rules (railyard.protocol.restore)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from railyard.protocol.heartbeat import CheckpointEvent
from railyard.protocol.manifest import Manifest, ShardInfo
from railyard.protocol.restore import (
    FoundCheckpoint,
    Layout,
    RestoreHint,
    compute_steps_lost,
    decide_replica_group_unrestored,
    decide_restore,
    latest_verified_per_tier,
    merge_verified,
    plan_gc,
)

LAYOUT = Layout(pp=1, dp=4, tp=1)


def shards(step: int, n: int = 4) -> tuple[ShardInfo, ...]:
    return tuple(ShardInfo(path=f"rank-{r:05d}/data", bytes=100, sha256=f"{step:04d}{r}", owner=r) for r in range(n))


@dataclass
class CkptBuilder:
    """A found checkpoint in one place; chain ``with_*`` and finish with ``obj()``."""

    tier: str
    step: int
    location: str = "pod-0"
    attempt: int = 0
    layout: Layout = LAYOUT
    sdc: bool = True
    missing: set[int] = field(default_factory=set)
    corrupt: set[int] = field(default_factory=set)
    verified: set[int] = field(default_factory=set)
    only: set[int] | None = None

    def at(self, location: str) -> CkptBuilder:
        return replace(self, location=location)

    def holding(self, *ranks: int) -> CkptBuilder:
        return replace(self, only=set(ranks))

    def without(self, *ranks: int) -> CkptBuilder:
        return replace(self, missing=set(ranks))

    def with_corrupt(self, *ranks: int) -> CkptBuilder:
        return replace(self, corrupt=set(ranks))

    def with_verified(self, *ranks: int) -> CkptBuilder:
        return replace(self, verified=set(ranks))

    def suspect(self) -> CkptBuilder:
        return replace(self, sdc=False)

    def with_layout(self, pp: int, dp: int, tp: int) -> CkptBuilder:
        return replace(self, layout=Layout(pp, dp, tp))

    def obj(self) -> FoundCheckpoint:
        n = self.layout.pp * self.layout.dp * self.layout.tp
        sh = shards(self.step, n)
        m = Manifest(
            job="j", step=self.step, tier=self.tier, attempt=self.attempt,
            pp=self.layout.pp, dp=self.layout.dp, tp=self.layout.tp, shards=sh, sdc_passed=self.sdc,
        )
        ranks = set(range(n)) if self.only is None else self.only
        present = {sh[r].path for r in ranks - self.missing}
        return FoundCheckpoint(
            manifest=m, location=self.location, present=frozenset(present),
            verified=frozenset(sh[r].path for r in self.verified),
            corrupt=frozenset(sh[r].path for r in self.corrupt),
        )


def mem(step: int) -> CkptBuilder:
    return CkptBuilder("memory", step, location="pod-0")


def local(step: int) -> CkptBuilder:
    return CkptBuilder("local", step, location="pod-0")


def shared(step: int) -> CkptBuilder:
    return CkptBuilder("shared", step, location="shared")


CASES = [
    # (name, found, expected (tier, step) or None)
    ("newest step wins over a faster tier", [mem(10), shared(20)], ("shared", 20)),
    ("same step: fastest tier wins", [shared(20), local(20), mem(20)], ("memory", 20)),
    ("missing shard falls back to the next tier", [mem(20).without(2), local(20)], ("local", 20)),
    ("missing everywhere falls back to an older step", [mem(20).without(1), mem(10)], ("memory", 10)),
    ("corrupt shard falls back to the previous checkpoint", [mem(20).with_corrupt(3), mem(10)], ("memory", 10)),
    ("corrupt shard falls back to another tier", [mem(20).with_corrupt(0), shared(20)], ("shared", 20)),
    ("SDC-suspect checkpoint is skipped", [mem(30).suspect(), local(20)], ("local", 20)),
    ("SDC-suspect in every tier: nothing newer", [mem(30).suspect(), shared(30).suspect(), shared(10)], ("shared", 10)),
    (
        "lost node's shards come from the neighbour's replica",
        [mem(20).at("pod-0").holding(0, 1), mem(20).at("pod-1").holding(0, 1, 2, 3)],
        ("memory", 20),
    ),
    (
        "shards split over two pods with no copy of one: fall back",
        [mem(20).at("pod-0").holding(0, 1), mem(20).at("pod-1").holding(2), shared(10)],
        ("shared", 10),
    ),
    ("per-node tier cannot reshard", [mem(20).with_layout(1, 2, 1), shared(10)], ("shared", 10)),
    ("shared tier reshards", [shared(20).with_layout(1, 2, 1)], ("shared", 20)),
    ("nothing found", [], None),
    ("only suspect and incomplete", [mem(5).suspect(), local(5).without(0)], None),
]


@pytest.mark.parametrize(("name", "found", "expected"), CASES, ids=[c[0] for c in CASES])
def test_decide_restore_picks(name: str, found: list[CkptBuilder], expected: tuple[str, int] | None) -> None:
    decision = decide_restore([f.obj() for f in found], layout=LAYOUT)
    got = None if decision.source is None else (decision.source.tier, decision.source.step)
    assert got == expected, decision.rejected
    if expected is None:
        assert decision.reason


def test_replica_combination_reads_each_shard_from_its_home_first() -> None:
    found = [mem(20).at("pod-0").holding(0, 1, 2, 3), mem(20).at("pod-1").holding(0, 1, 2, 3)]
    home = {0: "pod-0", 1: "pod-0", 2: "pod-1", 3: "pod-1"}
    d = decide_restore([f.obj() for f in found], layout=LAYOUT, home=home)
    assert d.source is not None
    assert {p[-10:-5]: loc for p, loc in d.source.sources.items()} == {
        "00000": "pod-0", "00001": "pod-0", "00002": "pod-1", "00003": "pod-1"}


def test_replica_used_for_lost_pod_and_asked_to_verify() -> None:
    found = [mem(20).at("pod-0").holding(0, 1, 2, 3), mem(20).at("pod-1").holding()]
    home = {0: "pod-0", 1: "pod-0", 2: "pod-1", 3: "pod-1"}
    d = decide_restore([f.obj() for f in found], layout=LAYOUT, home=home)
    assert d.source is not None and not d.ready
    assert set(d.source.sources.values()) == {"pod-0"}
    assert len(d.to_verify) == 4


def test_verify_loop_terminates_on_corrupt_copies() -> None:
    """Feed verify results back like the trainer does: corrupt copies lead to an older step."""
    found = {f.location + f.manifest.tier + str(f.manifest.step): f for f in
             [mem(20).obj(), mem(10).obj(), shared(20).obj()]}
    bad = {("memory", 20, 2), ("shared", 20, 0)}
    rounds = 0
    while True:
        rounds += 1
        assert rounds < 10
        d = decide_restore(found.values(), layout=LAYOUT)
        if d.ready or d.source is None:
            break
        for path, loc in d.to_verify:
            key = loc + d.source.tier + str(d.source.step)
            f = found[key]
            rank = int(path[5:10])
            ok = (d.source.tier, d.source.step, rank) not in bad
            found[key] = replace(
                f,
                verified=f.verified | ({path} if ok else set()),
                corrupt=f.corrupt | (set() if ok else {path}),
            )
    assert d.source is not None and (d.source.tier, d.source.step) == ("memory", 10)
    assert any("memory step 20" in r for r in d.rejected)
    assert any("shared step 20" in r for r in d.rejected)


def test_hint_breaks_ties_only() -> None:
    f = [mem(20).obj(), local(20).obj(), shared(10).obj()]
    assert decide_restore(f, layout=LAYOUT, hint=RestoreHint("local", 20)).source.tier == "local"  # type: ignore[union-attr]
    assert decide_restore(f, layout=LAYOUT, hint=RestoreHint("shared", 10)).source.step == 20  # type: ignore[union-attr]


def test_manifest_disagreeing_copy_is_not_used() -> None:
    """A node kept an older attempt's step 20; its files do not count for the newer attempt."""
    new = CkptBuilder("memory", 20, attempt=2, location="pod-0").holding(0, 1).obj()
    old = CkptBuilder("memory", 20, attempt=1, location="pod-1").holding(0, 1, 2, 3).obj()
    d = decide_restore([new, old], layout=LAYOUT)
    assert d.source is not None and d.source.attempt == 1
    assert set(d.source.sources.values()) == {"pod-1"}


def test_copies_of_one_step_that_disagree_on_a_shard_follow_the_majority() -> None:
    """Three pods' manifests of one step list the same shards, one lists rank 3's shard with
    another checksum: the majority's list is the reference; the odd copy's rank-3 file is not a
    copy of the reference shard, its other files are."""
    good = [mem(20).at(f"pod-{i}").holding(i) for i in range(3)]
    odd_manifest = mem(20).obj().manifest
    odd_shards = (*odd_manifest.shards[:3], replace(odd_manifest.shards[3], sha256="other"))
    odd = FoundCheckpoint(
        manifest=replace(odd_manifest, shards=odd_shards), location="pod-3",
        present=frozenset(s.path for s in odd_shards),
    )
    found = [f.obj() for f in good] + [odd]
    assert odd.manifest.shards_digest != found[0].manifest.shards_digest
    d = decide_restore(found, layout=LAYOUT)
    assert d.source is None, "rank 3's shard has no copy matching the reference list"
    assert any("rank-00003" in r for r in d.rejected)
    # Another pod with the reference list holding rank 3 completes it; the odd copy stays unused
    # for rank 3 but still serves as a second holder of what it lists identically.
    found.append(mem(20).at("pod-4").holding(3).obj())
    d = decide_restore(found, layout=LAYOUT, home={0: "pod-3"})
    assert d.source is not None
    assert d.source.manifest.shards_digest == found[0].manifest.shards_digest
    assert d.source.sources["rank-00003/data"] == "pod-4"
    assert d.source.sources["rank-00000/data"] == "pod-3"


def test_merge_verified_marks_only_the_named_copies_of_the_source() -> None:
    found = [mem(20).at("pod-0").obj(), mem(20).at("pod-1").obj(), mem(10).at("pod-0").obj()]
    d = decide_restore(found, layout=LAYOUT)
    assert d.source is not None and d.source.step == 20
    merged = merge_verified(
        found, d.source, [("rank-00000/data", "pod-0", True), ("rank-00001/data", "pod-0", False)]
    )
    assert merged[0].verified == {"rank-00000/data"} and merged[0].corrupt == {"rank-00001/data"}
    assert merged[1] is found[1], "no result for pod-1"
    assert merged[2] is found[2], "another step is left alone"
    again = decide_restore(merged, layout=LAYOUT)
    assert again.source is not None and again.source.sources["rank-00001/data"] == "pod-1"


def _m(step: int, sdc: bool = True) -> Manifest:
    return Manifest(job="j", step=step, tier="memory", attempt=0, pp=1, dp=1, tp=1, shards=(), sdc_passed=sdc)


GC_CASES = [
    ("keep newest K", [10, 20, 30, 40], set(), 2, [], [10, 20]),
    ("newest verified kept despite suspect newer", [10, 20, 30, 40], {30, 40}, 2, [], [10]),
    ("keep zero still keeps newest", [10, 20], set(), 0, [], [10]),
    ("all suspect keep K", [10, 20, 30], {10, 20, 30}, 1, [], [10, 20]),
    ("interrupted older saves removed, newer kept", [10, 20], set(), 5, [5, 15, 25], [5, 15]),
    ("nothing committed: nothing deleted", [], set(), 1, [5], []),
]


@pytest.mark.parametrize(("name", "steps", "suspect", "keep", "uncommitted", "doomed"), GC_CASES, ids=[c[0] for c in GC_CASES])
def test_plan_gc(name: str, steps: list[int], suspect: set[int], keep: int, uncommitted: list[int], doomed: list[int]) -> None:
    manifests = [_m(s, s not in suspect) for s in steps]
    got = plan_gc(manifests, keep=keep, uncommitted_steps=uncommitted)
    assert got == doomed
    clean = [s for s in steps if s not in suspect]
    if clean:
        assert max(clean) not in got


def test_steps_lost_and_latest_verified() -> None:
    assert compute_steps_lost(57, 50) == 7
    assert compute_steps_lost(57, -1) == 57
    assert compute_steps_lost(40, 50) == 0
    events = [
        CheckpointEvent(step=10, tier="memory", ok=True),
        CheckpointEvent(step=20, tier="memory", ok=False),
        CheckpointEvent(step=15, tier="memory", ok=True, sdc_passed=False),
        CheckpointEvent(step=10, tier="shared", ok=True),
        CheckpointEvent(step=30, tier="shared", ok=True, kind="restore"),
    ]
    assert latest_verified_per_tier(events) == {"memory": 10, "shared": 10}


@pytest.mark.parametrize(
    ("hint_step", "quorum_step", "participants", "full_before", "timed_out", "action"),
    [
        pytest.param(10, 10, 2, 0, False, "train", id="healed-to-the-hinted-step"),
        pytest.param(10, 12, 2, 1, False, "train", id="healed-beyond-the-hint"),
        pytest.param(10, 10, 1, 0, True, "train", id="healed-even-at-the-deadline"),
        pytest.param(None, 7, 2, 0, False, "train", id="no-hint-a-load-failed-peers-hold-a-state"),
        pytest.param(10, 0, 2, 0, False, "ask_again", id="first-full-quorum-peers-may-not-have-restored-yet"),
        pytest.param(10, 0, 1, 5, False, "ask_again", id="a-group-missing-it-may-still-be-restoring"),
        pytest.param(10, 0, 2, 1, False, "exit", id="second-full-quorum-nobody-restored"),
        pytest.param(10, 9, 3, 1, False, "exit", id="peers-below-the-hint"),
        pytest.param(10, 0, 1, 0, True, "exit", id="a-group-stayed-away-until-the-deadline"),
        pytest.param(None, 0, 2, 1, False, "exit", id="no-hint-nobody-holds-anything"),
        pytest.param(0, 0, 2, 1, False, "exit", id="hint-step-0-is-no-trained-state"),
    ],
)
def test_a_replica_group_without_its_checkpoint_heals_only_from_peers_at_the_hint(
    hint_step: int | None, quorum_step: int, participants: int, full_before: int, timed_out: bool, action: str
) -> None:
    d = decide_replica_group_unrestored(hint_step=hint_step, quorum_step=quorum_step, participants=participants,
                                        groups=participants if participants > 1 else 2, full_quorums_before=full_before, timed_out=timed_out)
    assert d.action == action
    assert (d.reason != "") == (action == "exit")
    if action == "exit":
        assert f"highest step is {quorum_step}" in d.reason
        assert f"hinted step {hint_step}" in d.reason if hint_step is not None else "a trained state" in d.reason


def test_a_hint_with_not_after_rules_out_newer_checkpoints() -> None:
    """faultTolerance ReplicaGroups with no majority among the groups: nothing saved after the
    last step they agreed on may come back."""
    found = [mem(20).obj(), shared(10).obj()]
    got = decide_restore(found, layout=LAYOUT, hint=RestoreHint("", -1, not_after=15))
    assert got.source is not None and (got.source.tier, got.source.step) == ("shared", 10)
    assert any("newer than step 15" in r for r in got.rejected)
    assert decide_restore(found, layout=LAYOUT, hint=RestoreHint("", -1, not_after=5)).source is None
    assert decide_restore(found, layout=LAYOUT, hint=RestoreHint("memory", 20)).source.step == 20  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("newer_attempt", "restored"),
    [
        pytest.param(1, ("shared", 10), id="written-before-the-fence-abandoned"),
        pytest.param(3, ("memory", 20), id="written-by-the-attempt-that-went-back-kept"),
        pytest.param(4, ("memory", 20), id="written-by-a-later-attempt-kept"),
    ],
)
def test_the_fence_shuts_out_only_the_abandoned_part_of_the_run(newer_attempt: int, restored: tuple[str, int]) -> None:
    """Attempt 3 went back to step 15 (the groups disagreed after it). A checkpoint of step 20
    that attempt 1 wrote is on the abandoned part of the run, on every later restart too; one
    that attempt 3 or later wrote, training again from step 15, is the run's own."""
    found = [CkptBuilder("memory", 20, attempt=newer_attempt).obj(), CkptBuilder("shared", 10, attempt=1).obj()]
    hint = RestoreHint.from_wire({"tier": "", "step": -1, "notAfter": 15, "abandonedBefore": 3})
    got = decide_restore(found, layout=LAYOUT, hint=hint)
    assert got.source is not None and (got.source.tier, got.source.step) == restored


@pytest.mark.parametrize(
    ("raw", "hint"),
    [
        pytest.param(None, None, id="none"),
        pytest.param({"tier": "memory", "step": 20, "lastStep": 23}, RestoreHint("memory", 20), id="plain"),
        pytest.param({"tier": "", "step": -1, "notAfter": 15}, RestoreHint("", -1, 15), id="fence-without-attempt-all-attempts"),
        pytest.param({"tier": "", "step": -1, "notAfter": 15, "abandonedBefore": 3}, RestoreHint("", -1, 15, 3), id="fence"),
        pytest.param({"tier": 3, "step": -1}, None, id="malformed"),
    ],
)
def test_reading_the_hint_from_config_json(raw: dict[str, object] | None, hint: RestoreHint | None) -> None:
    assert RestoreHint.from_wire(raw) == hint
