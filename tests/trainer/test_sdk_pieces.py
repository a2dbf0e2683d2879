"""The bring-your-own-trainer pieces one at a time, without torch where they are torch-free: the
SDK's identity, tiers and restore point; its reporter's progress flag; the watchdog; how the
program runner classifies a program's end; how the launcher turns ``trainer.program`` or
torchrun-style arguments into worker command lines and environments."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from railyard.protocol.envexpand import expand
from railyard.protocol.exitcodes import ExitCode
from railyard.protocol.heartbeat import CheckpointEvent
from railyard.protocol.trainerconfig import Program
from railyard_trainer.config import ConfigError, TrainerConfig
from railyard_trainer.health.reporter import Reporter
from railyard_trainer.launch_plan import apply_overrides, check_program, expand_program
from railyard_trainer.launcher import build_parser
from railyard_trainer.sdk.session import Identity, Session
from railyard_trainer.worker_env import torchrun_env
from railyard_trainer.workers import worker_command

#: bounds that only catch hangs
DEADLINE_S = 60


def _run(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env)


# ---------------------------------------------------------------------- the SDK's session


def test_importing_the_sdk_imports_no_torch() -> None:
    out = _run("import sys, railyard_trainer.sdk, railyard_trainer.program, railyard_trainer.launcher; print('torch' in sys.modules)")
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_identity_is_read_from_torchruns_environment() -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "2", "RAILYARD_NODE_NAME": "n-2"}
    i = Identity.from_env(env)
    assert (i.rank, i.local_rank, i.world_size, i.procs_per_node, i.pod_index, i.node, i.mesh_shape) == (5, 1, 8, 2, 2, "n-2", (1, 8, 1))
    assert Identity.from_env({**env, "RAILYARD_POD_INDEX": "3", "RAILYARD_MESH_SHAPE": "2,2,2"}).pod_index == 3
    with pytest.raises(ConfigError, match="LOCAL_RANK: expected an integer"):
        Identity.from_env({**env, "LOCAL_RANK": "one"})
    with pytest.raises(ConfigError, match="RAILYARD_MESH_SHAPE"):
        Identity.from_env({**env, "RAILYARD_MESH_SHAPE": "2,2"})


def _session(tmp_path: Path, **config: Any) -> Session:
    env = {"RAILYARD_CHECKPOINT_MEMORY_DIR": str(tmp_path / "m"), "RAILYARD_CHECKPOINT_SHARED_DIR": str(tmp_path / "s")}
    cfg = TrainerConfig.from_dict({"job": "j", "checkpoint": {"memory": {"intervalSteps": 5}, "shared": {"intervalSteps": 20}}, **config})
    return Session(cfg, Identity(), env=env, speed_probe=False, watchdog=False)


def test_tiers_name_the_jobs_folders_and_their_schedule(tmp_path: Path) -> None:
    s = _session(tmp_path)
    t = s.tiers()
    assert (t["memory"].path, t["memory"].interval_steps, t["memory"].active) == (str(tmp_path / "m" / "j"), 5, True)
    assert (t["local"].path, t["local"].active) == ("", False), "no folder on this pod: the tier is off"
    assert [step for step in range(1, 41) if s.should_checkpoint(step)] == [5, 10, 15, 20, 25, 30, 35, 40]
    s.close()


def test_the_restore_point_is_the_operators_hint_until_something_is_loaded(tmp_path: Path) -> None:
    assert _session(tmp_path).restore_point() is None, "a fresh start"
    s = _session(tmp_path, attempt=2, restore={"tier": "memory", "step": 10})
    p = s.restore_point()
    assert p is not None and (p.step, p.tier, p.attempt, p.loaded) == (10, "memory", 2, False)


# ---------------------------------------------------------------------- heartbeats


class _Sender:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, msg: dict[str, Any]) -> bool:
        self.sent.append(json.loads(json.dumps(msg)))
        return True

    def close(self) -> None:
        pass


def _reporter() -> tuple[Reporter, _Sender]:
    r = Reporter(rank=3, local_rank=1, pod_index=1, node="n", job="j", namespace="ns", attempt=0, interval_s=1000.0)
    sender = _Sender()
    r.sender = sender  # type: ignore[assignment]
    return r, sender


def test_a_rank_opts_into_progress_with_its_first_reported_step() -> None:
    r, sender = _reporter()
    r.send(force=True)
    assert sender.sent[-1]["beat"]["progress"] is False, "alive, but its step means nothing yet"
    r.report_step(7, step_time_s=0.5, compute_s=0.1, loss=2.0, tokens_per_s=100.0)
    r.send(force=True)
    beat = sender.sent[-1]["beat"]
    assert (beat["progress"], beat["step"], beat["loss"], beat["recent_compute_s"]) == (True, 7, 2.0, [0.1])
    r.report_step(8, step_time_s=float("nan"), compute_s=float("inf"), loss=float("nan"))
    r.send(force=True)
    beat = sender.sent[-1]["beat"]
    assert (beat["step_time_s"], beat["compute_s"], beat["loss"], beat["recent_compute_s"]) == (0.0, 0.0, None, [])


def test_a_pause_says_saving_and_checkpoint_events_go_out_once() -> None:
    r, sender = _reporter()
    r.report_step(1, step_time_s=0.1)
    with r.paused():
        r.send(force=True)
    assert sender.sent[-1]["beat"]["saving"] is True, "the operator's hang rule skips a saving rank"
    r.note_checkpoint(CheckpointEvent(step=1, tier="memory", ok=True))
    r.note_restore("memory", 1)
    r.send(force=True)
    r.send(force=True)
    assert sender.sent[-2]["beat"]["saving"] is False
    assert [m.get("checkpoints") for m in sender.sent[-2:]] == [[{**sender.sent[-2]["checkpoints"][0]}], None]
    assert sender.sent[-2]["checkpoints"][0]["tier"] == "memory"
    assert sender.sent[-1]["restored_tier"] == "memory", "the restore point is repeated: a lost datagram loses nothing"


# ---------------------------------------------------------------------- the watchdog


def test_the_watchdog_ends_a_rank_whose_steps_stop_with_exit_76() -> None:
    code = """if True:
        import time
        from railyard_trainer.watchdog import Watchdog
        w = Watchdog(0.3, rank=0)
        w.start(first_step_factor=1.0)
        with w.paused():          # a long save: never a hang
            time.sleep(1.0)
        print("survived the pause", flush=True)
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline:
            time.sleep(0.05)      # no step reported any more
    """
    out = _run(code)
    assert out.returncode == ExitCode.HANG_OR_STRAGGLER, (out.returncode, out.stdout, out.stderr)
    assert out.stdout.splitlines()[0] == "survived the pause"
    assert json.loads(out.stdout.splitlines()[-1])["event"] == "hang_detected"


# ---------------------------------------------------------------------- the program runner


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("pass", 0),
        ("import sys; sys.exit(3)", 3),
        ("import sys; sys.exit('bad flag')", int(ExitCode.APPLICATION)),
        ("raise ValueError('boom')", int(ExitCode.APPLICATION)),
        ("from railyard_trainer.hooks import SDCDetected; raise SDCDetected('kat', rank=1, node='n', step=3)", int(ExitCode.SDC_DETECTED)),
        # an exception that names its exit code keeps it (the SDK's NoVerifiedCheckpoint: 77)
        ("class NoVerified(Exception):\n    exit_code = 77\nraise NoVerified('none')", int(ExitCode.NO_VERIFIED_CHECKPOINT)),
    ],
)
def test_a_programs_end_gets_the_exit_code_of_its_failure_class(tmp_path: Path, body: str, code: int) -> None:
    script = tmp_path / "prog.py"
    script.write_text(body + "\n")
    errors = tmp_path / "error.json"
    out = subprocess.run([sys.executable, "-m", "railyard_trainer.program", "script", str(script)], capture_output=True, text=True,
                         timeout=DEADLINE_S, env={"PATH": "/usr/bin:/bin", "RANK": "1", "RAILYARD_WORKER_ERROR_FILE": str(errors)})
    assert out.returncode == code, out.stderr
    if body.startswith("raise") or "raise " in body:
        assert json.loads(errors.read_text())["code"] == code, "its last words, for the pod's termination message"


def test_a_script_runs_as_python_would_run_it(tmp_path: Path) -> None:
    (tmp_path / "helper.py").write_text("VALUE = 42\n")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import helper  # the script's folder comes first on the path, as with `python train.py`
        print(json.dumps({"name": __name__, "argv": sys.argv, "value": helper.VALUE}))
    """))
    out = subprocess.run([sys.executable, "-m", "railyard_trainer.program", "script", str(script), "--steps", "3"],
                         capture_output=True, text=True, timeout=DEADLINE_S, cwd="/")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"name": "__main__", "argv": [str(script), "--steps", "3"], "value": 42}


