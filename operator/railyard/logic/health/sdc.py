"""Verdicts from the trainer's silent-data-corruption checks.

The trainer does the checking (known-answer test, cross-replica checksums, spike detector,
replay); the operator only judges what the checks say. A failure the trainer marked confirmed
(a replay mismatch, a known-answer result outvoted by its peers, a checksum mismatch with a
majority) is SDC and names the suspect rank and its node; anything else (a loss spike, a tie
between two replicas) is a suspicion, reported but never acted on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from railyard.logic.health.model import Action, FaultKind, HealthEvent, HealthPolicy, Verdict

#: Checks whose failure is evidence on its own, even if the sender did not say confirmed.
CONFIRMING_KINDS = frozenset({"replay", "state_guard"})
#: Collective checks run by every rank: unconfirmed and without a named suspect (a tie), the
#: reporter is not the culprit.
UNATTRIBUTED_WITHOUT_SUSPECT = frozenset({"replay", "kat", "replica_checksum"})


def decide_sdc(
    events: Sequence[HealthEvent],
    seen_seq: int,
    nodes_by_rank: Mapping[int, tuple[str, int]],
    policy: HealthPolicy,
    now: float,
) -> tuple[list[Verdict], int]:
    """Verdicts for failed checks newer than ``seen_seq``; returns the new high-water mark.

    ``nodes_by_rank`` maps a rank to (node, pod index) so a suspect named by another rank's
    vote is located. Several ranks reporting the same suspect at the same step give one verdict.
    """
    out: list[Verdict] = []
    done: set[tuple[int, int, bool]] = set()
    top = seen_seq
    for ev in events:
        if ev.seq <= seen_seq:
            continue
        top = max(top, ev.seq)
        res = ev.result
        if res.ok:
            continue
        suspect = res.suspect_rank if res.suspect_rank >= 0 else ev.rank
        node, pod = nodes_by_rank.get(suspect, ("", -1))
        if suspect == ev.rank:
            node, pod = ev.node, ev.pod_index
        confirmed = res.confirmed or res.kind in CONFIRMING_KINDS
        if res.suspect_rank < 0 and not res.confirmed and res.kind in UNATTRIBUTED_WITHOUT_SUSPECT:
            # a collective check that could not say whose data was bad: every rank reports it,
            # the reporter is not the suspect; restart (from an SDC-clean checkpoint), blame no node
            suspect, node, pod = -1, "", -1
        key = (suspect, res.step, confirmed)
        if key in done:
            continue
        done.add(key)
        act = policy.sdc_action if confirmed else Action.REPORT
        out.append(
            Verdict(
                kind=FaultKind.SDC if confirmed else FaultKind.SUSPECTED_SDC,
                rank=suspect,
                node=node,
                pod_index=pod,
                reason="SilentDataCorruption" if confirmed else "SuspectedDataCorruption",
                message=(
                    f"{res.kind} check failed at step {res.step} on rank {suspect}"
                    f"{' (node ' + node + ')' if node else ''}"
                    f"{', reported by rank ' + str(ev.rank) if suspect != ev.rank else ''}"
                    f"{': ' + res.detail if res.detail else ''}"
                ),
                detected_at=now,
                fault_at=ev.arrived_at,
                action=act,
                quarantine_node=confirmed and act is Action.RESTART and bool(node),
            )
        )
    return out, top
