"""Which checkpoint to restore, and which to delete: pure decisions over manifests.

Both sides call this module (it lives in protocol/ so the trainer may import it). The trainer, at start, lists the
committed manifests it can see in
every tier (its node's memory and local tiers, the replicas its node holds for a neighbour, the
shared tier), gathers those listings from all pods, and asks :func:`decide_restore` for the best
source; it verifies the shards the decision names, feeds the results back, and asks again until
the decision needs nothing more verified. The operator uses the same rules to report the last
verified checkpoint per tier and the steps a restart lost.

Rules (docs/checkpoints.md):

- a checkpoint exists only through a committed manifest; shard files without one are ignored;
- a manifest whose SDC checks did not pass (``sdc_passed=False``) is never restored;
- the newest step wins (none newer than the hint's ``not_after`` that an attempt before its
  ``abandoned_before`` wrote, when it has one); among sources of the same step the fastest tier wins
  (memory, then local, then shared) unless the operator's hint names another tier for that
  step; the hint never makes an older step win;
- a checkpoint is usable when every shard it lists is present somewhere with a matching
  manifest and is not known corrupt: shards may come from different places of one tier (a lost
  node's memory-tier shard from the neighbour that holds its replica);
- memory and local tiers hold per-rank shards; they restore onto another layout (pp, dp, tp)
  only for a caller that can reshard them (``node_reshard``: the trainer reads the old ranks'
  files as one checkpoint); the shared tier is a DCP checkpoint that reshards onto any layout;
- a shard is loaded only after its checksum verified; a corrupt shard removes that copy, and
  the next call falls back to another copy, another tier or an older step. Each call either
  returns a source with nothing left to verify, asks to verify copies not yet checked, or gives
  up, so the verify loop ends after at most one round per shard copy.

No I/O, no clock: callers pass listings and ``now``-free values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from railyard.protocol.heartbeat import CheckpointEvent
from railyard.protocol.manifest import TIERS, Manifest, ShardInfo

#: Restore preference: lower is faster.
TIER_RANK: Mapping[str, int] = {tier: i for i, tier in enumerate(TIERS)}
#: Tiers whose files live on one node and hold per-rank shards (no resharding).
PER_NODE_TIERS = frozenset({"memory", "local"})
#: The location name of the shared tier (one place for all pods).
SHARED_LOCATION = "shared"


def pod_location(pod_index: int) -> str:
    """Location name of a pod's node-local tier directories."""
    return f"pod-{pod_index}"


@dataclass(frozen=True, slots=True)
class Layout:
    pp: int
    dp: int
    tp: int

    @classmethod
    def of(cls, manifest: Manifest) -> Layout:
        return cls(manifest.pp, manifest.dp, manifest.tp)


@dataclass(frozen=True, slots=True)
class FoundCheckpoint:
    """A committed manifest found in one place, and the state of its shard files there."""

    manifest: Manifest
    #: ``shared`` or ``pod-<index>`` (the node tier directory a running pod can read).
    location: str
    #: Shard paths present there with the size the manifest lists.
    present: frozenset[str]
    #: Shard paths whose SHA-256 matched the manifest.
    verified: frozenset[str] = frozenset()
    #: Shard paths whose SHA-256 (or read) failed.
    corrupt: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class RestoreHint:
    """The operator's suggestion (config.json ``restore``): picks the tier among sources of one
    step; ``not_after`` (config.json ``notAfter``, -1: none) rules out every newer checkpoint
    that an attempt before ``abandoned_before`` (``abandonedBefore``; absent: any attempt)
    wrote (faultTolerance ReplicaGroups: the groups' states differed after that step, and the
    attempt ``abandoned_before`` went back to it; the operator's ``status.checkpointFence``)."""

    tier: str
    step: int
    not_after: int = -1
    abandoned_before: int | None = None

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any] | None) -> RestoreHint | None:
        """config.json's ``restore`` (written by the operator's ``restore_hint``); None when it
        names no checkpoint source."""
        if not raw:
            return None
        tier, step = raw.get("tier"), raw.get("step")
        if not (isinstance(tier, str) and isinstance(step, int)):
            return None
        not_after, before = raw.get("notAfter", -1), raw.get("abandonedBefore")
        return cls(tier=tier, step=step, not_after=not_after if isinstance(not_after, int) else -1,
                   abandoned_before=before if isinstance(before, int) else None)

    def shuts_out(self, step: int, attempt: int) -> bool:
        """Whether a checkpoint of ``step`` written by ``attempt`` is on the abandoned part of the run."""
        return 0 <= self.not_after < step and (self.abandoned_before is None or attempt < self.abandoned_before)


