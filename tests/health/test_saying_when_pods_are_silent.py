"""Running pods the operator hears nothing from (issue 35): the Blind condition, as tables; and
the address a job's new pods are given."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from railyard.api.trainingjob import TrainingJobStatus
from railyard.logic.conditions import find_condition
from railyard.logic.health import HealthPolicy, PodStatus
from railyard.logic.health.address import (
    build_heartbeat_url,
    carried_heartbeat_base,
    decide_heartbeat_base,
    heartbeat_base_of,
)
from railyard.logic.health.silence import (
    HEARD,
    NO_GANG,
    SILENT,
    Silence,
    apply_silence,
    compute_silence_bound,
    decide_silence,
    format_ranges,
)
from railyard.logic.status import apply_phase

T0 = 1_767_225_600.0
ISO0, ISO1, ISO2 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"
URL = "http://railyard-operator.railyard-system.svc:8080/v1/heartbeats/ns/j"


@pytest.mark.parametrize(("timeout", "first", "bound"), [
    (10.0, 300.0, 30.0),          # the defaults: 30 s, well before the 300 s restart
    (5.0, 300.0, 30.0),           # never below the floor (a launcher on a loaded machine)
    (20.0, 300.0, 60.0),          # 3 heartbeat timeouts
    (120.0, 300.0, 150.0),        # at most half the first-heartbeat bound: before the restart
    (120.0, math.inf, 360.0),     # a job running its own program is never restarted for it
])
def test_the_bound_derives_from_the_heartbeat_timeout_and_stays_below_the_restart(timeout: float, first: float, bound: float) -> None:
    policy = HealthPolicy(heartbeat_timeout_s=timeout, first_heartbeat_timeout_s=first)
    assert compute_silence_bound(policy) == bound
    assert compute_silence_bound(policy) < first


def _pods(*phases: str, since: float = T0) -> dict[int, PodStatus]:
    return {i: PodStatus(i, ph, f"node-{i}", since if ph == "Running" else None) for i, ph in enumerate(phases)}


@dataclass(frozen=True)
class Row:
    name: str
    pods: dict[int, PodStatus]
    heard: frozenset[int]
    now: float
    blind: bool | None
    silent: tuple[int, ...] = ()
    watching_since: float = T0


R4 = ("Running",) * 4
ROWS = [
    Row("nobody heard, within the bound: too early", _pods(*R4), frozenset(), T0 + 29, None),
    Row("nobody heard past the bound: blind", _pods(*R4), frozenset(), T0 + 30, True, (0, 1, 2, 3)),
    Row("some heard past the bound: blind, naming the rest", _pods(*R4), frozenset({0, 2}), T0 + 45, True, (1, 3)),
    Row("every Running pod heard", _pods(*R4), frozenset({0, 1, 2, 3}), T0 + 45, False),
    Row("heard before the bound", _pods(*R4), frozenset({0, 1, 2, 3}), T0 + 1, False),
    Row("pods not Running are not judged", _pods("Running", "Pending"), frozenset({0}), T0 + 99, False),
    Row("no pod Running: nothing to say", _pods("Pending", "Pending"), frozenset(), T0 + 99, None),
    Row("the clock starts when the last pod started", {0: PodStatus(0, "Running", "a", T0), 1: PodStatus(1, "Running", "b", T0 + 20)},
        frozenset(), T0 + 45, None),
    Row("a restarted operator gives the pods a whole bound", _pods(*R4), frozenset(), T0 + 300, None, (), T0 + 290),
    Row("... and then says so", _pods(*R4), frozenset({1}), T0 + 321, True, (0, 2, 3), T0 + 290),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_decide_silence(row: Row) -> None:
    s = decide_silence(row.pods, row.heard, bound_s=30.0, watching_since=row.watching_since, now=row.now)
    assert s.blind is row.blind
    assert s.silent == row.silent
    assert (s.reason == SILENT) == (row.blind is True) and (s.reason == HEARD) == (row.blind is False)


def test_the_message_names_the_pods_ranks_address_and_fix() -> None:
    ranks = {i: list(range(8 * i, 8 * i + 8)) for i in range(4)}
    s = decide_silence(_pods(*R4), {1}, bound_s=30.0, watching_since=T0, now=T0 + 40, ranks_of=ranks, pods_url=URL, operator_url=URL)
    assert s.message.startswith("3/4 Running pods (pod 0, 2-3; ranks 0-7, 16-31) sent no heartbeat and no launcher report within 30s")
    assert f"cannot reach the operator at {URL}" in s.message and "--heartbeat-advertise-url" in s.message
    assert "NetworkPolicy" in s.message
    later = decide_silence(_pods(*R4), {1}, bound_s=30.0, watching_since=T0, now=T0 + 90, ranks_of=ranks, pods_url=URL, operator_url=URL)
    assert later.message == s.message, "no elapsed time in it: no status write per cycle"


def test_the_message_says_when_the_operator_advertises_another_address_than_the_pods_use() -> None:
    mine = "http://127.0.0.1:41234/v1/heartbeats/ns/j"
    s = decide_silence(_pods(*R4), set(), bound_s=30.0, watching_since=T0, now=T0 + 40, pods_url=URL, operator_url=mine)
    assert f"at {URL}" in s.message and f"this operator advertises {mine} instead" in s.message


@pytest.mark.parametrize(("values", "text"), [
    ([], ""), ([3], "3"), ([0, 1, 2, 3, 8, 9, 12], "0-3, 8-9, 12"), ([5, 1, 2, 1], "1-2, 5"),
    (list(range(0, 40, 2)), "0, 2, 4, 6, 8, 10, 12, 14, and 12 more"),
])
def test_format_ranges(values: list[int], text: str) -> None:
    assert format_ranges(values) == text


def _running() -> TrainingJobStatus:
    return apply_phase(TrainingJobStatus(), "Running", reason="AllPodsRunning", message="", now=ISO0)


BLIND = Silence(True, silent=(1,), running=2, reason=SILENT, message="1/2 Running pods ...")
HEARD_ALL = Silence(False, running=2, reason=HEARD, message="all 2 Running pods reached the operator")


def test_the_condition_appears_when_blind_with_a_warning_and_clears_with_a_normal_event() -> None:
    st, ev = apply_silence(_running(), HEARD_ALL, now=ISO0)
    assert find_condition(st.conditions, "Blind") is None and ev is None, "a healthy job never shows it"
    st, ev = apply_silence(st, Silence(None), now=ISO0)
    assert find_condition(st.conditions, "Blind") is None and ev is None
    st, ev = apply_silence(st, BLIND, now=ISO1)
    c = find_condition(st.conditions, "Blind")
    assert c is not None and (c.status, c.reason, c.last_transition_time) == ("True", SILENT, ISO1)
    assert ev == ("Warning", SILENT, BLIND.message)
    again, ev = apply_silence(st, BLIND, now=ISO2)
    assert again is st and ev is None, "the same judgement writes nothing"
    kept, ev = apply_silence(st, Silence(None), now=ISO2)
    assert kept is st and ev is None, "too early to say again (a new attempt): keep it"
    st, ev = apply_silence(st, HEARD_ALL, now=ISO2)
    c = find_condition(st.conditions, "Blind")
    assert c is not None and (c.status, c.reason, c.last_transition_time) == ("False", HEARD, ISO2)
    assert ev == ("Normal", HEARD, HEARD_ALL.message)


@pytest.mark.parametrize(("phase", "cleared"), [
    ("Running", False), ("Starting", False), ("Restarting", False),
    ("Succeeded", True), ("Failed", True), ("Suspended", True), ("Placing", True),
])
def test_a_job_without_a_gang_is_not_blind_and_says_nothing_about_it(phase: str, cleared: bool) -> None:
    st, _ = apply_silence(_running(), BLIND, now=ISO1)
    st = apply_phase(st, phase, reason="R", message="", now=ISO2)
    after, ev = apply_silence(st, None, now=ISO2)
    c = find_condition(after.conditions, "Blind")
    assert c is not None and c.status == ("False" if cleared else "True") and ev is None
    if cleared:
        assert c.reason == NO_GANG


# --------------------------------------------------------------------------- the address


def _pod(attempt: int, url: str | None) -> dict[str, object]:
    env = [{"name": "RAILYARD_HEARTBEAT_URL", "value": url}] if url is not None else []
    return {"metadata": {"labels": {"railyard.dev/attempt": str(attempt)}},
            "spec": {"containers": [{"name": "trainer", "env": env}]}}


@pytest.mark.parametrize(("advertised", "carried", "base"), [
    ("", "", "http://railyard-operator.railyard-system.svc:8080"),        # nothing known: the chart's Service
    ("", "http://127.0.0.1:41234", "http://127.0.0.1:41234"),             # restarted under pods: keep theirs
    ("http://10.0.0.5:9000", "http://127.0.0.1:41234", "http://10.0.0.5:9000"),  # an address given wins
    ("http://10.0.0.5:9000", "", "http://10.0.0.5:9000"),
])
def test_the_base_for_new_pods(advertised: str, carried: str, base: str) -> None:
    assert decide_heartbeat_base(advertised=advertised, carried=carried, metrics_port=8080) == base


def test_the_base_pods_carry_is_read_from_the_newest_attempt() -> None:
    pods = [_pod(0, "http://old:1/v1/heartbeats/ns/j"), _pod(2, "http://127.0.0.1:41234/v1/heartbeats/ns/j"), _pod(1, None)]
    assert carried_heartbeat_base(pods, "ns", "j") == "http://127.0.0.1:41234"
    assert carried_heartbeat_base([_pod(0, None)], "ns", "j") == ""
    assert heartbeat_base_of("http://custom/ingest/", "ns", "j") == "http://custom/ingest", "a user's own URL is kept whole"
    assert build_heartbeat_url("http://127.0.0.1:41234/", "ns", "j") == "http://127.0.0.1:41234/v1/heartbeats/ns/j"
