"""Workers forked from the pod's zygote (railyard_trainer/zygote.py) behave as the subprocesses
they replace: their own environment, folder, session and exit code, signals that reach them, and
nothing left behind; commands that cannot be forked, or RAILYARD_WORKER_ZYGOTE=0, start plain
subprocesses. The preload here is a light module (the real one is torch: tests/trainer's launcher
runs cover it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.waiting import wait_until

from railyard_trainer.zygote import ForkedWorker, Spawner, preload_for, python_module_command

pytestmark = pytest.mark.timeout(120)

PROGRAM = """
import json, os, signal, sys, time
out = os.environ["OUT"]
info = {"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "cwd": os.getcwd(), "argv": sys.argv[1:],
        "rank": os.environ.get("RANK"), "leaked": os.environ.get("ONLY_IN_THE_LAUNCHER"),
        "preloaded": "colorsys" in sys.modules, "name": __name__,
        "comm": open("/proc/self/comm").read().strip(), "sigpipe": str(signal.getsignal(signal.SIGPIPE))}
with open(out + ".tmp", "w") as f:
    json.dump(info, f)
os.replace(out + ".tmp", out)
if sys.argv[1:] == ["wait"]:
    signal.pause()
sys.exit(int(os.environ.get("CODE", "0")))
"""


def _command(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-u", "-m", "railyard_trainer.program", "script", str(script), *args]


def _env(tmp_path: Path, name: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ONLY_IN_THE_LAUNCHER"}
    return {**env, "OUT": str(tmp_path / f"{name}.json"), **extra}


def _info(tmp_path: Path, name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((tmp_path / f"{name}.json").read_text())
    return data


def test_workers_are_forked_from_one_zygote_with_their_own_environment_and_exit_codes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    monkeypatch.chdir(tmp_path)
    spawner = Spawner({**os.environ, "ONLY_IN_THE_LAUNCHER": "yes"}, preload=("colorsys",))
    try:
        a = spawner.spawn(_command(script, "x", "y"), _env(tmp_path, "a", RANK="0", CODE="3"))
        b = spawner.spawn(_command(script), _env(tmp_path, "b", RANK="1"))
        assert isinstance(a, ForkedWorker) and isinstance(b, ForkedWorker)
        assert a.wait(60) == 3 and b.wait(60) == 0
        ia, ib = _info(tmp_path, "a"), _info(tmp_path, "b")
        zygote = spawner.zygote_pid
        # both forked from the same warm process, which had imported the preload
        assert ia["ppid"] == ib["ppid"] == zygote and ia["preloaded"] and ib["preloaded"]
        assert (ia["pid"], ib["pid"]) == (a.pid, b.pid)
        # each is its own session, runs as __main__ with its arguments, in the launcher's folder,
        # with exactly the environment it was given (not the zygote's)
        assert ia["sid"] == a.pid and ib["sid"] == b.pid
        assert ia["argv"] == ["x", "y"] and ia["name"] == "__main__" and ia["cwd"] == str(tmp_path)
        assert (ia["rank"], ib["rank"]) == ("0", "1") and ia["leaked"] is None
        assert (ia["comm"], ib["comm"]) == ("railyard-r0", "railyard-r1")  # what top shows
        # SIGPIPE ignored, as in a fresh interpreter: a peer's closed socket is an error, not death
        assert ia["sigpipe"] == str(signal.SIG_IGN)
        # the next generation (an in-place restart) forks from the same zygote
        c = spawner.spawn(_command(script), _env(tmp_path, "c", RANK="0"))
        assert c.wait(60) == 0 and _info(tmp_path, "c")["ppid"] == zygote
    finally:
        spawner.close()
    assert spawner.zygote_pid is None


def test_a_signal_reaches_the_forked_worker_and_its_end_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    spawner = Spawner(preload=("colorsys",))
    try:
        w = spawner.spawn(_command(script, "wait"), _env(tmp_path, "w"))
        # the worker wrote its info before it waits: then it is past its start-up
        wait_until((tmp_path / "w.json").exists, timeout=60, interval=0.02, message="the worker to start")
        assert w.poll() is None
        w.terminate()
        assert w.wait(60) == -signal.SIGTERM and w.returncode == -signal.SIGTERM
        w.kill()  # after its end: nothing to signal, no error
    finally:
        spawner.close()


def test_closing_the_spawner_kills_workers_still_running(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    spawner = Spawner(preload=("colorsys",))
    w = spawner.spawn(_command(script, "wait"), _env(tmp_path, "w"))
    wait_until((tmp_path / "w.json").exists, timeout=60, interval=0.02, message="the worker to start")
    spawner.close()
    assert w.wait(60) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(w.pid, 0)


def test_commands_that_cannot_be_forked_and_a_disabled_zygote_start_subprocesses(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    spawner = Spawner(preload=("colorsys",))
    try:
        plain = spawner.spawn([sys.executable, str(script)], _env(tmp_path, "plain", CODE="4"))
        assert isinstance(plain, subprocess.Popen) and plain.wait(60) == 4 and spawner.zygote_pid is None
    finally:
        spawner.close()
    off = Spawner({**os.environ, "RAILYARD_WORKER_ZYGOTE": "0"}, preload=("colorsys",))
    w = off.spawn(_command(script), _env(tmp_path, "off"))
    assert isinstance(w, subprocess.Popen) and w.wait(60) == 0 and off.zygote_pid is None


def test_which_commands_fork_and_what_they_preload() -> None:
    py = sys.executable
    assert python_module_command([py, "-m", "railyard_trainer.worker"]) == ("railyard_trainer.worker", [])
    assert python_module_command([py, "-u", "-m", "railyard_trainer.program", "script", "t.py", "--x"]) == (
        "railyard_trainer.program", ["script", "t.py", "--x"])
    assert python_module_command(["/other/python", "-m", "m"]) is None
    assert python_module_command([py, "t.py"]) is None and python_module_command(["torchrun", "t.py"]) is None
    assert "railyard_trainer.train" in preload_for([py, "-m", "railyard_trainer.worker"])
    assert "torch" in preload_for([py, "-u", "-m", "railyard_trainer.program", "script", "t.py"])
    assert preload_for(["bash", "-c", "true"]) == ()
