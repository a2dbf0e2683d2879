"""Unit tests for the fixes the end-to-end runs needed in failure classification: exit 70 is an
echo (a peer or a collective failed), so it never outranks the cause, and the operator waits a
moment for the cause to show before it decides."""

from __future__ import annotations

from typing import Any

from tests.operator.builders import make_node, make_pod

from railyard.logic.conditions import format_micro_time
from railyard.logic.failures import decide_root_failure
from railyard.logic.gang import assess_gang
from railyard.protocol.exitcodes import ExitCode, FailureClass

T0 = 1_800_000_000.0


def _exited(index: int, code: int, at: float) -> dict[str, Any]:
    pod = make_pod(index=index, node=f"node-{index}").exited(code).obj()
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = format_micro_time(at)
    return pod


NODES = {f"node-{i}": make_node(f"node-{i}") for i in range(3)}


def test_a_crash_explains_its_peers_exit_70() -> None:
    pods = [_exited(0, ExitCode.INFRASTRUCTURE, T0), _exited(1, 1, T0 + 1)]
    a = assess_gang(pods, NODES, attempt=0, expected=2, now=T0 + 1.5, echo_settle_s=8)
    assert a.state == "Failed" and a.failure is not None
    assert a.failure.kind == "ApplicationExitCode" and a.failure.cls is FailureClass.APPLICATION


def test_an_echo_waits_for_the_cause_while_peers_still_run() -> None:
    pods = [_exited(0, ExitCode.INFRASTRUCTURE, T0), make_pod(index=1, node="node-1").obj()]
    early = assess_gang(pods, NODES, attempt=0, expected=2, now=T0 + 2, echo_settle_s=8)
    assert early.state == "Settling" and early.failure is None and 5.9 < early.recheck_after < 6.1
    late = assess_gang(pods, NODES, attempt=0, expected=2, now=T0 + 9, echo_settle_s=8)
    assert late.state == "Failed" and late.failure is not None and late.failure.kind == "InfrastructureExitCode"
    assert late.failure.nodes == (), "a collective error blames no node"


def test_a_cause_other_than_an_echo_is_decided_at_once() -> None:
    pods = [_exited(0, ExitCode.SDC_DETECTED, T0), make_pod(index=1, node="node-1").obj()]
    a = assess_gang(pods, NODES, attempt=0, expected=2, now=T0 + 0.1, echo_settle_s=8)
    assert a.state == "Failed" and a.failure is not None and a.failure.cls is FailureClass.SDC


def test_without_an_exit_time_or_a_settle_window_nothing_waits() -> None:
    no_time = [make_pod(index=0, node="node-0").exited(ExitCode.INFRASTRUCTURE).obj(), make_pod(index=1, node="node-1").obj()]
    assert assess_gang(no_time, NODES, attempt=0, expected=2, now=T0, echo_settle_s=8).state == "Failed"
    timed = [_exited(0, ExitCode.INFRASTRUCTURE, T0), make_pod(index=1, node="node-1").obj()]
    assert assess_gang(timed, NODES, attempt=0, expected=2, now=T0 + 1).state == "Failed"


def test_every_rule_outranks_the_echo() -> None:
    from railyard.logic.failures import RULES, build_failure

    echo = build_failure("InfrastructureExitCode", "70")
    for kind in RULES:
        if kind != "InfrastructureExitCode":
            root = decide_root_failure([echo, build_failure(kind, "x")])
            assert root is not None and root.kind == kind


def test_a_replay_tie_restarts_without_blaming_every_reporter() -> None:
    from railyard.logic.health.model import Action, FaultKind, HealthEvent, HealthPolicy
    from railyard.logic.health.sdc import decide_sdc
    from railyard.protocol.heartbeat import HealthResult

    tie = HealthResult("replay", ok=False, step=12, detail="grad norm is inf", suspect_rank=-1, confirmed=False)
    events = [HealthEvent(1, 0, 0, "node-0", 1.0, tie), HealthEvent(2, 1, 1, "node-1", 1.0, tie)]
    verdicts, _ = decide_sdc(events, 0, {0: ("node-0", 0), 1: ("node-1", 1)}, HealthPolicy(), now=2.0)
    [v] = verdicts
    assert v.kind is FaultKind.SDC and v.action is Action.RESTART
    assert v.node == "" and not v.quarantine_node


def test_an_echo_waits_for_a_not_ready_node_in_its_grace_and_the_node_is_the_cause() -> None:
    from railyard.logic.conditions import format_time

    nodes = {**NODES, "node-1": make_node("node-1", ready=False, since=format_time(T0))}
    # the dead node's pod was reported Failed by nobody (or by a simulated agent); its peer
    # noticed the broken collective and exited 70 before the node's grace ran out
    pods = [_exited(0, ExitCode.INFRASTRUCTURE, T0 + 0.5), make_pod(index=1, node="node-1").obj()]
    early = assess_gang(pods, nodes, attempt=0, expected=2, now=T0 + 1, not_ready_grace_s=2, echo_settle_s=0)
    assert early.state == "Settling" and early.failure is None and 0.9 < early.recheck_after < 1.1
    late = assess_gang(pods, nodes, attempt=0, expected=2, now=T0 + 2.5, not_ready_grace_s=2, echo_settle_s=0)
    assert late.state == "Failed" and late.failure is not None
    assert late.failure.kind == "NodeNotReady" and late.failure.nodes == ("node-1",)
