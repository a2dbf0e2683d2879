"""Workers forked from a warm process: torch is imported once per pod, not once per rank.

A worker's start is mostly ``import torch`` (with torch.distributed, DTensor and FSDP: about 2 s
of CPU), paid by every local rank of every attempt. The launcher instead starts one zygote per
pod (``python -m railyard_trainer.zygote``), which imports the modules the workers will need and
then forks one child per worker on request. Each child takes the worker's environment, working
folder and session, and runs the worker's ``python -m MODULE ARGS`` as ``python`` would; the
imports it would have done are already there (copy-on-write). An in-place restart of the next
attempt forks from the same zygote, so it pays no import at all.

Safe to fork: the zygote is single-threaded, has not initialised CUDA (it imports, never runs
anything) and holds no process group. It also dies with its launcher (``PR_SET_PDEATHSIG``),
and its workers with it. A worker command that is not ``python -m MODULE`` (a job's own
``trainer.program.command``) is started as a plain subprocess; so is every worker when
``RAILYARD_WORKER_ZYGOTE=0``.

The launcher's side is :class:`Spawner`, whose handles (:class:`ForkedWorker`) answer like
``subprocess.Popen``: ``pid``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``,
``returncode`` (negative: the signal that ended it). Between the two runs one socket of JSON
lines: ``{"spawn": id, "argv", "env", "cwd"}`` asks for a worker, ``{"spawned": id, "pid"}`` or
``{"spawned": id, "error"}`` answers, ``{"exited": pid, "returncode"}`` follows when it ends.
Torch-free on the launcher's side (this module imports torch only in the zygote's preload).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from railyard.protocol import podenv

#: Set to 0 to start every worker as a plain subprocess (each imports torch itself).
ZYGOTE_ENV = podenv.WORKER_ZYGOTE.name
#: What the bundled trainer's workers import (railyard_trainer.train pulls in torch,
#: torch.distributed, DTensor and FSDP2).
TRAINER_PRELOAD = ("railyard_trainer.train",)
#: What a job's own program most likely imports (its script decides the rest).
PROGRAM_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "railyard_trainer.sdk",
)
#: Bounds that only catch a broken zygote (its preload takes seconds).
SPAWN_TIMEOUT_S = 300.0


class WorkerProcess(Protocol):
    """What the launcher needs of a worker: ``subprocess.Popen``'s answers."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


def die_with_parent() -> None:
    """SIGKILL when the parent dies (Linux), so no orphan keeps a GPU."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _set_name(name: str) -> None:
    """The process's name (``comm``, 15 bytes) as ``top`` shows it (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def python_module_command(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(MODULE, ARGS)`` of ``python [-u] -m MODULE ARGS`` run by this interpreter, else None
    (only such a command can be forked from the zygote)."""
    if len(argv) < 3 or argv[0] != sys.executable:
        return None
    i = 1
    while i < len(argv) and argv[i] in ("-u",):
        i += 1
    if i + 1 >= len(argv) or argv[i] != "-m":
        return None
    return argv[i + 1], list(argv[i + 2:])


def preload_for(argv: Sequence[str]) -> tuple[str, ...]:
    cmd = python_module_command(argv)
    if cmd is None:
        return ()
    return TRAINER_PRELOAD if cmd[0] == "railyard_trainer.worker" else PROGRAM_PRELOAD


def spawn_ranks(
    fn: Callable[..., None],
    args: tuple[Any, ...],
    nprocs: int,
    *,
    preload: Sequence[str] = ("torch", "torch.distributed"),
) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)`` with the same idea for in-process
    multi-rank runs (the tests' and benchmarks'): the ranks are forked from a forkserver that
    imported ``preload`` and ``fn``'s module once for this process, instead of each importing
    torch again. ``fn`` must be a module-level function; the ranks get the forkserver's
    environment, so ``fn`` sets what its rank needs (as every caller here does)."""
    import multiprocessing

    import torch.multiprocessing as mp

    multiprocessing.set_forkserver_preload([*preload, fn.__module__])  # read when the server starts
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


