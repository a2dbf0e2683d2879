"""Which torchft quorum a replica group takes part in, and the quorum id its Manager gets for it.

faultTolerance ReplicaGroups: every step each group's torchft Manager asks the Lighthouse for a
quorum. The trainer (railyard_trainer/replicas.py) passes each answer through
:func:`decide_quorum` before torchft sees it; it lives in protocol/ so the trainer may import it
and it is tested as a table (tests/trainer/test_quorum_ids_across_lighthouses.py).

Why a group may refuse a quorum. A Lighthouse the operator recreated after a loss (same
address, docs/fault-tolerance.md "The Lighthouse") knows nothing of the groups: it counts
quorum ids from 1 again, and it forms its first quorum as soon as every group it has heard from
has joined. The groups reach it one by one (torchft's Managers reconnect with a backoff of up
to seconds, and their heartbeats only as fast), so the first group to reach it was handed a
quorum of its own, and a group arriving a moment later, once the first one's beats were a
second old, could be handed another: two quorums of one that both committed the same step,
after which the groups' parameters differed (a false SDC verdict restarted one of them). So a
group that sees a new Lighthouse (an id smaller than its last one, or its last id with other
members: one Lighthouse's ids only grow, and one id is one membership) does not train in a
quorum that lacks a group of its last quorum: it asks again, every
:data:`REJOIN_ASK_INTERVAL_SECONDS`, until the quorum holds them all. The Lighthouse then has
every live group: one that asks while another stands between two asks waits for it (torchft's
split-brain rule: a group that heartbeats counts). A group that does not come back (it was lost
with the Lighthouse) is waited for ``rejoin_rounds`` asks, about the Lighthouse's own join
timeout, and then left out: the quorum it would have joined forms without it, as after any loss.

The rounds are counted, not timed: every rank of a group gets the same answers in the same order
(torchft's Manager server asks the Lighthouse once for all of them), so every rank decides the
same and asks again together; a clock would let one rank give up a round before another.

The ids. torchft's Manager keys its cross-group process group on the quorum id: an id equal to
the last one means "same members, keep the process group", another one builds a new one under
the store keys ``/torchft/<id>/``. A new Lighthouse's ids repeat old ones, so each id is replaced
by ``(first step x QUORUM_IDS_PER_STEP + id) x 2 + rebuild`` (:func:`quorum_epoch`): ``first step``
is the quorum's highest step when the group first accepted it, which every member agrees on.
Every member of a quorum must also agree on *whether* the id is new. A member keeps its id only
for the very quorum (id and members) it accepted last. Members whose histories differ (one
trained alone while the other was away, the Lighthouse replaced in between) meet in a quorum
where one is behind and heals: such a quorum always gets a new id (``rebuild`` 1), agreed by all
from the answer alone; within one Lighthouse that changes nothing (a heal always comes with a
new member, so a new Lighthouse id). Groups that refused a new Lighthouse's partial quorums
meet in a full one at the same step, with the same history: they agree on keeping their process
group (same id, same members: the Lighthouse is not on the collectives' path) or on a new one.
(torchft 0.2.0's quorum answer does not say whether a member's last commit failed; the
Lighthouse gives such a quorum a new id, which a new Lighthouse may not: the first step may
then fail once more on the aborted process group, and its failed commit brings the new id.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from railyard.protocol.trainerconfig import lighthouse_join_timeout_ms

#: How many quorum ids one Lighthouse may count through before :func:`quorum_epoch` would mix
#: them up with the next step's (torchft bumps the id on every change of membership).
QUORUM_IDS_PER_STEP = 1 << 16

#: How long a group that refused a new Lighthouse's quorum waits before asking again: short
#: (the groups meet within one interval of the last one reaching the Lighthouse) and well under
#: the Lighthouse's 1 s heartbeat timeout (a group between two asks still counts as alive).
REJOIN_ASK_INTERVAL_SECONDS = 0.2


def rejoin_rounds(watchdog_seconds: float) -> int:
    """How often a group asks a new Lighthouse again for the groups of its last quorum before it
    goes on without the missing ones: the Lighthouse's own join timeout (how long it waits for a
    live member that has not asked, :func:`lighthouse_join_timeout_ms`) in asks, so it stays as
    far below ``trainer.watchdogSeconds`` as that timeout does."""
    return max(1, math.ceil(lighthouse_join_timeout_ms(watchdog_seconds) / 1000 / REJOIN_ASK_INTERVAL_SECONDS))


def group_of(replica_id: str) -> str:
    """The group a torchft replica id names: torchft appends ``:<uuid>`` per Manager, so a
    group's restarted workers have a new id but are the same group."""
    return replica_id.split(":", 1)[0]


