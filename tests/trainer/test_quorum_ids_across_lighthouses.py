"""The quorum ids a replica group gives torchft's Manager (railyard_trainer/replicas.py,
QuorumEpochs): unique across the Lighthouses the operator creates, agreed by every member."""

from __future__ import annotations

import pytest

from railyard_trainer.replicas import QUORUM_IDS_PER_STEP, QuorumEpochs

AB = ("job-group-0:u0", "job-group-1:u1")
A = ("job-group-0:u0",)

# one group's quorums in order: (Lighthouse's id, max_step, members) -> a new id for the Manager?
ROWS = [
    pytest.param([(1, 0, AB), (1, 1, AB), (1, 7, AB)], [True, False, False], id="one quorum over many steps: one id"),
    pytest.param([(1, 0, AB), (2, 9, A), (3, 12, AB)], [True, True, True], id="a group lost and back: new ids"),
    pytest.param([(1, 0, AB), (1, 30, A), (2, 31, AB)], [True, True, True],
                 id="a new Lighthouse's first quorum, same id, fewer members: a new id"),
    pytest.param([(2, 0, AB), (1, 30, AB), (1, 31, AB)], [True, True, False], id="a new Lighthouse, same members: a new id once"),
]


@pytest.mark.parametrize(("quorums", "new"), ROWS)
def test_a_quorum_gets_a_new_id_exactly_when_the_lighthouse_formed_a_new_one(
        quorums: list[tuple[int, int, tuple[str, ...]]], new: list[bool]) -> None:
    epochs = QuorumEpochs()
    ids = [epochs.of(q, step, list(members)) for q, step, members in quorums]
    assert [i == 0 or ids[i] != ids[i - 1] for i in range(len(ids))] == new
    assert len(set(ids)) == sum(new), "no id is given to two quorums"


def test_every_member_gives_a_quorum_the_same_id_whatever_it_saw_before() -> None:
    # group 1 was away for quorum 2 (group 0 alone); both meet in quorum 3 at step 12
    group0, group1 = QuorumEpochs(), QuorumEpochs()
    group0.of(1, 0, list(AB))
    group0.of(2, 9, list(A))
    group1.of(1, 0, list(AB))
    assert group0.of(3, 12, list(reversed(AB))) == group1.of(3, 12, list(AB)) == 12 * QUORUM_IDS_PER_STEP + 3
