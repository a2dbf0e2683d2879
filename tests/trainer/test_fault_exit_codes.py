"""Each injected fault produces its documented exit code, and the launcher reports it (a bit flip
the health package catches, SDC_DETECTED: tests/health/test_trainer_catches_injected_bitflips.py)."""

from __future__ import annotations

import pytest

from railyard.protocol.exitcodes import ExitCode

from .launch import run_launcher

pytestmark = pytest.mark.torch

TWO = ["--nproc-per-node", "2"]


def test_crash_is_an_application_error_and_peers_see_infrastructure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    last_words = tmp_path / "termination-log"
    run = run_launcher(tmp_path, TWO, trainer={"steps": 5, "faults": [{"kind": "crash", "rank": 1, "step": 3}]},
                       RAILYARD_TERMINATION_LOG=str(last_words))
    assert run.code == ExitCode.APPLICATION, run.explain()
    # the pod's termination message names the crashed rank and ends with its exception
    message = last_words.read_text()
    assert message.startswith("rank 1 exited with code 1 (Application) first"), message
    assert message.rstrip().endswith("injected crash on rank 1 at step 3"), message
    workers = run.of("launcher_exit")[0]["workers"]
    assert workers["1"] == ExitCode.APPLICATION
    # The survivor either saw the broken connection itself or was stopped by the launcher.
    assert workers["0"] in (ExitCode.INFRASTRUCTURE, 128 + 15)
    assert run.of("fault", kind="crash", rank=1, step=3)
    assert max(run.losses()) == 2


def test_hang_is_reported_by_the_watchdog_well_before_the_collective_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = run_launcher(tmp_path, TWO, trainer={"steps": 6, "watchdogSeconds": 3, "collectiveTimeoutSeconds": 60,
                                               "faults": [{"kind": "hang", "rank": 0, "step": 3}]})
    assert run.code == ExitCode.HANG_OR_STRAGGLER, run.explain()
    hangs = run.of("hang_detected")
    assert hangs and all(h["idle_s"] < 20 for h in hangs)
    assert run.of("fault", kind="hang", rank=0, step=3)


def test_slow_and_bitflips_are_injected_into_real_tensors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Without the health package nothing detects the flips: the run finishes (exit 0) and the
    # corruption is visible in the logs; SDC_DETECTED is the health package's verdict.
    run = run_launcher(tmp_path, TWO, trainer={"steps": 6, "gradClip": 0.0, "faults": [
        {"kind": "slow", "rank": 1, "step": 2, "factor": 4.0},
        {"kind": "bitflip", "rank": 0, "step": 4, "target": "grad"},
        {"kind": "bitflip", "rank": 1, "step": 5, "target": "param"},
    ]}, RAILYARD_LOG_ALL_RANKS="1")
    assert run.code == 0, run.explain()

    compute = {(e["rank"], e["step"]): e["compute_s"] for e in run.of("step")}
    assert compute[(1, 1)] < compute[(0, 1)] * 2  # not slow before step 2
    for step in range(3, 7):
        assert compute[(1, step)] > 2.5 * compute[(0, step)], (step, compute)

    (grad_flip,) = run.of("fault", kind="bitflip", target="grad")
    assert grad_flip["rank"] == 0 and grad_flip["step"] == 4 and grad_flip["tensor"].startswith("layers.")
    assert abs(grad_flip["after"]) > 1e30 > abs(grad_flip["before"])
    norms = {e["step"]: e["grad_norm"] for e in run.of("step", rank=0)}
    assert float(norms[4]) > 1e30 and float(norms[3]) < 10  # the global grad norm saw it (may be "inf")

    (param_flip,) = run.of("fault", kind="bitflip", target="param")
    assert param_flip["rank"] == 1 and abs(param_flip["after"]) > 1e30


def test_bad_layout_is_a_permanent_configuration_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Caught by the launcher before any worker starts: tp=2 does not divide 3 processes.
    run = run_launcher(tmp_path / "launcher", ["--nproc-per-node", "3", "--tp", "2"], RAILYARD_TERMINATION_LOG=str(tmp_path / "last-words"))
    assert run.code == ExitCode.CONFIG_PERMANENT, run.explain()
    assert "parallelism" in run.of("launcher_exit")[0]["error"]
    assert (tmp_path / "last-words").read_text().startswith("configuration error (exit code 64): ")
    # Caught by the workers: Interleaved1F1B needs a multiple of pp microbatches.
    run = run_launcher(tmp_path / "workers", [*TWO, "--pp", "2", "--schedule", "Interleaved1F1B", "--microbatches", "3"],
                       trainer={"batchSize": 6})
    assert run.code == ExitCode.CONFIG_PERMANENT, run.explain()
    assert all("parallelism.microbatches" in e["error"] for e in run.of("worker_failed"))


@pytest.mark.parametrize("name", ["RAILYARD_FAIL_GRACE_S", "RAILYARD_KILL_GRACE_S", "RAILYARD_RESTART_KILL_GRACE_S"])
def test_a_bad_time_setting_is_a_configuration_error_that_names_it(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Before any worker starts, not a traceback halfway through an attempt.
    run = run_launcher(tmp_path, TWO, **{name: "soon"}, RAILYARD_TERMINATION_LOG=str(tmp_path / "last-words"))
    assert run.code == ExitCode.CONFIG_PERMANENT, run.explain()
    assert not run.of("workers_started"), run.explain()
    assert f"{name}: expected a number of seconds >= 0, got 'soon'" in run.of("launcher_exit")[0]["error"]
    assert name in (tmp_path / "last-words").read_text()


def test_sigterm_is_forwarded_and_reported_as_143(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import signal
    import time

    from .launch import BASE_TRAINER, launcher_env, start_launcher

    proc = start_launcher(tmp_path, TWO, {"job": "t", "trainer": {**BASE_TRAINER, "steps": 100000}}, launcher_env())
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    seen_step = False
    while time.monotonic() < deadline and not seen_step:
        line = proc.stdout.readline()
        if not line:
            break
        seen_step = line.startswith('{"event":"step"')
    assert seen_step, proc.stderr.read() if proc.stderr else ""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    final = [json.loads(x) for x in out.splitlines() if x.startswith('{"event":"launcher_exit"')]
    assert final and set(final[0]["workers"].values()) == {128 + signal.SIGTERM}