@dataclass(frozen=True, slots=True)
class QuorumSeen:
    """One quorum answer, as the group's Manager got it from the Lighthouse."""

    quorum_id: int
    max_step: int
    #: The members' torchft replica ids.
    members: tuple[str, ...]
    #: Some member is behind ``max_step`` and heals in this quorum.
    healing: bool = False


@dataclass(frozen=True, slots=True)
class QuorumMemory:
    """What a group carries from one quorum answer to the next."""

    #: The Lighthouse's id and the members (sorted) of the last quorum the group accepted.
    last_id: int | None = None
    last_members: tuple[str, ...] = ()
    #: The id the Manager got for it.
    epoch: int = -1
    #: A new Lighthouse was seen and no quorum has been accepted since.
    rejoining: bool = False
    #: Answers refused since the last accepted one.
    asked_again: int = 0


@dataclass(frozen=True, slots=True)
class QuorumDecision:
    #: Take part (torchft gets the answer with ``epoch`` as its id); False: ask again.
    accept: bool
    epoch: int
    memory: QuorumMemory
    #: Why the answer was refused, or why it was taken after a refusal ("": nothing to tell).
    reason: str = ""


def quorum_epoch(max_step: int, quorum_id: int, *, rebuild: bool) -> int:
    """The id a quorum first accepted at ``max_step`` gets (module docstring)."""
    return (max_step * QUORUM_IDS_PER_STEP + quorum_id) * 2 + int(rebuild)


def decide_quorum(memory: QuorumMemory, seen: QuorumSeen, *, rejoin_rounds: int) -> QuorumDecision:
    """Accept ``seen`` (and with which id) or ask again; pure (module docstring)."""
    members = tuple(sorted(seen.members))
    new_lighthouse = memory.last_id is not None and (
        seen.quorum_id < memory.last_id or (seen.quorum_id == memory.last_id and members != memory.last_members)
    )
    rejoining = memory.rejoining or new_lighthouse
    missing = sorted({group_of(m) for m in memory.last_members} - {group_of(m) for m in members}) if rejoining else []
    if missing and memory.asked_again < rejoin_rounds:
        asked = memory.asked_again + 1
        return QuorumDecision(
            accept=False, epoch=memory.epoch,
            memory=QuorumMemory(memory.last_id, memory.last_members, memory.epoch, rejoining=True, asked_again=asked),
            reason=f"a new Lighthouse's quorum {seen.quorum_id} without {', '.join(missing)} of the last one: "
                   f"asking again ({asked} of {rejoin_rounds})",
        )
    rebuild = seen.healing
    same = (seen.quorum_id, members) == (memory.last_id, memory.last_members)
    epoch = memory.epoch if same and not rebuild else quorum_epoch(seen.max_step, seen.quorum_id, rebuild=rebuild)
    reason = ""
    if memory.asked_again:
        reason = (f"without {', '.join(missing)}, still missing after {memory.asked_again} asks" if missing
                  else f"every group of the last quorum is back after {memory.asked_again} asks")
    return QuorumDecision(accept=True, epoch=epoch, memory=QuorumMemory(seen.quorum_id, members, epoch), reason=reason)