# ---------------------------------------------------------------------------- launcher's side
class ForkedWorker:
    """A worker forked by the zygote, seen from the launcher (``subprocess.Popen``'s answers)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._returncode: int | None = None
        self._done = threading.Event()

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def _ended(self, returncode: int) -> None:
        if self._returncode is None:
            self._returncode = returncode
        self._done.set()

    def poll(self) -> int | None:
        return self._returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        assert self._returncode is not None
        return self._returncode

    def send_signal(self, sig: int) -> None:
        if self._returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class _Pending:
    done: threading.Event
    pid: int = 0
    error: str = ""


class Spawner:
    """Starts the pod's workers: forked from one zygote when the command allows, else as
    subprocesses. ``close()`` ends the zygote (its workers must have ended first)."""

    def __init__(self, env: Mapping[str, str] | None = None, *, preload: Sequence[str] | None = None) -> None:
        """``env``: the zygote's environment (what C libraries read at import, e.g.
        ``OMP_NUM_THREADS``); ``preload``: the modules to import instead of the command's
        default (:func:`preload_for`)."""
        self._env = dict(os.environ if env is None else env)
        self._preload_override = None if preload is None else tuple(preload)
        self.enabled = podenv.WORKER_ZYGOTE.get(self._env)
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._workers: dict[int, ForkedWorker] = {}
        self._next = 0
        self._reader: threading.Thread | None = None
        self._preload: tuple[str, ...] = ()

    @property
    def zygote_pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def spawn(self, argv: Sequence[str], env: Mapping[str, str]) -> WorkerProcess:
        """One worker running ``argv`` with ``env`` (as ``Popen(argv, env=env,
        start_new_session=True)``, dying with the launcher)."""
        preload = preload_for(argv) if self.enabled else ()
        if preload and self._preload_override is not None:
            preload = self._preload_override
        if not preload or not self._ensure_zygote(preload):
            return subprocess.Popen(list(argv), env=dict(env), start_new_session=True, preexec_fn=die_with_parent)
        with self._lock:
            self._next += 1
            ident = self._next
            pending = self._pending[ident] = _Pending(threading.Event())
        request = {"spawn": ident, "argv": list(argv), "env": dict(env), "cwd": os.getcwd()}
        assert self._sock is not None
        try:
            self._sock.sendall(json.dumps(request).encode() + b"\n")
        except OSError:
            pending.error = "the zygote is gone"
            pending.done.set()
        if not pending.done.wait(SPAWN_TIMEOUT_S):
            pending.error = f"no answer from the zygote within {SPAWN_TIMEOUT_S:.0f}s"
        with self._lock:
            self._pending.pop(ident, None)
            worker = None if pending.error else self._workers.setdefault(pending.pid, ForkedWorker(pending.pid))
        if worker is None:  # the zygote failed: this worker starts the plain way
            print(
                f"railyard: worker zygote failed ({pending.error}); starting the worker as a subprocess",
                file=sys.stderr,
            )
            self._stop_zygote()
            return subprocess.Popen(list(argv), env=dict(env), start_new_session=True, preexec_fn=die_with_parent)
        return worker

    def _ensure_zygote(self, preload: tuple[str, ...]) -> bool:
        if self._proc is not None and self._proc.poll() is None and self._preload == preload:
            return True
        if self._proc is not None:
            self._stop_zygote()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "railyard_trainer.zygote", "--fd", str(theirs.fileno()), *preload],
                env=self._env, pass_fds=(theirs.fileno(),), preexec_fn=die_with_parent,
            )
        except OSError as exc:
            print(f"railyard: cannot start the worker zygote ({exc}); workers start as subprocesses", file=sys.stderr)
            ours.close()
            return False
        finally:
            theirs.close()
        self._sock, self._preload = ours, preload
        self._reader = threading.Thread(target=self._read, args=(ours,), name="railyard-zygote", daemon=True)
        self._reader.start()
        return True

    def _read(self, sock: socket.socket) -> None:
        buf = b""
        try:
            while True:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self._message(json.loads(line))
        except (OSError, ValueError):
            pass
        finally:
            # the zygote is gone: its workers died with it (PR_SET_PDEATHSIG)
            with self._lock:
                for p in self._pending.values():
                    p.error = p.error or "the zygote exited"
                    p.done.set()
                for w in self._workers.values():
                    if w.returncode is None and not _alive(w.pid):
                        w._ended(-signal.SIGKILL)
                    elif w.returncode is None:
                        threading.Thread(target=_reap_orphan, args=(w,), daemon=True).start()

    def _message(self, msg: dict[str, Any]) -> None:
        with self._lock:
            if "spawned" in msg:
                p = self._pending.get(int(msg["spawned"]))
                if p is not None:
                    p.pid, p.error = int(msg.get("pid", 0)), str(msg.get("error", ""))
                    p.done.set()
            elif "exited" in msg:
                pid = int(msg["exited"])
                w = self._workers.setdefault(pid, ForkedWorker(pid))
                w._ended(int(msg["returncode"]))

    def _stop_zygote(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._reader is not None:
            self._reader.join(10)
            self._reader = None

    def close(self) -> None:
        """End the zygote (after the workers ended; any still running are killed with it)."""
        self._stop_zygote()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap_orphan(w: ForkedWorker) -> None:
    """A worker that outlived its zygote (it should not: PDEATHSIG) is waited for by polling."""
    while _alive(w.pid):
        time.sleep(0.05)
    w._ended(-signal.SIGKILL)


# ---------------------------------------------------------------------------- zygote's side
@dataclass
class _Child:
    """What a forked child runs once it has left the zygote's loop."""

    module: str
    args: list[str]
    env: dict[str, str]
    cwd: str


