"""The quorums a replica group takes part in and the ids its torchft Manager gets for them
(railyard/protocol/quorum.py, decide_quorum; railyard_trainer/replicas.py, RejoiningClient):
after the operator recreated the Lighthouse the groups meet in one quorum, not each in its own,
and every member of a quorum gives it the same id, unique across Lighthouses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from railyard.protocol.quorum import (
    QUORUM_IDS_PER_STEP,
    REJOIN_ASK_INTERVAL_SECONDS,
    QuorumMemory,
    QuorumSeen,
    decide_quorum,
    quorum_epoch,
    rejoin_rounds,
)
from railyard.protocol.trainerconfig import lighthouse_join_timeout_ms
from railyard_trainer.replicas import RejoiningClient

AB = ("job-group-0:u0", "job-group-1:u1")
A = ("job-group-0:u0",)
B = ("job-group-1:u1",)
AB2 = ("job-group-0:u0", "job-group-1:u2")  # group 1's workers restarted: a new torchft id, the same group
ABC = ("job-group-0:u0", "job-group-1:u1", "job-group-2:u2")
ROUNDS = 3


def seen(quorum_id: int, step: int, members: tuple[str, ...], **kw: Any) -> QuorumSeen:
    return QuorumSeen(quorum_id=quorum_id, max_step=step, members=members, **kw)


def run(quorums: list[QuorumSeen], memory: QuorumMemory | None = None) -> tuple[list[bool], list[int], QuorumMemory]:
    memory = memory or QuorumMemory()
    accepted, ids = [], []
    for q in quorums:
        d = decide_quorum(memory, q, rejoin_rounds=ROUNDS)
        memory = d.memory
        accepted.append(d.accept)
        if d.accept:
            ids.append(d.epoch)
    return accepted, ids, memory


# one group's quorum answers in order -> which it takes part in
ROWS = [
    pytest.param([seen(1, 0, A), seen(2, 3, AB), seen(2, 4, AB)], [True] * 3,
                 id="one Lighthouse: every quorum, the first of one group alone too"),
    pytest.param([seen(1, 0, AB), seen(2, 9, A), seen(3, 12, AB)], [True] * 3,
                 id="one Lighthouse: a group lost and back"),
    pytest.param([seen(2, 0, AB), seen(1, 30, A), seen(1, 30, A), seen(2, 30, AB)], [True, False, False, True],
                 id="a new Lighthouse's quorum of one: asked again until the other group is in it"),
    pytest.param([seen(1, 0, AB), seen(1, 30, A), seen(2, 30, AB)], [True, False, True],
                 id="a new Lighthouse, the last id with fewer members: asked again"),
    pytest.param([seen(2, 0, AB), seen(1, 30, A), seen(3, 30, A), seen(4, 30, AB)], [True, False, False, True],
                 id="still asking again once the new Lighthouse's ids pass the old one's"),
    pytest.param([seen(2, 0, AB), seen(1, 30, AB)], [True, True], id="a new Lighthouse's first quorum holds everyone"),
    pytest.param([seen(2, 0, AB), seen(1, 30, A), seen(2, 30, AB2, healing=True)], [True, False, True],
                 id="the group is back with restarted workers: the same group"),
    pytest.param([seen(3, 0, ABC), seen(1, 30, A), seen(2, 30, AB), seen(3, 30, ABC)], [True, False, False, True],
                 id="three groups: waits for the last one too"),
    pytest.param([seen(2, 0, AB)] + [seen(1, 30, A)] * (ROUNDS + 1) + [seen(1, 31, A)],
                 [True] + [False] * ROUNDS + [True, True],
                 id="a group that does not come back is waited for ROUNDS asks, then left out"),
]


@pytest.mark.parametrize(("quorums", "accepted"), ROWS)
def test_a_group_takes_no_part_in_a_new_lighthouses_quorum_without_the_groups_of_its_last_one(
        quorums: list[QuorumSeen], accepted: list[bool]) -> None:
    assert run(quorums)[0] == accepted


# one group's accepted quorums in order -> does the Manager get a new id?
ID_ROWS = [
    pytest.param([seen(1, 0, AB), seen(1, 1, AB), seen(1, 7, AB)], [True, False, False],
                 id="one quorum over many steps: one id"),
    pytest.param([seen(1, 0, AB), seen(2, 9, A), seen(3, 12, AB)], [True, True, True],
                 id="a group lost and back: new ids"),
    pytest.param([seen(2, 0, AB), seen(1, 30, AB), seen(1, 31, AB)], [True, True, False],
                 id="a new Lighthouse, same members, other id: a new id once"),
    pytest.param([seen(2, 0, AB), seen(2, 30, AB), seen(2, 31, AB)], [True, False, False],
                 id="a new Lighthouse, same members, same id: the process group is kept"),
    pytest.param([seen(2, 0, AB), seen(2, 30, AB, healing=True), seen(2, 31, AB)], [True, True, False],
                 id="a member heals: a new id even when the Lighthouse's is the last one"),
]


@pytest.mark.parametrize(("quorums", "new"), ID_ROWS)
def test_a_quorum_gets_a_new_id_exactly_when_its_process_group_must_be_built_again(
        quorums: list[QuorumSeen], new: list[bool]) -> None:
    _, ids, _ = run(quorums)
    assert [i == 0 or ids[i] != ids[i - 1] for i in range(len(ids))] == new
    assert len(set(ids)) == sum(new), "no id is given to two quorums"


def test_every_member_gives_a_quorum_the_same_id_whatever_it_saw_before() -> None:
    # group 1 was away for quorum 2 (group 0 alone); both meet in quorum 3 at step 12
    _, ids0, _ = run([seen(1, 0, AB), seen(2, 9, A), seen(3, 12, AB, healing=True)])
    _, ids1, _ = run([seen(1, 0, AB), seen(3, 12, AB, healing=True)])
    assert ids0[-1] == ids1[-1] == quorum_epoch(12, 3, rebuild=True) == (12 * QUORUM_IDS_PER_STEP + 3) * 2 + 1


def test_the_defect_two_quorums_of_one_on_a_new_lighthouse_is_refused_by_both_groups() -> None:
    # the old Lighthouse's last quorum: id 2, both groups at step 13. The new one handed each
    # group a quorum of its own for step 14 (ids 1 and 2), then both together (id 3)
    acc0, ids0, _ = run([seen(2, 13, AB), seen(1, 14, A), seen(3, 14, AB)])
    acc1, ids1, _ = run([seen(2, 13, AB), seen(2, 14, B), seen(3, 14, AB)])
    assert acc0 == acc1 == [True, False, True], "neither trains step 14 alone"
    assert ids0[-1] == ids1[-1]


def test_a_new_lighthouse_reusing_the_last_id_keeps_the_process_group_for_every_member() -> None:
    # the run that hung before: old quorum 2 {A, B}; the new Lighthouse gave A quorum 1 {A}, then
    # both quorum 2 {A, B}. A refuses quorum 1, so both keep the old process group (the same
    # members at the same step; the Lighthouse is not on the collectives' path)
    _, ids0, _ = run([seen(2, 3, AB), seen(1, 14, A), seen(2, 14, AB)])
    _, ids1, _ = run([seen(2, 3, AB), seen(2, 14, AB)])
    assert ids0 == ids1 == [quorum_epoch(3, 2, rebuild=False)] * 2


def test_a_group_waits_about_the_lighthouses_join_timeout_for_a_missing_group() -> None:
    for watchdog in (8.0, 40.0, 60.0, 600.0):
        waited = rejoin_rounds(watchdog) * REJOIN_ASK_INTERVAL_SECONDS
        assert waited == pytest.approx(lighthouse_join_timeout_ms(watchdog) / 1000, abs=REJOIN_ASK_INTERVAL_SECONDS)
        assert waited <= watchdog / 2, "well below the watchdog that would end the waiting group"


@dataclass
class FakeResult:
    quorum_id: int
    max_step: int
    replica_ids: list[str]
    replica_world_size: int = 0
    max_world_size: int = 0
    store_address: str = "store:1"

    def __post_init__(self) -> None:
        self.replica_world_size = self.replica_world_size or len(self.replica_ids)
        self.max_world_size = self.max_world_size or len(self.replica_ids)


@dataclass
class FakeClient:
    answers: list[FakeResult]
    asked: list[dict[str, Any]] = field(default_factory=list)

    def _quorum(self, **kwargs: Any) -> FakeResult:
        self.asked.append(kwargs)
        return self.answers.pop(0)


def test_the_client_asks_again_with_the_same_request_and_hands_torchft_the_agreed_id() -> None:
    fake = FakeClient([FakeResult(2, 13, list(AB)), FakeResult(1, 14, list(A)), FakeResult(1, 14, list(A)),
                       FakeResult(3, 14, list(AB))])
    slept: list[float] = []
    client = RejoiningClient(fake, group=0, rank=0, rejoin_rounds=ROUNDS, sleep=slept.append)
    first = client._quorum(step=13, timeout=5)
    assert first.quorum_id == quorum_epoch(13, 2, rebuild=False) and first.store_address == "store:1"
    again = client._quorum(step=14, timeout=5)
    assert again.quorum_id == quorum_epoch(14, 3, rebuild=False) and list(again.replica_ids) == list(AB)
    assert fake.asked == [{"step": 13, "timeout": 5}] + [{"step": 14, "timeout": 5}] * 3
    assert slept == [REJOIN_ASK_INTERVAL_SECONDS] * 2
