"""faultTolerance.mode ReplicaGroups (railyard_trainer/replicas.py, docs/fault-tolerance.md).

A Lighthouse and replica groups (three of one process, or two of two processes each with FSDP
inside), each its own launcher and torch.distributed world (gloo, CPU, the tiny preset). The last
group is lost in the middle of a step: with three groups it hangs there while the others wait
for it in the cross-group all-reduce and is then killed whole (a node lost mid-collective: in torchft's
ring only some survivor ranks see its connections close, the others wait on a survivor); with
two, one of its processes dies. The other groups keep stepping without it (same processes,
steps never going back; the step it was lost in does not commit and is trained again).
The lost group is started again: it heals from a live peer (and reads none of its own
checkpoints, which it left on disk), rejoins, and every group ends at the last step with
bit-identical parameters. Across the membership changes every global sample was trained
exactly once.

Every wait is on an observable condition (an event in a group's output), bounded only to catch
hangs; the survivors are held before a late step until the replacement has asked to join, so
they cannot finish before it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tests.waiting import wait_until

from railyard_trainer.checkpoint.restore import NoVerifiedCheckpoint
from railyard_trainer.ft import FTManager, NoFT, ReplicaGroupsFT
from railyard_trainer.replicas import Share, plan_share

from .launch import BASE_TRAINER, launcher_env

pytestmark = [pytest.mark.torch, pytest.mark.slow]

#: A few steps on each side of the loss, the survivors' steps without the lost group and the
#: replacement's after it healed: the hold keeps the survivors from finishing first, so the run
#: needs no margin of steps (40 took 2.5 times the CPU for the same assertions).
STEPS = 16
#: after the survivors' three steps without the lost group (KILL_AT..KILL_AT + 2), with margin
HOLD_AT = 12
KILL_AT = 6
#: Upper bound for any one wait: catches hangs only.
WAIT_S = 120.0


@pytest.mark.parametrize(
    ("batch", "unit", "participants"),
    [(6, 1, 3), (6, 1, 2), (7, 1, 3), (8, 2, 3), (12, 3, 2), (5, 1, 1), (4, 1, 3)],
)
def test_shares_tile_the_global_batch(batch: int, unit: int, participants: int) -> None:
    shares = [plan_share(consumed=100, batch_size=batch, unit=unit, rank=r, participants=participants) for r in range(participants)]
    covered = [g for s in shares for g in range(s.first, s.first + s.count)]
    assert covered == list(range(100, 100 + batch))  # in order, each once
    assert all(s.count % unit == 0 for s in shares)
    assert max(s.count for s in shares) - min(s.count for s in shares) <= unit


class _Tiers:
    """The group's own checkpoint tiers after a whole-job restart: its folder empty."""

    def restore(self) -> None:
        raise NoVerifiedCheckpoint("restore: no committed checkpoint found")


def _restarted_group(
    *, hint_step: int | None, peer_step: int | None, first: list[tuple[int, int]] = []  # noqa: B006
) -> tuple[FTManager, SimpleNamespace]:
    """The fault tolerance of a trainer of two groups after a whole-job restart, its own tier
    folder empty (every group reads only its own); its first quorum finds nobody ahead, its next
    ones are ``first`` (the quorum's step, participants), then the peer at ``peer_step`` (None:
    no ReplicaGroups, the job is one world)."""
    ctx = SimpleNamespace(step=0)
    cfg = SimpleNamespace(restore=None if hint_step is None else {"tier": "memory", "step": hint_step},
                          trainer=SimpleNamespace(collective_timeout_seconds=WAIT_S, batch_size=1),
                          parallelism=SimpleNamespace(data_replicas=2))
    if peer_step is None:
        return NoFT(ctx), ctx  # type: ignore[arg-type]
    quorums = [(0, 2), *first]

    def start_step(**_: object) -> Share:
        ctx.step, participants = quorums.pop(0) if quorums else (peer_step, 2)  # a heal sets ctx.step
        return Share(first=0, count=1, rank=0, participants=participants)

    replicas = SimpleNamespace(group=1, heals=0, start_step=start_step)
    data = SimpleNamespace(consumed=0)
    return ReplicaGroupsFT(replicas, ctx=ctx, data=data, cfg=cfg, unit=1, rank=0), ctx  # type: ignore[arg-type]


