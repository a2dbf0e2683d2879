"""The launcher's side of in-place restarts: it stays up when its workers fail and starts them
again when the operator says so (protocol: railyard.protocol.control; docs/trainer.md
"Restarting in place").

With ``RAILYARD_CONTROL_URL`` (set by the operator) the launcher keeps a long poll open to the
operator, reporting its state: workers running, workers failed (with their exit codes: the
operator reads them as it reads a pod's exit code), done. Orders come back on the poll:

- ``restart``: stop the workers that still run (``RAILYARD_RESTART_KILL_GRACE_S``, default 2 s,
  then SIGKILL) and start them again for the order's attempt, with the rank table the order
  names (checked against the operator's digest), the new rendezvous port and the restore hint;
- ``stop``: this pod is not a member of the job's current attempt (it was replaced) or the job
  is over: stop the workers and exit;
- ``save`` (for the running attempt): a planned move is coming; the launcher writes the order to
  the file its workers know (``RAILYARD_SAVE_ORDER_FILE``), they agree on one step and save to the
  memory tier there (railyard_trainer.jitsave), and the launcher reports the order's step back.
  Workers of a replica group first leave the groups' quorum at that step; the launcher reports
  the step they left after (``left_step``).

A restart to an attempt that is not newer than the running one is never acted on, so late or
replayed answers are harmless. When the workers have failed and the operator says nothing for
config.json's ``restartWaitSeconds`` (default 60 s), the launcher exits with the most specific code as
before, the pod fails and the operator restarts the whole gang. A launcher that never reached
the operator behaves as before (exits after its workers). Torch-free.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from railyard.protocol import podenv
from railyard.protocol.control import (
    MAX_MESSAGE_CHARS,
    MAX_WAIT_S,
    Action,
    ControlError,
    ControlOrder,
    LauncherReport,
    LauncherState,
    decide_launcher_step,
    parse_order,
    rank_table_for,
)
from railyard.protocol.exitcodes import classify_exit_code
from railyard_trainer.config import ConfigError
from railyard_trainer.events import log_event
from railyard_trainer.jitsave import read_left
from railyard_trainer.launch_plan import (
    RENDEZVOUS_WAIT_S,
    LaunchPlan,
    resolve_until,
    resolved_lighthouse,
)
from railyard_trainer.termination import (
    WORKER_ERROR_FILE_ENV,
    build_termination_message,
    fit_termination_message,
    read_worker_errors,
    worker_error_file,
    write_termination_message,
)
from railyard_trainer.worker_env import torchrun_env
from railyard_trainer.workers import most_specific, start_workers, worker_command
from railyard_trainer.zygote import Spawner, WorkerProcess

#: Seconds one long poll may be held by the operator.
POLL_WAIT_S = 20.0

#: post(url, token, body, timeout) -> (HTTP status, body); raises OSError on transport errors.
Post = Callable[[str, str, bytes, float], tuple[int, bytes]]


def post_json(url: str, token: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


class ControlChannel:
    """The launcher's connection to the operator: one long poll at a time in a daemon thread,
    plus an immediate post whenever the state changes (a failure must not wait for the poll)."""

    def __init__(self, url: str, token: str, *, job: str, pod_index: int, pod: str, post: Post = post_json,
                 clock: Callable[[], float] = time.monotonic, poll_wait_s: float = POLL_WAIT_S) -> None:
        self.url, self.token, self.job, self.pod_index, self.pod = url, token, job, pod_index, pod
        self.post, self.clock, self.poll_wait_s = post, clock, min(poll_wait_s, MAX_WAIT_S)
        self._lock = threading.Lock()
        self._report: LauncherReport | None = None
        self._order: ControlOrder | None = None
        self._got_order = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: when the operator last answered (None: never)
        self.last_contact: float | None = None
        self._last_error_log = -1e9

    @property
    def contacted(self) -> bool:
        return self.last_contact is not None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="railyard-control", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def set_state(self, attempt: int, state: LauncherState, *, code: int = 0, workers: Mapping[int, int] | None = None,
                  message: str = "", save_step: int | None = None, left_step: int | None = None) -> None:
        """A new state: kept for the polls, and posted at once from a short-lived thread.
        ``save_step``: the save order passed on to the workers (None: as reported before, for
        the same attempt), so the operator does not send it again; ``left_step``: the step the
        workers left the replica groups' quorum after (None: as reported before)."""
        with self._lock:
            before = self._report
        same = before is not None and before.attempt == attempt
        if save_step is None:
            save_step = before.save_step if before is not None and same else -1
        if left_step is None:
            left_step = before.left_step if before is not None and same else -1
        report = LauncherReport(
            self.job,
            attempt,
            self.pod_index,
            self.pod,
            state,
            code,
            tuple(sorted((workers or {}).items())),
            time.time(),
            message=message[-MAX_MESSAGE_CHARS:],
            save_step=save_step,
            left_step=left_step,
        )
        with self._lock:
            if self._report is not None and report == replace(self._report, sent_at=report.sent_at):
                return
            self._report = report
        threading.Thread(target=self._exchange, args=(report, 0.0), name="railyard-control-post", daemon=True).start()

    def take_order(self) -> ControlOrder | None:
        with self._lock:
            order, self._order = self._order, None
            self._got_order.clear()
            return order

    def wait_order(self, timeout: float) -> None:
        self._got_order.wait(timeout)

    def _loop(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            with self._lock:
                report = self._report
            if report is None:  # nothing to say yet
                self._stop.wait(0.05)
                continue
            # the first exchange is answered at once: the launcher knows early that it has an operator
            if self._exchange(report, self.poll_wait_s if self.contacted else 0.0):
                delay = 0.5
            else:
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def _exchange(self, report: LauncherReport, wait: float) -> bool:
        body = replace(report, sent_at=time.time()).to_json().encode()
        try:
            status, answer = self.post(f"{self.url}?wait={wait:g}", self.token, body, wait + 10.0)
        except OSError as exc:
            self._log_error(repr(exc))
            return False
        if status != 200:
            self._log_error(f"HTTP {status}: {answer[:200]!r}")
            return False
        try:
            order = parse_order(answer)
        except ControlError as exc:
            self._log_error(f"unreadable answer: {exc}")
            return False
        self.last_contact = self.clock()
        if order.action is not Action.CONTINUE:
            with self._lock:
                self._order = order
                self._got_order.set()
        return True

    def _log_error(self, what: str) -> None:
        now = self.clock()
        if now - self._last_error_log > 30:
            self._last_error_log = now
            log_event("control_error", url=self.url, error=what)


def channel_from_env(plan: LaunchPlan, env: Mapping[str, str]) -> ControlChannel | None:
    """The channel the operator set up for this pod (None: by hand, or an operator without it)."""
    url, token, pod = podenv.CONTROL_URL.get(env), podenv.HEARTBEAT_TOKEN.get(env), podenv.POD_NAME.get(env)
    if not (url and token and pod and podenv.RANK_TABLE.is_set(env)):
        return None
    return ControlChannel(url, token, job=plan.config.job, pod_index=plan.pod_index, pod=pod)


def replan(plan: LaunchPlan, order: ControlOrder, *, env: Mapping[str, str], resolve_deadline: float) -> LaunchPlan:
    """The launch plan of the order's attempt: same workers (an in-place restart keeps every
    rank where it is: checked), the order's rank table, rendezvous and restore hint."""
    table = rank_table_for(order, plan.table)
    old = [(e.rank, e.local_rank, e.pp, e.dp, e.tp) for e in plan.table.ranks_of_pod(plan.pod_index)]
    new = [(e.rank, e.local_rank, e.pp, e.dp, e.tp) for e in table.ranks_of_pod(plan.pod_index)]
    if old != new:
        raise ControlError(
            f"rank_table: pod {plan.pod_index}'s ranks differ in attempt {table.attempt}; an in-place restart keeps "
            "them"
        )
    cfg = replace(
        plan.config, attempt=order.attempt, restore=dict(order.restore) if order.restore is not None else None
    )
    host = table.master_addr or podenv.MASTER_ADDR.get(env) or "127.0.0.1"
    return LaunchPlan(
        cfg,
        table,
        plan.pod_index,
        resolve_until(host, table.master_port, resolve_deadline),
        table.master_port,
        workers=list(plan.workers),
    )


@dataclass
class _Generation:
    """The workers of one attempt."""

    plan: LaunchPlan
    procs: dict[int, WorkerProcess]
    #: where its workers record their errors (railyard_trainer.termination)
    run_dir: Path
    failed_at: float | None = None
    term_at: float | None = None
    #: where a just-in-time save order reaches the workers (``RAILYARD_SAVE_ORDER_FILE``)
    save_file: Path | None = None

    def codes(self) -> dict[int, int]:
        return {r: (128 - rc if rc < 0 else rc) for r, p in self.procs.items() for rc in [p.poll()] if rc is not None}

    def alive(self) -> list[WorkerProcess]:
        return [p for p in self.procs.values() if p.poll() is None]

    def last_words(self, codes: Mapping[int, int]) -> str:
        """The termination message for the workers' ``codes`` (the rank that explains the most
        specific code, its traceback tail), as the plain launcher writes it."""
        bad = [c for c in codes.values() if c != 0]
        if not bad:
            return ""
        errors = read_worker_errors(self.run_dir, list(self.procs))
        return fit_termination_message(build_termination_message(codes, errors, code=most_specific(bad)))


def _spawn(plan: LaunchPlan, run_dir: Path, spawner: Spawner) -> _Generation:
    attempt = plan.config.attempt
    config_path = run_dir / f"config-a{attempt}.json"
    config_path.write_text(json.dumps(plan.config.to_dict()))
    table_path = run_dir / f"ranktable-a{attempt}.json"
    table_path.write_text(plan.table.to_json())
    base = dict(os.environ)
    base.update({
        podenv.MASTER_ADDR.name: plan.master_addr, podenv.MASTER_PORT.name: podenv.MASTER_PORT.render(plan.master_port),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1",
        podenv.ATTEMPT.name: podenv.ATTEMPT.render(attempt), podenv.RANK_TABLE.name: str(table_path),
        podenv.SAVE_ORDER_FILE.name: str(run_dir / f"save-a{attempt}.json"),
    })
    base.update(resolved_lighthouse(os.environ, time.monotonic() + RENDEZVOUS_WAIT_S))
    if plan.master_addr.startswith("127.") and len(plan.table.pods) == 1:
        base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    errors_dir = run_dir / f"errors-a{attempt}"
    errors_dir.mkdir(exist_ok=True)
    log_event(
        "launch",
        pod_index=plan.pod_index,
        ranks=[w.rank for w in plan.workers],
        world_size=plan.table.world_size,
        mesh=[plan.table.pp, plan.table.dp, plan.table.tp],
        master=f"{plan.master_addr}:{plan.master_port}",
        attempt=attempt,
    )
    # the same worker as a fresh pod's launcher starts (the bundled trainer or the job's own
    # program, with torchrun's variables for this attempt): workers.supervise's rule
    envs = {
        w.rank: {
            **base,
            **torchrun_env(pods=len(plan.table.pods), attempt=attempt, run_id=plan.config.job),
            **replace(w, config_path=str(config_path)).to_env(),
            WORKER_ERROR_FILE_ENV: str(worker_error_file(errors_dir, w.rank)),
        }
        for w in plan.workers
    }
    return _Generation(plan, start_workers(spawner, worker_command(plan.config), envs, attempt=attempt), errors_dir,
                       save_file=run_dir / f"save-a{attempt}.json")


def _stop(gen: _Generation, grace_s: float) -> None:
    for p in gen.alive():
        with contextlib.suppress(ProcessLookupError):
            p.terminate()
    deadline = time.monotonic() + grace_s
    while gen.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    for p in gen.alive():
        with contextlib.suppress(ProcessLookupError):
            p.kill()
    for p in gen.procs.values():
        p.wait()


def supervise_in_place(
    plan: LaunchPlan,
    channel: ControlChannel,
    *,
    fail_grace_s: float,
    kill_grace_s: float,
    restart_wait_s: float,
    restart_kill_grace_s: float,
    env: Mapping[str, str],
    ignore_orders: bool = False,
) -> int:
    """Run the workers of ``plan``; restart them in place when told; returns the exit code.
    ``ignore_orders``: a test knob (``RAILYARD_CONTROL_IGNORE_ORDERS=1``) that makes this
    launcher drop every restart order, as a wedged one would."""
    run_dir = Path(tempfile.mkdtemp(prefix="railyard-"))
    received: list[int] = []
    gen: _Generation | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if gen is not None:
            for p in gen.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    channel.start()
    code = 0
    # one zygote for every attempt of this pod: a restart in place forks warm workers
    spawner = Spawner({**env, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"})
    try:
        while True:
            gen = _spawn(plan, run_dir, spawner)
            attempt = plan.config.attempt
            channel.set_state(attempt, LauncherState.RUNNING)
            outcome, value = _watch(
                gen,
                channel,
                fail_grace_s=fail_grace_s,
                kill_grace_s=kill_grace_s,
                restart_wait_s=restart_wait_s,
                restart_kill_grace_s=restart_kill_grace_s,
                received=received,
                ignore_orders=ignore_orders,
                env=env,
            )
            if isinstance(value, LaunchPlan):
                log_event("restart_in_place", from_attempt=attempt, attempt=value.config.attempt, workers=gen.codes(),
                          restore=value.config.restore, master=f"{value.master_addr}:{value.master_port}")
                plan = value
                continue
            code = int(value)
            state = LauncherState.SUCCEEDED if code == 0 else LauncherState.STOPPED
            words = gen.last_words(gen.codes()) if code != 0 else ""
            channel.set_state(attempt, state, code=code, workers=gen.codes(), message=words)
            log_event(
                "launcher_exit",
                code=code,
                failure_class=str(classify_exit_code(code)) if code else "",
                reason=outcome,
                workers={str(r): c for r, c in sorted(gen.codes().items())},
                attempt=attempt,
            )
            if code != 0:
                write_termination_message(words or f"exited with code {code} ({classify_exit_code(code)}): {outcome}")
            return code
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if gen is not None:
            for p in gen.alive():
                p.kill()
                p.wait()
        spawner.close()
        channel.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def _watch(
    gen: _Generation,
    channel: ControlChannel,
    *,
    fail_grace_s: float,
    kill_grace_s: float,
    restart_wait_s: float,
    restart_kill_grace_s: float,
    received: list[int],
    ignore_orders: bool,
    env: Mapping[str, str],
) -> tuple[str, int | LaunchPlan]:
    """Until this generation ends: ('restart', next plan), or (why, exit code)."""
    attempt = gen.plan.config.attempt
    reported: dict[int, int] = {}
    waiting_since: float | None = None
    #: a save order passed on (ReplicaGroups: the workers may leave the quorum); -1: none
    save_passed = -1
    while True:
        now = time.monotonic()
        if save_passed >= 0 and gen.save_file is not None:
            left = read_left(gen.save_file)
            if left >= 0:
                log_event("left_quorum", attempt=attempt, step=left)
                channel.set_state(attempt, LauncherState.RUNNING, left_step=left)
                save_passed = -1
        order = channel.take_order()
        if order is not None:
            step = decide_launcher_step(attempt, order)
            if step is Action.STOP:
                log_event("stop_ordered", attempt=attempt, reason=order.reason)
                _stop(gen, restart_kill_grace_s)
                bad = [c for c in gen.codes().values() if c != 0]
                return "stopped", most_specific(bad) if bad else 128 + int(signal.SIGTERM)
            if step is Action.SAVE and gen.save_file is not None and gen.failed_at is None:
                # (workers that failed save nothing: the failure's restart follows)
                write_save_order(gen.save_file, attempt=attempt, step=order.save_step)
                log_event("save_ordered", attempt=attempt, step=order.save_step, reason=order.reason)
                channel.set_state(attempt, LauncherState.RUNNING, save_step=order.save_step)
                save_passed = order.save_step
            elif step is Action.RESTART and ignore_orders:
                log_event("restart_ignored", attempt=attempt, ordered=order.attempt)
            elif step is Action.RESTART:
                try:
                    nxt = replan(gen.plan, order, env=env, resolve_deadline=now + restart_wait_s)
                except (ControlError, ConfigError) as exc:
                    # keep what runs; the operator's timeout turns this into a full restart
                    log_event("restart_refused", attempt=attempt, ordered=order.attempt, error=str(exc))
                else:
                    _stop(gen, restart_kill_grace_s)
                    return "restart", nxt
        codes = gen.codes()
        if received:
            if gen.term_at is None:
                gen.term_at = now
            if now - gen.term_at >= kill_grace_s:
                for p in gen.alive():
                    p.kill()
            if len(codes) == len(gen.procs):
                return "signal", 128 + received[0]
            time.sleep(0.05)
            continue
        failed = {r: c for r, c in codes.items() if c != 0}
        if failed and failed != reported:
            reported = dict(failed)
            if gen.failed_at is None:
                gen.failed_at = now
                log_event("worker_exited", failed=failed, attempt=attempt)
            channel.set_state(attempt, LauncherState.FAILED, code=most_specific(list(failed.values())), workers=failed,
                              message=gen.last_words(failed))
        if gen.failed_at is not None and gen.term_at is None and now - gen.failed_at >= fail_grace_s:
            gen.term_at = now
            for p in gen.alive():
                p.terminate()
        if gen.term_at is not None and now - gen.term_at >= kill_grace_s:
            for p in gen.alive():
                p.kill()
        if len(codes) == len(gen.procs):
            code = most_specific(list(codes.values()))
            if code == 0:
                return "done", 0
            if not channel.contacted:
                return "failed", code  # no operator to wait for: exit as a plain launcher does
            if waiting_since is None:
                waiting_since = now
                log_event("waiting_for_restart", attempt=attempt, code=code, wait_s=restart_wait_s)
            last = max(channel.last_contact or 0.0, waiting_since)
            if now - last >= restart_wait_s:
                return "no word from the operator", code
            channel.wait_order(0.1)
            continue
        time.sleep(0.05)


def write_save_order(path: Path, *, attempt: int, step: int) -> None:
    """Hand a save order to the workers: written whole (a rename), read at each step boundary."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"attempt": attempt, "step": step}))
    os.replace(tmp, path)


def is_ignoring_orders(env: Mapping[str, str]) -> bool:
    return podenv.CONTROL_IGNORE_ORDERS.get(env)


def launch_in_place(
    plan: LaunchPlan, env: Mapping[str, str], *, fail_grace_s: float, kill_grace_s: float,
    restart_wait_s: float, restart_kill_grace_s: float,
) -> int | None:
    """Run ``plan`` under the control channel when the operator set one up; None otherwise.
    The times are the launcher's (``RAILYARD_*_S``, checked by :func:`launcher.launch`)."""
    channel = channel_from_env(plan, env)
    if channel is None:
        return None
    return supervise_in_place(
        plan, channel, fail_grace_s=fail_grace_s, kill_grace_s=kill_grace_s,
        restart_wait_s=restart_wait_s, restart_kill_grace_s=restart_kill_grace_s,
        env=env, ignore_orders=is_ignoring_orders(env),
    )


__all__ = ["ControlChannel", "channel_from_env", "launch_in_place", "replan", "supervise_in_place"]
