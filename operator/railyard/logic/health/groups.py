"""The cross-group SDC vote of faultTolerance ReplicaGroups.

Each replica group is a world of its own with one replica, so the trainer's cross-replica
checksum has nothing to compare inside it. Across groups, though, everything is replicated:
after every committed step, rank ``r`` of each group holds the same parameters and optimizer
state bit for bit (the same layout, the same summed gradient, the same arithmetic). Every
``sdc.intervalSteps`` steps and before every checkpoint each rank puts a fingerprint of that
state in its heartbeats (``RankBeat.fingerprint`` at ``fingerprint_step``); here the operator
compares, per slot (group rank) and step, the fingerprints of the groups:

- all equal: the groups agree at that step;
- a strict majority and some groups differing: each differing group is the suspect, a confirmed
  SDC naming its rank and node (the group is evicted alone, its node quarantined, and it heals
  from a good group: logic/inplace.py's group repair);
- no strict majority (two groups that differ, or a three-way split): nobody can be named; an
  SDC verdict without a suspect restarts every group from the checkpoint tiers, no newer than
  the last step every slot's groups agreed on (``Verdict.restore_not_after``), so the
  divergent state cannot come back from a checkpoint saved after it.

A step is judged once every group that has sent fingerprints for the slot stands at that step
or later (a group that heals in later never holds up the vote: it reports later steps; a group
that skipped the step is not counted). Each group is named at most once per attempt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from railyard.logic.health.model import (
    Action,
    FaultKind,
    GroupVoteState,
    HealthPolicy,
    RankSignals,
    Verdict,
)

#: Verdict reasons (Events).
DIVERGED = "ReplicaGroupDiverged"
NO_MAJORITY = "ReplicaGroupsDisagree"


def decide_group_sdc(
    ranks: Iterable[RankSignals],
    state: GroupVoteState,
    policy: HealthPolicy,
    now: float,
) -> tuple[list[Verdict], GroupVoteState]:
    """New verdicts of the cross-group vote and the state for the next call."""
    slots: dict[int, dict[int, RankSignals]] = {}
    for r in ranks:
        if r.fingerprints:
            slots.setdefault(r.group_rank, {})[r.group] = r
    judged, agreed = dict(state.judged), dict(state.agreed)
    named, tied = set(state.named), state.tied
    out: list[Verdict] = []
    for slot, groups in sorted(slots.items()):
        if len(groups) < 2:
            continue
        ready_to = min(max(r.fingerprints) for r in groups.values())
        steps = sorted({s for r in groups.values() for s in r.fingerprints if judged.get(slot, -1) < s <= ready_to})
        for step in steps:
            judged[slot] = step
            votes = {g: r.fingerprints[step] for g, r in groups.items() if step in r.fingerprints}
            if len(votes) < 2:
                continue
            value, count = Counter(votes.values()).most_common(1)[0]
            if count == len(votes):
                agreed[slot] = step
                continue
            if is_strict_majority(count, len(votes)):
                for g in sorted(g for g, v in votes.items() if v != value and g not in named):
                    named.add(g)
                    out.append(_diverged(groups[g], step, count, len(votes), policy, now))
                continue
            if not tied:
                tied = True
                out.append(_no_majority(slot, step, votes, min(agreed.values(), default=-1), policy, now))
    return out, GroupVoteState(judged=judged, agreed=agreed, named=frozenset(named), tied=tied)


def is_strict_majority(count: int, total: int) -> bool:
    """Whether ``count`` of ``total`` groups holding one state outvote the rest: then the groups
    that differ are named and repaired alone (with one corrupt group: three groups or more);
    otherwise nobody can be named and every group goes back behind the fence."""
    return count * 2 > total


def _diverged(r: RankSignals, step: int, count: int, total: int, policy: HealthPolicy, now: float) -> Verdict:
    restart = policy.sdc_action is Action.RESTART
    return Verdict(
        kind=FaultKind.SDC,
        rank=r.rank,
        node=r.node,
        pod_index=r.pod_index,
        reason=DIVERGED,
        message=(
            f"replica group {r.group} diverged at step {step}: the state of its rank {r.group_rank} (job rank {r.rank}"
            f"{', node ' + r.node if r.node else ''}) differs from the one {count} of {total} groups hold"
        ),
        detected_at=now,
        fault_at=now,
        action=policy.sdc_action,
        quarantine_node=restart and bool(r.node),
    )


def _no_majority(
    slot: int, step: int, votes: Mapping[int, str], agreed: int, policy: HealthPolicy, now: float
) -> Verdict:
    groups = ", ".join(str(g) for g in sorted(votes))
    back = (
        f"no checkpoint newer than step {agreed}, the last step they agreed on"
        if agreed >= 0
        else "from the start (they were never seen to agree)"
    )
    return Verdict(
        kind=FaultKind.SDC,
        rank=-1,
        node="",
        pod_index=-1,
        reason=NO_MAJORITY,
        message=(
            f"replica groups {groups} hold different states at step {step} (rank {slot} of each) and no majority names "
            f"the bad one: every group restarts from the checkpoint tiers, {back}; no node is quarantined"
        ),
        detected_at=now,
        fault_at=now,
        action=policy.sdc_action,
        restore_not_after=max(agreed, 0),
    )
