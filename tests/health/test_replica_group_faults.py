"""faultTolerance ReplicaGroups: the health rules name one group.

- SDC across groups: every group's rank r holds the same state after a committed step; the
  ranks put a fingerprint of it in their heartbeats and the operator compares the groups' per
  slot and step. The group that differs from the majority is the suspect (its node is
  quarantined); with no majority (two groups) nobody is named and every group restarts from the
  tiers, no newer than the last step they agreed on.
- A hang of one group stalls the others in the exchange; those say ``waiting_for_groups`` and
  are excused, so the verdict names the hung group alone.

Pure: the heartbeat store and the rules, no cluster, no clock."""

from __future__ import annotations

import dataclasses

import pytest

from railyard.api.trainingjob import CheckpointFence
from railyard.logic.health import (
    Action,
    FaultKind,
    HealthPolicy,
    HealthState,
    PodStatus,
    decide_health,
)
from railyard.logic.health.groups import DIVERGED, NO_MAJORITY, decide_group_sdc, is_strict_majority
from railyard.logic.health.liveness import decide_hung_ranks
from railyard.logic.health.model import GroupVoteState
from railyard.logic.health.window import GroupLayout, HeartbeatStore
from railyard.logic.restarts import restore_hint
from railyard.protocol.heartbeat import (
    HeartbeatBatch,
    HeartbeatError,
    RankBeat,
    heartbeat_from_dict,
    parse_heartbeat,
)

NS, JOB = "ns", "j"
POLICY = HealthPolicy()