# ---------------------------------------------------------------------- the launcher


@pytest.mark.parametrize(
    ("argv", "program"),
    [
        (["train.py", "--lr", "1e-3"], Program(script="train.py", args=("--lr", "1e-3"))),
        (["-m", "pkg.train", "--steps", "5"], Program(module="pkg.train", args=("--steps", "5"))),
        (["--no-python", "./run.sh", "x"], Program(command=("./run.sh",), args=("x",))),
        ([], None),
    ],
)
def test_torchrun_style_arguments_name_the_program(argv: list[str], program: Program | None) -> None:
    args = build_parser().parse_args(["--nproc-per-node", "2", *argv])
    assert apply_overrides(TrainerConfig(), args, {}).trainer.program == program


def test_what_is_wrong_with_a_program_is_said_before_any_worker_starts(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    assert check_program(Program(script="train.py"), cwd=str(tmp_path)) == []
    assert check_program(Program(script="nope.py"), cwd=str(tmp_path)) == [
        f"trainer.program.script: nope.py is not a file in the image (working directory {tmp_path})"]
    assert check_program(Program(module="pkg.9train"), cwd=str(tmp_path))[0].startswith("trainer.program.module:")
    assert check_program(Program(command=("no-such-binary-here",)), cwd=str(tmp_path))[0].startswith("trainer.program.command:")
    assert check_program(Program(command=("true",)), cwd=str(tmp_path)) == []


def test_program_arguments_are_expanded_as_the_kubelet_expands_a_containers() -> None:
    env = {"RAILYARD_CHECKPOINT_SHARED_DIR": "/ckpt/shared"}
    p = expand_program(Program(script="t.py", args=("--dir", "$(RAILYARD_CHECKPOINT_SHARED_DIR)/run", "$$(HOME)", "$(UNSET)")), env)
    assert p.args == ("--dir", "/ckpt/shared/run", "$(HOME)", "$(UNSET)")
    assert expand("a$", {}) == "a$" and expand("$(A", {"A": "x"}) == "$(A"


def test_each_kind_of_program_becomes_one_worker_command_line(tmp_path: Path) -> None:
    def cmd(p: Program | None) -> list[str]:
        return worker_command(TrainerConfig().with_overrides(program=p), cwd=str(tmp_path))

    assert cmd(None)[1:] == ["-m", "railyard_trainer.worker"]
    assert cmd(Program(script="t.py", args=("-x",)))[1:] == ["-u", "-m", "railyard_trainer.program", "script", str(tmp_path / "t.py"), "-x"]
    assert cmd(Program(module="pkg.t"))[1:] == ["-u", "-m", "railyard_trainer.program", "module", "pkg.t"]
    assert cmd(Program(command=("./run.sh", "--fast"), args=("-x",))) == ["./run.sh", "--fast", "-x"]


def test_workers_get_torchruns_whole_environment() -> None:
    env = torchrun_env(pods=4, attempt=2, run_id="llm")
    assert env == {"GROUP_WORLD_SIZE": "4", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "llm",
                   "TORCHELASTIC_USE_AGENT_STORE": "False", "RAILYARD_ATTEMPT": "2"}