@pytest.mark.parametrize("first", [[], [(0, 1)], [(0, 2)]], ids=["peer-restored", "peer-still-restoring-past-the-join-timeout", "peer-in-its-quorum-before-restoring"])
def test_a_group_without_its_checkpoint_heals_from_the_peers_that_restored_the_hint(first: list[tuple[int, int]]) -> None:
    ft, ctx = _restarted_group(hint_step=10, peer_step=10, first=first)
    assert ft.restore(_Tiers().restore) is None
    assert isinstance(ft, ReplicaGroupsFT)
    assert ctx.step == 10 and ft.joined is not None  # healed, and trains the quorum's share


@pytest.mark.parametrize(("hint_step", "peer_step"), [(10, 0), (10, 9), (None, 0), (10, None)], ids=["no-peer-restored", "peers-below-the-hint", "no-hint-nobody-trained", "not-replica-groups"])
def test_a_group_without_its_checkpoint_still_exits_77_when_no_peer_reached_the_hint(hint_step: int | None, peer_step: int | None) -> None:
    ft, _ = _restarted_group(hint_step=hint_step, peer_step=peer_step)
    with pytest.raises(NoVerifiedCheckpoint) as err:
        ft.restore(_Tiers().restore)
    assert err.value.exit_code == 77 and "no committed checkpoint found" in str(err.value)