@dataclass(frozen=True, slots=True)
class RestoreSource:
    tier: str
    step: int
    attempt: int
    manifest: Manifest
    #: For every shard path of the manifest, the location to read it from.
    sources: Mapping[str, str]
    #: True when the checkpoint was written with another (pp, dp, tp) layout (shared tier only).
    reshard: bool


@dataclass(frozen=True, slots=True)
class RestoreDecision:
    """``source`` is None when nothing can be restored; ``reason`` then says why."""

    source: RestoreSource | None
    #: (shard path, location) copies to verify before the source may be loaded.
    to_verify: tuple[tuple[str, str], ...] = ()
    reason: str = ""
    #: One line per checkpoint that was considered and not chosen, newest first.
    rejected: tuple[str, ...] = ()

    @property
    def ready(self) -> bool:
        return self.source is not None and not self.to_verify


@dataclass(frozen=True, slots=True)
class _Candidate:
    tier: str
    step: int
    attempt: int
    copies: tuple[FoundCheckpoint, ...] = field(default=())


def decide_restore(
    found: Iterable[FoundCheckpoint],
    *,
    layout: Layout,
    hint: RestoreHint | None = None,
    home: Mapping[int, str] | None = None,
    node_reshard: bool = False,
) -> RestoreDecision:
    """Choose the newest restorable checkpoint, fastest tier first.

    ``home`` maps a shard owner (rank) to the location it should preferably be read from (the
    pod that will load it), so a local copy wins over a neighbour's replica. ``node_reshard``:
    the loader can reshard the per-rank shards of the memory and local tiers onto another
    layout (the trainer fetches the old ranks' files each new rank overlaps), so those tiers
    are not skipped when the layout changed.
    """
    groups: dict[tuple[str, int, int], list[FoundCheckpoint]] = {}
    for f in found:
        m = f.manifest
        groups.setdefault((m.tier, m.step, m.attempt), []).append(f)

    def order(key: tuple[str, int, int]) -> tuple[int, int, int, int]:
        tier, step, attempt = key
        hinted = 0 if hint is not None and hint.tier == tier and hint.step == step else 1
        return (-step, hinted, TIER_RANK.get(tier, len(TIER_RANK)), -attempt)

    rejected: list[str] = []
    for key in sorted(groups, key=order):
        tier, step, attempt = key
        copies = sorted(groups[key], key=lambda f: f.location)
        name = f"{tier} step {step} (attempt {attempt})"
        if hint is not None and hint.shuts_out(step, attempt):
            rejected.append(
                f"{name}: newer than step {hint.not_after}, after which the replica groups' states differed"
            )
            continue
        listings = _group_by_listing(copies)
        # the shard list most copies agree on (ties: the first location's)
        reference_digest = max(listings, key=lambda digest: len(listings[digest]))
        ref_manifest = listings[reference_digest][0].manifest
        if not ref_manifest.sdc_passed:
            rejected.append(f"{name}: SDC checks had not passed at that step")
            continue
        reshard = Layout.of(ref_manifest) != layout
        if reshard and tier in PER_NODE_TIERS and not node_reshard:
            rejected.append(
                f"{name}: written with layout pp={ref_manifest.pp} dp={ref_manifest.dp} "
                f"tp={ref_manifest.tp}; the {tier} tier holds per-rank shards and cannot reshard"
            )
            continue
        sources: dict[str, str] = {}
        to_verify: list[tuple[str, str]] = []
        missing: list[str] = []
        holders_of = _holders_by_path(copies, listings, reference_digest)
        homes = home or {}
        for shard in ref_manifest.shards:
            holders = holders_of.get(shard.path)
            if not holders:
                missing.append(shard.path)
                continue
            best = holders[0] if len(holders) == 1 else min(
                holders, key=_copy_preference(shard, homes.get(shard.owner, ""))
            )
            sources[shard.path] = best.location
            if shard.path not in best.verified:
                to_verify.append((shard.path, best.location))
        if missing:
            shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            rejected.append(f"{name}: no intact copy of {shown}")
            continue
        source = RestoreSource(
            tier=tier, step=step, attempt=attempt, manifest=ref_manifest, sources=sources, reshard=reshard
        )
        return RestoreDecision(source=source, to_verify=tuple(to_verify), rejected=tuple(rejected))
    reason = "no committed checkpoint found" if not groups else "no checkpoint is complete, verified and SDC-clean"
    return RestoreDecision(source=None, reason=reason, rejected=tuple(rejected))


