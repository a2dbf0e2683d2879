"""Where the checkpoint's background threads run (RAILYARD_CHECKPOINT_CPU): with ``idle`` (and
``auto``, the default, where the trainer may leave the idle class again, e.g. as root) the writer
thread and the threads of the checkpoint's own gloo group in Linux's idle class, lifted to nice 10
whenever training waits for them, runs a collective on their group, or a save overran its
interval, and back afterwards; with ``nice`` (and ``auto`` elsewhere) at nice 10, never lifted.
Training's own thread is left as it was."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

pytest.importorskip("torch")

import harness

from railyard_trainer.checkpoint.cpuclass import can_leave_idle_class, resolve_cpu_class

pytestmark = [
    pytest.mark.torch,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread scheduling is Linux's"),
]

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

IDLE = {"policy": os.SCHED_IDLE, "nice": 10}
NICE = {"policy": os.SCHED_OTHER, "nice": 10}


def test_auto_is_idle_only_where_the_idle_class_can_be_left_again() -> None:
    assert resolve_cpu_class("auto", lambda: True) == "idle"
    assert resolve_cpu_class("auto", lambda: False) == "nice"
    assert resolve_cpu_class("idle", lambda: False) == "idle"
    assert resolve_cpu_class("nice", lambda: True) == "nice"


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ckpt-cpu")
    harness.run(harness.cpu_class_scenario, 1, str(tmp))
    return json.loads((tmp / "result-cpu-rank0.json").read_text())


@pytest.mark.parametrize("name", ["default", "auto", "idle"])
def test_idle_class_threads_are_lifted_while_training_waits_and_after_an_overrun(
    observed: dict[str, Any], name: str
) -> None:
    if name != "idle" and not can_leave_idle_class():
        pytest.skip("this process may not leave the idle class: auto is nice here (the other test)")
    got = observed[name]
    assert got["class"] == "idle", got
    # The writer and at least one thread of the checkpoint group (gloo's), all in the idle class.
    assert len(got["at_rest"]) >= 2 and all(t == IDLE for t in got["at_rest"]), got
    assert got["training"] == {"policy": os.SCHED_OTHER, "nice": 0}, got
    assert got["while_waited"] == [NICE] * len(got["at_rest"]), got
    assert got["while_overdue"] == [NICE] * len(got["at_rest"]), got
    assert got["waited"] and got["drained"], got
    assert got["after"] == got["at_rest"] and not got["boosted_after"], got
    assert got["saved"] == [2, 4] and got["skipped"] == 1, got


@pytest.mark.parametrize("name", ["default", "auto", "nice"])
def test_the_nice_class_runs_them_at_nice_10_and_never_lifts_them(observed: dict[str, Any], name: str) -> None:
    if name != "nice" and can_leave_idle_class():
        pytest.skip("this process may leave the idle class: auto is idle here (the other test)")
    got = observed[name]
    assert got["class"] == "nice", got
    assert len(got["at_rest"]) >= 2 and all(t == NICE for t in got["at_rest"]), got
    assert "while_waited" not in got and got["after"] == got["at_rest"], got
    assert got["training"] == {"policy": os.SCHED_OTHER, "nice": 0}, got


def test_collectives_training_runs_on_the_checkpoint_group_are_never_left_to_idle_threads(
    tmp_path: Any,
) -> None:
    """The manager's start (learning the pods) and a restore are collectives on the checkpoint
    group that training waits for; gloo's threads do their work. In the idle class another load
    on the host could starve them (a 7-minute stall under CI's load, before): they are lifted for
    the whole call, and back in the idle class afterwards."""
    harness.run(harness.cpu_collectives_scenario, 1, str(tmp_path))
    got = json.loads((tmp_path / "result-cpu-collectives-rank0.json").read_text())
    assert len(got["at_rest"]) >= 2 and all(t == IDLE for t in got["at_rest"]), got
    assert got["waited"] and got["restored_step"] == 2, got
    for phase in ("start", "restore"):
        assert got[phase], f"no collective seen during {phase}: {got}"
        for threads in got[phase]:
            assert threads and all(t == NICE for t in threads), (phase, got)
    assert got["after"] == got["at_rest"], got