class Proc:
    """A process whose JSON-lines stdout is collected by a thread, for waiting on events."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        self.name = name
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.err_path = cwd / f"{name}.err"
        self.p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=self.err_path.open("w"),
                                  text=True, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        out = self.err_path.with_suffix(".out").open("w")  # kept for a failure's post-mortem
        for line in self.p.stdout:
            out.write(line)
            out.flush()
            if line.startswith("{"):
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                with self.lock:
                    self.events.append(e)

    def of(self, event: str) -> list[dict[str, Any]]:
        with self.lock:
            return [e for e in self.events if e.get("event") == event]

    def wait_for(self, what: str, cond: Callable[[Proc], bool], others: list[Proc]) -> None:
        """Wait for ``cond``, failing at once if this process or one of ``others`` exits first."""
        def check() -> bool:
            if cond(self):
                return True
            for p in [self, *others]:
                assert p.p.poll() is None, f"{p.name} exited {p.p.returncode} while waiting for {self.name}: {what}\n{p.explain()}"
            return False

        wait_until(check, timeout=WAIT_S, interval=0.05, message=f"{self.name}: {what}", explain=self.explain)

    def wait_exit(self, what: str) -> None:
        wait_until(lambda: self.p.poll() is not None, timeout=WAIT_S, interval=0.05, message=f"{self.name} {what}", explain=self.explain)

    def last_step(self) -> int:
        steps = self.of("step")
        return int(steps[-1]["step"]) if steps else 0

    def stop(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=20)
        self.reader.join(timeout=10)

    def explain(self) -> str:
        with self.lock:
            tail = "\n".join(json.dumps(e) for e in self.events[-15:])
        err = self.err_path.read_text()[-3000:] if self.err_path.exists() else ""
        return f"--- {self.name} events\n{tail}\n--- {self.name} stderr\n{err}"


@dataclass(frozen=True)
class Shape:
    groups: int
    procs: int  # per group: FSDP over this many ranks inside the group's own world
    batch: int
    crash_rank: int  # which rank of the lost group dies (or hangs)
    #: "crash": the rank raises at the start of the step; "hang": it hangs there, and once the
    #: survivors wait for it in the cross-group all-reduce the whole group is killed (a node lost
    #: mid-collective: with three groups only one survivor is the lost group's ring neighbour)
    fault: str = "crash"


#: Three groups of one process for the ring of three groups (the hang, the group killed whole),
#: two groups of two processes for FSDP inside a group (one cross-group ring per local rank, each
#: rank's heal and shard): each rank costs ~1 s of CPU to start, and three groups of two ran the
#: same ring twice (27 CPU seconds of the suite's time).
SHAPES = [Shape(groups=3, procs=1, batch=12, crash_rank=0, fault="hang"), Shape(groups=2, procs=2, batch=8, crash_rank=1)]


def _group(tmp: Path, shape: Shape, g: int, lighthouse: str, incarnation: int, *, hold: str | None = None, crash_at: int | None = None) -> Proc:
    work = tmp / f"group-{g}"
    work.mkdir(exist_ok=True)
    cfg = {
        "job": "ft",
        "trainer": {**BASE_TRAINER, "steps": STEPS, "batchSize": shape.batch, "collectiveTimeoutSeconds": 300, "watchdogSeconds": 240,
                    "faults": [] if crash_at is None else [{"kind": shape.fault, "rank": shape.crash_rank, "step": crash_at}]},
        "parallelism": {"dataReplicas": shape.groups},
        "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": 1},
        # each group keeps its own plain checkpoints: the replacement must not read them
        # (one before the loss at KILL_AT, so that there is one it could read)
        "checkpoint": {"path": str(work / "ckpt"), "intervalSteps": 5},
    }
    (work / "config.json").write_text(json.dumps(cfg))
    extra = {"RAILYARD_REPLICA_GROUP": str(g), "TORCHFT_LIGHTHOUSE": lighthouse}
    if hold:
        extra["RAILYARD_TEST_HOLD"] = hold
    env = launcher_env(**extra)
    return Proc(f"group-{g}.{incarnation}", [sys.executable, "-m", "railyard_trainer.launcher", "--nproc-per-node", str(shape.procs), "--config", str(work / "config.json")], env, work)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.groups}groups-x{s.procs}")
def test_a_lost_replica_group_stops_only_itself_and_heals_from_a_live_peer(tmp_path: Path, shape: Shape) -> None:
    procs: list[Proc] = []
    lost = shape.groups - 1
    try:
        lh = Proc("lighthouse", [sys.executable, "-m", "railyard_trainer.launcher", "lighthouse", "--min-replicas", "1",
                                 "--bind", "[::]:0", "--heartbeat-timeout-ms", "2000",
                                 # beyond WAIT_S: a survivor stalled in the collective fails the test
                                 # instead of being dropped by the Lighthouse
                                 "--join-timeout-ms", "600000"],
                  launcher_env(), tmp_path)
        procs.append(lh)
        lh.wait_for("its address", lambda p: bool(p.of("lighthouse")), [])
        address = str(lh.of("lighthouse")[0]["address"])
        start, release = tmp_path / "start", tmp_path / "release"
        holds = f"0:{start},{HOLD_AT}:{release}"
        survivors = [_group(tmp_path, shape, g, address, 0, hold=holds) for g in range(lost)]
        g2 = _group(tmp_path, shape, lost, address, 0, hold=f"0:{start}", crash_at=KILL_AT)
        procs.extend([*survivors, g2])
        # every group asks for its first quorum only once all wait before it and the Lighthouse
        # hears every group's heartbeat: it then forms no quorum before all have joined (its join
        # timeout is beyond WAIT_S), so all are in every quorum up to step KILL_AT. Held at step 1
        # (after the first quorum) instead, a group whose workers started later was left out of
        # the first quorums and healed in from a peer, and the lost group could die in a quorum
        # the survivors did not share.
        for p in [*survivors, g2]:
            p.wait_for("to wait before its first quorum", lambda q: any(e["step"] == 0 for e in q.of("test_hold")), procs)
        everyone = {f"ft-group-{g}" for g in range(shape.groups)}
        lh.wait_for("every group's heartbeat", lambda _: _heartbeating(address) >= everyone, procs)
        start.touch()

        # all groups train together; one process of the lost group dies at the start of step
        # KILL_AT, after it joined that step's quorum, so the survivors' all-reduce of it fails
        for p in survivors:
            p.wait_for("the workers' pids", lambda q: bool(q.of("workers_started")), survivors)
        survivors_pids = {p.name: p.of("workers_started")[0]["pids"] for p in survivors}
        if shape.fault == "hang":
            g2.wait_for(f"to hang at step {KILL_AT}", lambda p: bool(p.of("fault")), survivors)
            os.killpg(g2.p.pid, signal.SIGKILL)
        g2.wait_exit(f"to crash at step {KILL_AT}")
        g2.reader.join(timeout=10)
        assert g2.p.returncode != 0 and g2.of("fault"), g2.explain()
        killed_at = g2.last_step()
        assert killed_at == KILL_AT - 1 and not g2.of("replica_healed"), g2.explain()

        # the survivors keep stepping without it
        for p in survivors:
            p.wait_for("three steps without the lost group", lambda q: sum(e["participants"] == lost for e in q.of("step")) >= 3, survivors)

        # the replacement joins; only then may the survivors go past the hold
        g2b = _group(tmp_path, shape, lost, address, 1)
        procs.append(g2b)
        g2b.wait_for("joining the quorum", lambda p: bool(p.of("replica_joining")), survivors)
        release.touch()
        for p in [*survivors, g2b]:
            p.wait_exit("to finish")
            p.reader.join(timeout=10)
            assert p.p.returncode == 0, p.explain()

        # survivors: the same worker processes throughout, steps only ever forward, to the end
        for p in survivors:
            assert p.of("workers_started")[0]["pids"] == survivors_pids[p.name] and len(p.of("workers_started")) == 1
            steps = [e["step"] for e in p.of("step")]
            assert steps == sorted(steps) and len(set(steps)) == len(steps), steps
            assert steps[-1] == STEPS
            assert not p.of("replica_healed") or all(e["from_step"] == 0 for e in p.of("replica_healed"))
            # the step the lost group died in did not commit; the survivors trained it again
            assert [e["step"] for e in p.of("step_not_committed") if e["rank"] == 0] == [KILL_AT], p.explain()
            assert next(e for e in p.of("step") if e["step"] == KILL_AT)["participants"] == lost
            # every rank's cross-group collective failed when the lost group went, none by its
            # timeout: a survivor that gave up the step closed its connections (replicas.py), so
            # the ones waiting for it in torchft's ring were told at once
            failed = p.of("replica_collective_failed")
            assert sorted(e["rank"] for e in failed) == list(range(shape.procs)), p.explain()
            assert not any("timed out" in e["error"].lower() or "timeout" in e["error"].lower() for e in failed), failed

        # the replacement healed from a live peer, read no checkpoint tier, and caught up
        healed = g2b.of("replica_healed")
        assert len(healed) == shape.procs and len({(e["from_step"], e["to_step"]) for e in healed}) == 1, g2b.explain()  # each rank of it
        assert healed[0]["from_step"] == 0 and healed[0]["to_step"] > killed_at, g2b.explain()
        assert all(e["bytes"] > 0 and e["seconds"] > 0 for e in healed), healed  # each heal measured
        assert not any(e.get("event", "").startswith("restore") and e.get("step") for e in g2b.events), g2b.explain()
        assert (tmp_path / f"group-{lost}" / "ckpt").exists()  # there was something it could have read
        assert g2b.of("step")[0]["step"] == healed[0]["to_step"] + 1

        # every group ends on the same weights: rank r's shard equal in every group
        done = [e for p in [*survivors, g2b] for e in p.of("done")]
        assert len(done) == shape.groups * shape.procs and {d["step"] for d in done} == {STEPS}
        for r in range(shape.procs):
            assert len({d["params_sha256"] for d in done if d["rank"] == r}) == 1, done

        _assert_every_sample_trained_once([*survivors, g2b], killed=g2, shape=shape)
    finally:
        for p in reversed(procs):
            p.stop()


def _heartbeating(address: str) -> set[str]:
    """The replica groups whose heartbeats the Lighthouse lists on its status page (one line
    ``<job>-group-<g>:<uuid>: seen ... ago`` each)."""
    with urllib.request.urlopen(f"{address}/status", timeout=10) as page:
        return set(re.findall(r"\b(ft-group-\d+):", page.read().decode()))


def _assert_every_sample_trained_once(kept: list[Proc], *, killed: Proc, shape: Shape) -> None:
    """Per step, the shares logged with the step's membership (as a survivor saw it) tile the
    global batch; a share logged by the killed group under a membership that the survivors did
    not commit was never applied to the job's weights and is not counted."""
    # the killed incarnation's records count only for steps nobody else logged (it may have
    # trained the first steps alone, before the others joined and healed from it)
    participants = {e["step"]: e["participants"] for e in killed.of("step")}
    participants.update({e["step"]: e["participants"] for p in kept for e in p.of("step")})
    shares: dict[int, list[tuple[int, int]]] = {}
    for p in [*kept, killed]:
        for e in p.of("step"):
            if participants.get(e["step"]) == e["participants"]:
                shares.setdefault(e["step"], []).append(tuple(e["samples"]))  # type: ignore[arg-type]
    assert sorted(shares) == list(range(1, STEPS + 1)), sorted(shares)
    seen: list[int] = []
    for step in sorted(shares):
        cut = sorted(shares[step])
        assert len(cut) == participants[step], (step, cut)
        seen.extend(g for a, b in cut for g in range(a, b))
    assert seen == list(range(STEPS * shape.batch)), "a sample was skipped or trained twice"
    assert {shape.groups - 1, shape.groups} <= set(participants.values())