def merge_verified(
    found: Iterable[FoundCheckpoint],
    source: RestoreSource,
    results: Iterable[tuple[str, str, bool]],
) -> list[FoundCheckpoint]:
    """``found`` with verification results (shard path, location, ok) of ``source``'s copies
    merged in: good ones become ``verified``, bad ones ``corrupt``. Other checkpoints are kept
    as they are. One pass over the results and one over ``found``."""
    good: dict[str, set[str]] = {}
    bad: dict[str, set[str]] = {}
    for path, location, ok in results:
        (good if ok else bad).setdefault(location, set()).add(path)
    key = (source.tier, source.step, source.attempt)
    out: list[FoundCheckpoint] = []
    for f in found:
        m = f.manifest
        g, b = good.get(f.location), bad.get(f.location)
        if (g is None and b is None) or (m.tier, m.step, m.attempt) != key:
            out.append(f)
            continue
        out.append(replace(f, verified=f.verified | (g or frozenset()), corrupt=f.corrupt | (b or frozenset())))
    return out


def _copy_preference(shard: ShardInfo, preferred: str) -> Callable[[FoundCheckpoint], tuple[bool, bool, str]]:
    """Verified copies first, then the loading pod's own copy, then by location name."""

    def key(f: FoundCheckpoint) -> tuple[bool, bool, str]:
        return (shard.path not in f.verified, f.location != preferred, f.location)

    return key


def _group_by_listing(copies: Sequence[FoundCheckpoint]) -> dict[str, list[FoundCheckpoint]]:
    """Copies grouped by their manifest's shard list (its digest), in order of first appearance.
    Every pod's manifest lists all shards of the gang: comparing the lists themselves would cost
    pods x shards; the digest makes it one string per copy."""
    out: dict[str, list[FoundCheckpoint]] = {}
    for f in copies:
        out.setdefault(f.manifest.shards_digest, []).append(f)
    return out


def _holders_by_path(
    copies: Sequence[FoundCheckpoint],
    listings: Mapping[str, Sequence[FoundCheckpoint]],
    reference_digest: str,
) -> dict[str, list[FoundCheckpoint]]:
    """Per shard path of the reference list, the copies (in ``copies`` order) that hold it intact
    and whose manifest lists that very shard, in one pass over each copy's present files. A copy
    with the reference's digest lists exactly the reference shards; the lists of other digests
    (rare: an older attempt's manifest) are turned into sets once per digest."""
    by_path = {s.path: s for s in listings[reference_digest][0].manifest.shards}
    # None: the copy lists exactly the reference shards
    listed: dict[str, frozenset[ShardInfo] | None] = {
        digest: None if digest == reference_digest else frozenset(group[0].manifest.shards)
        for digest, group in listings.items()
    }
    out: dict[str, list[FoundCheckpoint]] = {}
    for f in copies:
        mine = listed[f.manifest.shards_digest]
        for path in f.present - f.corrupt if f.corrupt else f.present:
            shard = by_path.get(path)
            if shard is not None and (mine is None or shard in mine):
                out.setdefault(path, []).append(f)
    return out