@dataclasses.dataclass
class _Rank:
    rank: int
    group: int
    group_rank: int = 0
    pod_index: int = -1
    node: str = ""
    fingerprints: dict[int, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.pod_index = self.group if self.pod_index < 0 else self.pod_index
        self.node = self.node or f"node-{self.group}"


def _groups(*fps: dict[int, str]) -> list[_Rank]:
    """One rank per group (slot 0), group g on pod g and node-g, with these fingerprints."""
    return [_Rank(rank=g, group=g, fingerprints=dict(f)) for g, f in enumerate(fps)]


@pytest.mark.parametrize(
    ("fps", "named", "tie_not_after"),
    [
        pytest.param(({10: "a", 20: "b"}, {10: "a", 20: "b"}, {10: "a", 20: "b"}), [], None, id="three-agree"),
        pytest.param(({10: "a", 20: "b"}, {10: "a", 20: "X"}, {10: "a", 20: "b"}), [1], None, id="group-1-diverged"),
        pytest.param(({10: "a", 20: "X"}, {10: "a", 20: "b"}, {10: "a", 20: "b"}, {10: "a", 20: "b"}), [0], None, id="group-0-of-4"),
        pytest.param(({10: "a", 20: "b"}, {10: "a", 20: "X"}), [], 10, id="two-groups-no-majority"),
        pytest.param(({20: "b"}, {20: "X"}), [], 0, id="two-groups-never-agreed"),
        pytest.param(({10: "a", 20: "b"}, {10: "a", 20: "X"}, {10: "a", 20: "Y"}), [], 10, id="three-way-split"),
        pytest.param(({10: "a", 20: "b"}, {20: "X"}, {10: "a", 20: "b"}), [1], None, id="a-healed-group-missed-step-10"),
    ],
)
def test_the_group_that_differs_from_the_majority_is_named(fps: tuple[dict[int, str], ...], named: list[int], tie_not_after: int | None) -> None:
    verdicts, state = decide_group_sdc(_groups(*fps), GroupVoteState(), POLICY, now=5.0)
    diverged = [v for v in verdicts if v.reason == DIVERGED]
    assert [v.pod_index for v in diverged] == named
    for v in diverged:
        assert v.kind is FaultKind.SDC and v.action is Action.RESTART and v.quarantine_node
        assert v.node == f"node-{v.pod_index}" and f"replica group {v.pod_index} diverged at step 20" in v.message
    ties = [v for v in verdicts if v.reason == NO_MAJORITY]
    if tie_not_after is None:
        assert not ties
    else:
        (tie,) = ties
        assert (tie.rank, tie.node, tie.pod_index, tie.quarantine_node) == (-1, "", -1, False), "nobody is named"
        assert tie.kind is FaultKind.SDC and tie.action is Action.RESTART
        assert tie.restore_not_after == tie_not_after
    # judged once: the same fingerprints again give nothing new
    again, _ = decide_group_sdc(_groups(*fps), state, POLICY, now=6.0)
    assert again == []


@pytest.mark.parametrize(("count", "total", "names"), [
    (1, 2, False),  # two groups that differ: the fence
    (2, 3, True),   # three groups, one corrupt: the smallest R whose vote names it (the simulator's rule too)
    (2, 4, False),  # a two-two split
    (3, 4, True),
    (63, 64, True),
])
def test_a_strict_majority_is_more_than_half_of_the_groups(count: int, total: int, names: bool) -> None:
    assert is_strict_majority(count, total) is names


def test_a_step_is_judged_once_every_group_reached_it_and_a_group_is_named_once() -> None:
    state = GroupVoteState()
    # group 2 has not reached step 20 yet: no verdict on step 20
    got, state = decide_group_sdc(_groups({10: "a", 20: "b"}, {10: "a", 20: "X"}, {10: "a"}), state, POLICY, now=1.0)
    assert got == [] and state.agreed == {0: 10}
    got, state = decide_group_sdc(_groups({10: "a", 20: "b"}, {10: "a", 20: "X"}, {10: "a", 20: "b"}), state, POLICY, now=2.0)
    assert [v.pod_index for v in got] == [1]
    # group 1 still differs at the next check: not named again in this attempt
    got, state = decide_group_sdc(_groups({20: "b", 30: "c"}, {20: "X", 30: "Z"}, {20: "b", 30: "c"}), state, POLICY, now=3.0)
    assert got == []


def test_report_only_names_without_restart_or_quarantine() -> None:
    policy = dataclasses.replace(POLICY, sdc_action=Action.REPORT)
    (v,), _ = decide_group_sdc(_groups({10: "a"}, {10: "X"}, {10: "a"}), GroupVoteState(), policy, now=1.0)
    assert v.action is Action.REPORT and not v.quarantine_node


# --------------------------------------------------------------------------- through the store

LAYOUT = GroupLayout(replicas=3, pods_per_group=1, pp=1, dp=6, tp=1)


def _batch(pod: int, step: int, fingerprint: str, *, attempt: int = 0) -> HeartbeatBatch:
    beats = tuple(RankBeat(rank=r, step=step, step_time_s=0.1, fingerprint_step=step, fingerprint=f"{fingerprint}{r}") for r in range(2))
    return HeartbeatBatch(JOB, attempt, pod, f"node-{pod}", 0.0, beats)


def test_the_store_keys_fingerprints_by_group_and_slot_and_the_health_decision_names_the_group() -> None:
    store = HeartbeatStore()
    store.begin_attempt(NS, JOB, 0, layout=LAYOUT)
    for pod, fp in ((0, "aa"), (1, "aa"), (2, "aa")):
        store.ingest(NS, JOB, _batch(pod, 10, fp), now=1.0)
    for pod, fp in ((0, "bb"), (1, "XX"), (2, "bb")):
        store.ingest(NS, JOB, _batch(pod, 20, fp), now=2.0)
    window = store.job(NS, JOB)
    assert window is not None
    pods = {i: PodStatus(i, "Running", f"node-{i}", 0.0) for i in range(3)}
    d = decide_health(window, pods, HealthState(), POLICY, now=3.0, fingerprints=window.rank_signals())
    (v,) = [v for v in d.verdicts if v.kind is FaultKind.SDC]
    assert (v.pod_index, v.node, v.rank) == (1, "node-1", 2), "group 1's rank 0 is job rank 2"
    assert d.restart and d.quarantine_nodes == ("node-1",)
    # without a layout (one world) the vote is not run
    assert not [v for v in decide_health(window, pods, HealthState(), POLICY, now=3.0).verdicts if v.kind is FaultKind.SDC]


def test_fingerprints_travel_in_heartbeats_and_are_checked() -> None:
    b = _batch(0, 7, "0123456789abcdef")
    back = parse_heartbeat(b.to_json())
    assert back.ranks[0].fingerprint_step == 7 and back.ranks[0].fingerprint == "0123456789abcdef0"
    raw = {"job": JOB, "attempt": 0, "pod_index": 0, "sent_at": 0.0,
           "ranks": [{"rank": 0, "step": 1, "step_time_s": 0.1, "waiting_for_groups": True}]}
    assert heartbeat_from_dict(raw).ranks[0].waiting_for_groups is True
    old = {**raw, "ranks": [{"rank": 0, "step": 1, "step_time_s": 0.1}]}
    beat = heartbeat_from_dict(old).ranks[0]
    assert (beat.fingerprint_step, beat.fingerprint, beat.waiting_for_groups) == (-1, "", False), "older senders stay valid"
    with pytest.raises(HeartbeatError, match=r"ranks\[0\]\.fingerprint: 65 characters"):
        heartbeat_from_dict({**raw, "ranks": [{"rank": 0, "step": 1, "step_time_s": 0.1, "fingerprint": "f" * 65}]})
    with pytest.raises(HeartbeatError, match=r"ranks\[0\]\.fingerprint_step"):
        heartbeat_from_dict({**raw, "ranks": [{"rank": 0, "step": 1, "step_time_s": 0.1, "fingerprint_step": -2}]})


# --------------------------------------------------------------------------- a hang in one group


@dataclasses.dataclass(frozen=True)
class _Stalled:
    rank: int
    pod_index: int
    waiting_for_groups: bool
    node: str = ""
    step: int = 30
    last_seen_at: float = 100.0
    step_advanced_at: float = 50.0
    saving: bool = False
    last_saving_at: float = float("-inf")
    progress: bool = True
    last_waiting_at: float = float("-inf")

    def recent_compute(self, n: int) -> list[float]:
        return []


@pytest.mark.parametrize(
    ("waiting", "hung_pods"),
    [
        pytest.param({0: True, 1: False, 2: True}, [1], id="group-1-hung-the-others-wait-for-it"),
        pytest.param({0: True, 1: True, 2: True}, [], id="all-wait-for-the-quorum-the-watchdog-ends-that"),
        pytest.param({0: False, 1: False, 2: False}, [0, 1, 2], id="one-world-or-old-trainer-as-before"),
        pytest.param({0: True, 1: True, 2: "saving"}, [], id="they-wait-for-a-group-that-saves"),
        pytest.param({0: True, 1: True, 2: "training"}, [], id="they-wait-for-a-group-still-training"),
        pytest.param({0: True, 1: True, 2: "restarting"}, [], id="they-wait-for-a-group-whose-workers-restart"),
        pytest.param({0: True, 1: True, 2: "no-progress-yet"}, [], id="they-wait-for-a-group-not-at-its-first-step"),
        pytest.param({0: "one-waits", 1: True, 2: False}, [2], id="a-rank-held-up-by-its-waiting-group-mate-is-excused"),
    ],
)
def test_a_hang_names_only_the_group_where_no_rank_waits_for_the_others(waiting: dict[int, bool | str], hung_pods: list[int]) -> None:
    ranks = [_Stalled(rank=2 * p + r, pod_index=p, waiting_for_groups=w is True or (w == "one-waits" and r == 1), saving=w == "saving",
                      progress=w != "no-progress-yet", step_advanced_at=99.0 if w == "training" else 50.0)
             for p, w in waiting.items() for r in range(2) if w != "restarting"]
    pods = {p: PodStatus(p, "Running", f"node-{p}", 0.0) for p in waiting}
    verdicts = decide_hung_ranks(ranks, pods, 10.0, POLICY, now=100.0, group_of=lambda pod: pod)
    assert [v.pod_index for v in verdicts] == hung_pods
    assert all(v.kind is FaultKind.HANG for v in verdicts)


@pytest.mark.parametrize(
    ("rank0_waited_ago", "hung_pods"),
    [
        pytest.param(2.0, [], id="released-2s-ago-training-its-step"),
        pytest.param(9.9, [], id="released-just-within-the-hang-timeout"),
        pytest.param(10.0, [0], id="stuck-a-hang-timeout-after-its-wait-ended"),
        pytest.param(None, [0], id="never-waited-judged-from-its-last-step"),
    ],
)
def test_a_group_released_from_the_exchange_is_judged_from_the_end_of_its_wait(rank0_waited_ago: float | None, hung_pods: list[int]) -> None:
    """Group 0 stood at step 30 from t=50 while a peer group hung (its rank 0 in the exchange,
    its rank 1 held up by rank 0); the quorum formed without the hung group and released it,
    and at t=100 it trains its step, no longer waiting. The hang timeout (10 s) counts from
    the group's last beat that said it waited, for both its ranks: the one that waited and the
    group-mate it held up, which never said so itself."""
    waited = float("-inf") if rank0_waited_ago is None else 100.0 - rank0_waited_ago
    ranks = [_Stalled(rank=0, pod_index=0, waiting_for_groups=False, last_waiting_at=waited),
             _Stalled(rank=1, pod_index=0, waiting_for_groups=False)]
    pods = {0: PodStatus(0, "Running", "node-0", 0.0)}
    verdicts = decide_hung_ranks(ranks, pods, 10.0, POLICY, now=100.0, group_of=lambda pod: pod)
    assert [v.pod_index for v in verdicts] == hung_pods
    assert all(v.fault_at == max(50.0, waited) for v in verdicts), "the stall is dated from the end of the wait"


def test_the_store_remembers_when_a_rank_last_waited_for_the_groups() -> None:
    store = HeartbeatStore()
    for now, waiting in ((1.0, False), (2.0, True), (3.0, True), (4.0, False)):
        beat = RankBeat(rank=0, step=7, step_time_s=0.1, waiting_for_groups=waiting)
        store.ingest("ns", "j", HeartbeatBatch("j", 0, 0, "n0", 0.0, (beat,)), now)
    jw = store.job("ns", "j")
    assert jw is not None
    (rw,) = jw.ranks.values()
    assert (rw.waiting_for_groups, rw.last_waiting_at, rw.step_advanced_at) == (False, 3.0, 1.0)


# --------------------------------------------------------------------------- restoring after a tie


def test_the_restore_hint_carries_the_bound() -> None:
    from railyard.api.trainingjob import CheckpointRef, TrainingJobSpec, TrainingJobStatus

    st = TrainingJobStatus(step=23, checkpoints=[CheckpointRef(step=20, tier="memory"), CheckpointRef(step=10, tier="shared")])
    spec = TrainingJobSpec.model_validate({"image": "x", "nodes": 2})
    assert restore_hint(st, spec, pods_kept=True) == {"tier": "memory", "step": 20, "lastStep": 23}
    fence = CheckpointFence(step=15, attempt=4)
    assert restore_hint(st, spec, pods_kept=True, fence=fence) == {"tier": "shared", "step": 10, "lastStep": 23, "notAfter": 15, "abandonedBefore": 4}
    assert restore_hint(st, spec, pods_kept=True, fence=CheckpointFence(step=5, attempt=4)) == {
        "tier": "", "step": -1, "lastStep": 23, "notAfter": 5, "abandonedBefore": 4}


def test_a_fence_stays_up_for_every_later_restart_full_ones_included() -> None:
    """No majority among the groups after step 15: the restart to attempt 4 puts up the fence
    (status.checkpointFence), and drops the checkpoints after step 15 from the status. Every
    later hint carries it, a full restart's (a new gang, no pod kept) too, while the status
    lists the checkpoints attempt 4 and later save."""
    from railyard.api.trainingjob import CheckpointRef, TrainingJobSpec, TrainingJobStatus
    from railyard.logic.failures import build_verdict_failure
    from railyard.logic.restarts import new_fence, restart_update

    spec = TrainingJobSpec.model_validate({"image": "x", "nodes": 2})
    st = TrainingJobStatus(attempt=3, step=23, checkpoints=[CheckpointRef(step=20, tier="memory"), CheckpointRef(step=10, tier="shared")],
                           last_checkpoint=CheckpointRef(step=20, tier="memory"))
    failure = build_verdict_failure("SDC", "no majority", (), restore_not_after=15)
    assert failure is not None and new_fence(failure, 4) == CheckpointFence(step=15, attempt=4)
    st = st.model_copy(update=restart_update(st, failure, attempt=4, now=0.0, now_iso="", backoff_s=0.0, quarantined=[], in_place=False))
    assert st.checkpoint_fence == CheckpointFence(step=15, attempt=4)
    assert [(r.tier, r.step) for r in st.checkpoints] == [("shared", 10)] and st.last_checkpoint == st.checkpoints[0]
    assert restore_hint(st, spec, pods_kept=False) == {"tier": "shared", "step": 10, "lastStep": 23, "notAfter": 15, "abandonedBefore": 4}
    # attempt 4 trains on from step 10 and saves step 20 again; a node failure then restarts in place
    st = st.model_copy(update={"checkpoints": [CheckpointRef(step=20, tier="memory"), CheckpointRef(step=10, tier="shared")]})
    other = build_verdict_failure("Dead", "silent", ("node-1",))
    assert other is not None and new_fence(other, 5) is None
    st = st.model_copy(update=restart_update(st, other, attempt=5, now=0.0, now_iso="", backoff_s=0.0, quarantined=[], in_place=True))
    assert st.checkpoint_fence == CheckpointFence(step=15, attempt=4), "a later restart keeps the fence"
    assert restore_hint(st, spec, pods_kept=True) == {"tier": "memory", "step": 20, "lastStep": 23, "notAfter": 15, "abandonedBefore": 4}
