"""Conditions keep lastTransitionTime unless they flip; phases imply conditions; one patch."""

from __future__ import annotations

from railyard.api.trainingjob import TrainingJobStatus
from railyard.logic.conditions import format_time, parse_time, set_condition
from railyard.logic.status import (
    PHASE_CONDITIONS,
    apply_phase,
    build_placement_status,
    build_status_patch,
    build_transition_events,
    status_to_wire,
)

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z", "2026-01-01T00:00:09Z"


def _cond(st: TrainingJobStatus, ctype: str):  # type: ignore[no-untyped-def]
    return next(c for c in st.conditions if c.type == ctype)


def test_last_transition_time_changes_only_with_the_status() -> None:
    cs = set_condition([], "Running", "True", reason="A", message="m", now=T0)
    cs = set_condition(cs, "Running", "True", reason="B", message="n", now=T1)
    assert cs[0].last_transition_time == T0 and cs[0].reason == "B"
    cs = set_condition(cs, "Running", "False", reason="C", message="", now=T2)
    assert cs[0].last_transition_time == T2


def test_each_phase_sets_the_conditions_it_implies() -> None:
    for phase, implied in PHASE_CONDITIONS.items():
        st = apply_phase(TrainingJobStatus(), phase, reason="R", message="msg", now=T0)
        assert st.phase == phase and st.message == "msg"
        for ctype, status in implied.items():
            assert _cond(st, ctype).status == status, (phase, ctype)
        assert _cond(st, next(iter(implied))).reason == "R"


def test_terminal_phase_records_completion_once() -> None:
    st = apply_phase(TrainingJobStatus(), "Failed", reason="X", message="", now=T0)
    st = apply_phase(st, "Failed", reason="X", message="", now=T1)
    assert st.completion_time == T0


def test_a_restart_cycle_flips_running_and_restarting() -> None:
    st = apply_phase(TrainingJobStatus(), "Running", reason="AllPodsRunning", message="", now=T0)
    st = apply_phase(st, "Restarting", reason="NodeNotReady", message="node-1 is NotReady", now=T1)
    assert _cond(st, "Running").status == "False" and _cond(st, "Restarting").status == "True"
    assert _cond(st, "Placed").last_transition_time == T0, "Placed did not flip"
    st = apply_phase(st, "Running", reason="AllPodsRunning", message="", now=T2)
    assert _cond(st, "Restarting").status == "False" and _cond(st, "Restarting").last_transition_time == T2


def test_events_one_per_phase_transition() -> None:
    a = apply_phase(TrainingJobStatus(), "Starting", reason="GangCreated", message="m1", now=T0)
    b = apply_phase(a, "Running", reason="AllPodsRunning", message="m2", now=T1)
    assert build_transition_events(a, b) == [("Normal", "AllPodsRunning", "m2")]
    assert build_transition_events(b, b) == []
    c = apply_phase(b, "Restarting", reason="NodeNotReady", message="m3", now=T2)
    assert build_transition_events(b, c) == [("Warning", "NodeNotReady", "m3")]
    p1 = apply_phase(TrainingJobStatus(), "Placing", reason="NotEnoughNodes", message="", now=T0)
    p2 = apply_phase(p1, "Placing", reason="NoDomainFits", message="", now=T1)
    assert [e[1] for e in build_transition_events(p1, p2)] == ["NoDomainFits"]


def test_status_patch_holds_only_what_changed() -> None:
    a = status_to_wire(apply_phase(TrainingJobStatus(), "Starting", reason="G", message="", now=T0))
    b = dict(a, attempt=3)
    assert build_status_patch(a, b) == {"attempt": 3}
    assert build_status_patch(a, a) == {}
    assert build_status_patch({"x": 1}, {}) == {"x": None}


def test_placement_summary_truncates_the_node_list_but_keeps_the_count() -> None:
    nodes = [f"n{i}" for i in range(100)]
    p = build_placement_status(nodes, attempt=3, domains={"railyard.dev/spine": 2}, cross_bytes_per_step={"railyard.dev/spine": 2e9})
    assert len(p.nodes) == 64 and p.node_count == 100 and "2 spine" in p.summary and "2.00 GB/step" in p.summary


def test_times_round_trip() -> None:
    assert parse_time(format_time(1_700_000_000.0)) == 1_700_000_000.0
    assert parse_time(None) is None and parse_time("garbage") is None


def test_micro_times_keep_sub_second_precision() -> None:
    from railyard.logic.conditions import format_micro_time

    assert parse_time(format_micro_time(1_700_000_000.25)) == 1_700_000_000.25