def plan_gc(
    manifests: Iterable[Manifest],
    *,
    keep: int,
    uncommitted_steps: Iterable[int] = (),
) -> list[int]:
    """Steps to delete in one tier directory: all but the newest ``keep`` committed ones.

    The newest SDC-clean checkpoint is never deleted, even when newer suspect ones fill
    ``keep``. Uncommitted step directories (interrupted saves) are deleted only when older than
    the newest committed step: a newer one may still be in flight.
    """
    steps = sorted({m.step for m in manifests}, reverse=True)
    clean = sorted({m.step for m in manifests if m.sdc_passed}, reverse=True)
    protected = set(steps[: max(keep, 1)])
    if clean:
        protected.add(clean[0])
    doomed = [s for s in steps if s not in protected]
    newest = steps[0] if steps else None
    if newest is not None:
        doomed.extend(s for s in set(uncommitted_steps) if s < newest and s not in steps)
    return sorted(doomed)


@dataclass(frozen=True, slots=True)
class UnrestoredGroupDecision:
    """What a replica group whose own tiers could not restore does after a quorum:
    ``train`` (it healed to the step it needed), ``ask_again`` (join the next quorum), or
    ``exit`` with ``NoVerifiedCheckpoint`` for ``reason``."""

    action: str
    reason: str = ""


def decide_replica_group_unrestored(
    *,
    hint_step: int | None,
    quorum_step: int,
    participants: int,
    groups: int,
    full_quorums_before: int,
    timed_out: bool,
) -> UnrestoredGroupDecision:
    """faultTolerance ReplicaGroups, after a whole-job restart: each group reads only its own
    tier folders, and the group whose node was replaced holds nothing while the others restore
    the operator's hinted step. Instead of exiting, that group joins quorums and heals from a
    peer; this decides, after each quorum, whether it may train on the state it now holds
    (``quorum_step``: the quorum's highest step, which a heal brought it to).

    It trains on once the quorum reached the hinted step (without a hint: any trained state,
    step >= 1). A quorum of all ``groups`` below that is final only when it is the second
    such: every group joins one quorum before it restores, so a full quorum may hold peers that
    have not restored yet, but in the next full one every peer has been through its restore.
    A quorum without some group (one still restoring past the Lighthouse's join timeout, or
    gone) is never final: ask again, until ``timed_out``. Exiting keeps the protection against
    silently starting over."""
    need = max(hint_step, 1) if hint_step is not None and hint_step >= 0 else 1
    if quorum_step >= need:
        return UnrestoredGroupDecision("train")
    final = participants >= groups and full_quorums_before >= 1
    if not final and not timed_out:
        return UnrestoredGroupDecision("ask_again")
    what = f"the hinted step {hint_step}" if hint_step is not None and hint_step >= 0 else "a trained state"
    why = "" if final else f", and {groups - participants} of {groups} groups did not join before the wait ended"
    return UnrestoredGroupDecision(
        "exit", f"no live replica group reached {what} either (the quorum's highest step is {quorum_step}{why})"
    )


def compute_steps_lost(last_step: int, restored_step: int) -> int:
    """Steps trained before the failure that the restart has to redo (``restored_step`` -1: all)."""
    return max(0, last_step - max(restored_step, 0))


def latest_verified_per_tier(events: Iterable[CheckpointEvent]) -> dict[str, int]:
    """The newest committed, SDC-clean step per tier, from the checkpoint events seen so far."""
    latest: dict[str, int] = {}
    for e in events:
        if e.kind == "save" and e.ok and e.sdc_passed and e.tier in TIER_RANK and e.step > latest.get(e.tier, -1):
            latest[e.tier] = e.step
    return latest