def _preload(modules: Sequence[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # the worker imports it again and reports the error itself
            print(f"railyard zygote: preloading {name} failed: {exc!r}", file=sys.stderr)


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve(sock: socket.socket) -> _Child | None:
    """The zygote's loop: fork a child per request, report the ends. Returns in the child (what it
    should run) or, in the zygote, None once the launcher closed the socket."""
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    children: set[int] = set()
    buf = b""
    try:
        while True:
            for _ in sel.select(timeout=0.05):
                chunk = sock.recv(1 << 20)
                if not chunk:
                    return None
                buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                ident, argv = int(req["spawn"]), list(req["argv"])
                cmd = python_module_command(argv)
                if cmd is None:
                    sock.sendall(
                        json.dumps({"spawned": ident, "error": f"not a python -m command: {argv[:3]}"}).encode() + b"\n"
                    )
                    continue
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    sock.close()
                    return _Child(cmd[0], cmd[1], dict(req["env"]), str(req["cwd"]))
                children.add(pid)
                sock.sendall(json.dumps({"spawned": ident, "pid": pid}).encode() + b"\n")
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
                sock.sendall(json.dumps({"exited": pid, "returncode": _returncode(status)}).encode() + b"\n")
    except OSError:  # the launcher is gone
        return None
    finally:
        if os.getpid() == _ZYGOTE_PID[0]:
            for pid in children:  # the launcher closed us with workers still running
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


_ZYGOTE_PID = [0]


def run_child(child: _Child) -> None:
    """In the forked child: become the worker (its session, environment, folder), then run
    ``python -m MODULE ARGS`` as the interpreter would. Returns through SystemExit."""
    os.setsid()
    die_with_parent()
    for s in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(s, signal.SIG_DFL)
    # as a fresh interpreter sets it: a write to a socket a dead peer closed raises EPIPE (torchft
    # records the failed collective) instead of killing the worker (exit 141, seen with replica
    # groups when a peer group's node was lost)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(child.env)
    os.chdir(child.cwd)
    _set_name(f"railyard-r{child.env.get('RANK', '')}")  # what top and ps -o comm show
    sys.argv = [child.module, *child.args]
    sys.path[0] = child.cwd
    runpy.run_module(child.module, run_name="__main__", alter_sys=True)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--fd":
        print("usage: python -m railyard_trainer.zygote --fd FD [MODULE...]", file=sys.stderr)
        sys.exit(2)
    _ZYGOTE_PID[0] = os.getpid()
    _set_name("railyard-zygote")
    sock = socket.socket(fileno=int(args[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher forwards signals to the workers
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _preload(args[2:])
    child = serve(sock)
    if child is None:
        # Skip the interpreter's teardown: with torch imported, collecting its modules costs about
        # a second of CPU, paid by every launcher that waits for its zygote to end.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    try:
        run_child(child)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
