"""The real launcher with the health package on: an injected bit flip ends the attempt with
SDC_DETECTED before the step's checkpoint, naming the rank; a clean run passes its checks."""

from __future__ import annotations

import pytest

from railyard.protocol.exitcodes import ExitCode

try:
    from trainer.launch import run_launcher
except ImportError:  # pragma: no cover - the trainer's test helpers are not importable
    run_launcher = None

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.skipif(run_launcher is None, reason="tests/trainer/launch.py missing")]

TWO = ["--nproc-per-node", "2"]
HEALTH_ON = {"RAILYARD_DISABLE_HEALTH": "0", "RAILYARD_LOG_ALL_RANKS": "1"}


@pytest.mark.parametrize(("target", "rank", "step"), [("grad", 0, 4), ("param", 1, 5)])
def test_an_injected_bitflip_ends_the_attempt_with_the_sdc_exit_code(tmp_path, target: str, rank: int, step: int) -> None:  # type: ignore[no-untyped-def]
    assert run_launcher is not None
    run = run_launcher(
        tmp_path, TWO, trainer={"steps": 8, "faults": [{"kind": "bitflip", "rank": rank, "step": step, "target": target}]},
        config={"health": {"sdc": {"intervalSteps": 3}}}, **HEALTH_ON,
    )
    assert run.code == ExitCode.SDC_DETECTED, run.explain()
    workers = run.of("launcher_exit")[0]["workers"]
    assert workers[str(rank)] == ExitCode.SDC_DETECTED, workers
    steps = {e["step"] for e in run.of("step")}
    assert step - 1 in steps and step + 1 not in steps, "training went on past the corrupted step"