def _tiered_group(tmp: Path, g: int, lighthouse: str, *, steps: int, attempt: int, restore: dict[str, Any] | None) -> Proc:
    """A group of one process with a memory tier in its own folder (as each group's tiers are
    under the operator), saving every 3 steps; ``restore``: the operator's hint."""
    work = tmp / f"group-{g}"
    work.mkdir(exist_ok=True)
    cfg = {
        "job": "ft", "attempt": attempt,
        "trainer": {**BASE_TRAINER, "steps": steps, "batchSize": 4, "collectiveTimeoutSeconds": 300, "watchdogSeconds": 240},
        "parallelism": {"dataReplicas": 2},
        # the heal's bytes over a named interface (the loopback standing in for ib0)
        "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": 2, "healNetwork": {"interface": "lo"}},
        "checkpoint": {"memory": {"enabled": True, "intervalSteps": 3, "keep": 2, "replicate": False}},
        "restore": restore,
    }
    (work / f"config-{attempt}.json").write_text(json.dumps(cfg))
    env = launcher_env(RAILYARD_REPLICA_GROUP=str(g), TORCHFT_LIGHTHOUSE=lighthouse, RAILYARD_CHECKPOINT_MEMORY_DIR=str(work / "memory"))
    env.pop("RAILYARD_PLAIN_CHECKPOINT")
    return Proc(f"group-{g}.{attempt}", [sys.executable, "-m", "railyard_trainer.launcher", "--nproc-per-node", "1", "--config", str(work / f"config-{attempt}.json")], env, work)


def test_after_a_whole_job_restart_a_group_without_its_checkpoint_heals_from_a_peer(tmp_path: Path) -> None:
    """Two groups train 6 steps; group 1's tier folder is lost (its node replaced); the whole
    job restarts with the operator's hint (memory, step 6): group 0 restores it, group 1 finds
    nothing, heals from group 0 instead of exiting 77, and both end on the same weights."""
    procs: list[Proc] = []
    try:
        # both groups in every quorum: after the restart both join the first one at step 0,
        # before either looked at its tiers (as after a whole-job restart under the operator)
        lh = Proc("lighthouse", [sys.executable, "-m", "railyard_trainer.launcher", "lighthouse", "--min-replicas", "2",
                                 "--bind", "[::]:0", "--heartbeat-timeout-ms", "2000", "--join-timeout-ms", "10000"], launcher_env(), tmp_path)
        procs.append(lh)
        lh.wait_for("its address", lambda p: bool(p.of("lighthouse")), [])
        address = str(lh.of("lighthouse")[0]["address"])
        first = [_tiered_group(tmp_path, g, address, steps=6, attempt=0, restore=None) for g in range(2)]
        procs.extend(first)
        for p in first:
            p.wait_exit("to finish")
            p.reader.join(timeout=10)
            assert p.p.returncode == 0, p.explain()
        shutil.rmtree(tmp_path / "group-1" / "memory")  # the group's node was replaced
        second = [_tiered_group(tmp_path, g, address, steps=9, attempt=1, restore={"tier": "memory", "step": 6}) for g in range(2)]
        procs.extend(second)
        for p in second:
            p.wait_exit("to finish")
            p.reader.join(timeout=10)
            assert p.p.returncode == 0, p.explain()
        g0, g1 = second
        assert [(e["tier"], e["step"]) for e in g0.of("restored")] == [("memory", 6)], g0.explain()
        assert g1.of("restore_from_peer") and not g1.of("restored"), g1.explain()
        assert [(e["from_step"], e["to_step"]) for e in g1.of("replica_healed")] == [(0, 6)], g1.explain()
        # every group advertised the interface's address, the heal fetched from it and was measured
        assert all(e["heal_address"].startswith("http://127.0.0.1:") for p in second for e in p.of("replica_joining"))
        heal = g1.of("replica_healed")[0]
        assert heal["source_address"] in {e["heal_address"] for e in g0.of("replica_joining")}, heal
        assert heal["bytes"] > 0 and heal["seconds"] > 0, heal
        done = [e for p in second for e in p.of("done")]
        assert {d["step"] for d in done} == {9} and len({d["params_sha256"] for d in done}) == 1, done
    finally:
        for p in reversed(procs):
            p.stop()
