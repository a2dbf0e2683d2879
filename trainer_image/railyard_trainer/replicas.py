"""Replica-group fault tolerance (``faultTolerance.mode: ReplicaGroups``), built on torchft.

Each HSDP replica group is its own ``torch.distributed`` world (FSDP, TP and PP stay inside it).
Across groups there is no world: a torchft :class:`~torchft.Manager` per group meets the other
groups' managers through a Lighthouse each step (the quorum), all-reduces the gradients over a
process group it rebuilds whenever the membership changes, and lets a step commit only when no
collective of it failed. A group that dies stops only itself; the survivors' next quorum drops
it. A group that starts while the others are ahead is told to heal and receives model,
optimizer, scheduler, step and data position from a live peer (torchft's checkpoint transport),
never from a checkpoint tier.

What is ours (torchft has no notion of it): which samples each group trains at each step.
Global batch ``s`` is the ``batch_size`` global samples from the shared data position
(``consumed``). The groups that take part in step ``s`` split it by their rank among the
participants (:func:`plan_share`), in whole units of the group's own data-parallel size, and each
group's gradient is weighted by its share of the batch before the cross-group sum, so the
committed update is the global batch's mean gradient whatever the membership. A step that does
not commit (a peer died mid-step) is retried with the same global batch and the new membership:
its samples were never applied, so none is skipped or trained twice.

Also ours: surviving the Lighthouse's loss. torchft gives the quorum retries (set from
``lighthouse_quorum_retries``); that the groups meet a recreated Lighthouse in one quorum (not
each in its own) and that its quorum ids, counted from 1 again, stay unique across Lighthouses
is ours (:class:`RejoiningClient`, deciding by railyard/protocol/quorum.py).

The Lighthouse: ``railyard-train lighthouse`` (:func:`lighthouse_main`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed.tensor import DTensor

# the Lighthouse's address (torchft's own variable, ``http://HOST:PORT``) and this group's index
# among the replica groups, and the pod IP torchft advertises: the operator sets them, spelled once
# in protocol/
from railyard.protocol import podenv
from railyard.protocol.quorum import REJOIN_ASK_INTERVAL_SECONDS, QuorumMemory, QuorumSeen, decide_quorum
from railyard.protocol.trainerconfig import (
    DEFAULT_WATCHDOG_SECONDS,
    LIGHTHOUSE_HEARTBEAT_INTERVAL_MS,
    lighthouse_heartbeat_timeout_ms,
    lighthouse_join_timeout_ms,
    lighthouse_quorum_retries,
)
from railyard_trainer.config import ConfigError
from railyard_trainer.events import log_event


@dataclass(frozen=True)
class Share:
    """This group's part of one step's global batch: global samples
    ``[first, first + count)``, trained by participant ``rank`` of ``participants``."""

    first: int
    count: int
    rank: int
    participants: int


def plan_share(*, consumed: int, batch_size: int, unit: int, rank: int, participants: int) -> Share:
    """Split global batch ``[consumed, consumed + batch_size)`` among ``participants`` groups.

    The batch is cut in ``batch_size // unit`` units of ``unit`` samples (the group's own
    data-parallel size, so every rank of a group gets the same number of rows); participant
    ``r`` takes a contiguous run of units, the first ``units % participants`` runs one unit
    longer. The runs tile the batch: together the participants read each sample once.
    """
    if batch_size % unit:
        raise ConfigError(
            [f"trainer.batchSize: {batch_size} is not a multiple of a replica group's data-parallel size {unit}"]
        )
    if not 0 <= rank < participants:
        raise ValueError(f"participant rank {rank} outside [0, {participants})")
    units = batch_size // unit
    base, extra = divmod(units, participants)
    start = rank * base + min(rank, extra)
    size = base + (1 if rank < extra else 0)
    return Share(first=consumed + start * unit, count=size * unit, rank=rank, participants=participants)


def replica_problems(*, batch_size: int, group_dp: int, data_replicas: int) -> list[str]:
    """What makes a ReplicaGroups run impossible before it starts (each names its field; the
    contract's rules, minReplicas among them, were checked when config.json was read)."""
    out = []
    if data_replicas < 2:
        out.append(
            "faultTolerance.mode: ReplicaGroups needs parallelism.dataReplicas > 1; set dataReplicas or use mode None"
        )
    if batch_size % group_dp == 0 and batch_size // group_dp < data_replicas:
        out.append(
            f"trainer.batchSize: {batch_size} gives {batch_size // group_dp} rows per data-parallel rank of a group, "
            f"fewer than the {data_replicas} replica groups that split it; raise batchSize to at least "
            f"{group_dp * data_replicas}"
        )
    return out


def _param_shards(parts: Iterable[torch.nn.Module]) -> Iterator[tuple[bytes, bytes]]:
    """(name, raw bytes) of each of this rank's parameter shards, in the modules' order."""
    for part in parts:
        for name, p in part.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            yield name.encode(), local.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def params_crc32(parts: Iterable[torch.nn.Module]) -> int:
    """CRC-32 of this rank's parameter shards, bit for bit, in name order: the same rank of
    every replica group must end with the same number (the ``done`` event's ``params_crc32``)."""
    crc = 0
    for name, data in _param_shards(parts):
        crc = zlib.crc32(data, zlib.crc32(name, crc))
    return crc


def params_sha256(parts: Iterable[torch.nn.Module]) -> str:
    """sha256 of the same bytes as :func:`params_crc32` (the ``done`` event's ``params_sha256``)."""
    h = hashlib.sha256()
    for name, data in _param_shards(parts):
        h.update(name)
        h.update(data)
    return h.hexdigest()


# --------------------------------------------------------------------------- state for healing


def _local(v: Any) -> Any:
    """DTensors as their local shards (a healing group has the same layout, so shard r of the
    peer is shard r here); everything else as it is."""
    if isinstance(v, DTensor):
        return v.to_local().detach().cpu()
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, dict):
        return {k: _local(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return type(v)(_local(x) for x in v)
    return v


def _like(received: Any, template: Any) -> Any:
    """``received`` (from :func:`_local`) in the form of this process's ``template``."""
    if isinstance(template, DTensor) and isinstance(received, torch.Tensor):
        local = received.to(template.to_local().device, template.dtype)
        return DTensor.from_local(
            local,
            template.device_mesh,
            template.placements,
            run_check=False,
            shape=template.shape,
            stride=template.stride(),
        )
    if isinstance(template, torch.Tensor) and isinstance(received, torch.Tensor):
        return received.to(template.device, template.dtype)
    if isinstance(template, dict) and isinstance(received, dict):
        return {k: _like(x, template.get(k)) for k, x in received.items()}
    return received


@dataclass
class HealState:
    """What a healing group receives from a live peer, as callables over the trainer's objects."""

    #: Named state dicts: ``{"model": ModelState, "optimizer": Optimizers, ...}``; each has
    #: ``state_dict()`` and ``load_state_dict()``.
    parts: Mapping[str, Any]
    #: ``{"step": .., "consumed": ..}`` of this group now, and how to set them.
    get_position: Callable[[], dict[str, int]]
    set_position: Callable[[dict[str, int]], None]

    def state_dict(self) -> dict[str, Any]:
        return {"parts": {k: _local(p.state_dict()) for k, p in self.parts.items()}, "position": self.get_position()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, p in self.parts.items():
            p.load_state_dict(_like(state["parts"][k], p.state_dict()))
        self.set_position(dict(state["position"]))


# --------------------------------------------------------------------------- the group's manager


def advertised_host(env: Mapping[str, str] | None = None) -> str:
    """The host this group's torchft Manager gives the Lighthouse and healing peers as its own.

    torchft's default is ``socket.gethostname()``: in a pod that is the short hostname
    ``<job>-<i>``, which no other pod resolves. The operator hands each pod its IP
    (``status.podIP`` as ``RAILYARD_POD_IP``), which every pod of the job reaches (the job's
    NetworkPolicy admits them) and which needs no DNS; an IPv6 address comes in brackets, ready
    for ``http://HOST:PORT``. Without it (a run outside the operator) torchft's default stays."""
    e = os.environ if env is None else env
    ip = podenv.POD_IP.get(e)
    if not ip:
        return socket.gethostname()
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError as exc:
        raise ConfigError(
            [f"{podenv.POD_IP.name}: {ip!r} is not an IP address; the operator sets it from status.podIP"]
        ) from exc
    return f"[{addr}]" if addr.version == 6 else str(addr)


def checkpoint_transport(host: str, timeout: timedelta) -> Any:
    """torchft's HTTP checkpoint transport (how a healing group fetches a live peer's state),
    advertising ``host`` instead of ``socket.gethostname()``."""
    from torchft.checkpointing.http_transport import HTTPTransport

    class Advertised(HTTPTransport[dict[str, Any]]):
        def address(self) -> str:
            port = self._server.socket.getsockname()[1]
            return f"http://{host}:{port}/checkpoint/"

    return Advertised(timeout=timeout, num_chunks=0)


class _EpochQuorum:
    """A torchft ``QuorumResult`` with :func:`~railyard.protocol.quorum.decide_quorum`'s id
    (everything else as it is)."""

    def __init__(self, result: Any, quorum_id: int) -> None:
        self._result, self.quorum_id = result, quorum_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


class RejoiningClient:
    """torchft's ``ManagerClient`` whose quorum answers pass
    :func:`~railyard.protocol.quorum.decide_quorum` first: one a group refuses (a new
    Lighthouse's quorum without a group of the last one) is asked for again with the same
    request after :data:`~railyard.protocol.quorum.REJOIN_ASK_INTERVAL_SECONDS`; one it takes
    reaches the Manager with an id unique across Lighthouses."""

    def __init__(self, client: Any, *, group: int, rank: int, rejoin_rounds: int,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._client, self.group, self.rank, self.rejoin_rounds, self._sleep = client, group, rank, rejoin_rounds, sleep
        self.memory = QuorumMemory()

    def _quorum(self, *args: Any, **kwargs: Any) -> Any:
        while True:
            result = self._client._quorum(*args, **kwargs)
            seen = QuorumSeen(
                quorum_id=result.quorum_id, max_step=result.max_step, members=tuple(result.replica_ids),
                healing=result.max_world_size < result.replica_world_size)
            decision = decide_quorum(self.memory, seen, rejoin_rounds=self.rejoin_rounds)
            asked_before = self.memory.asked_again
            self.memory = decision.memory
            if decision.accept:
                if asked_before:
                    log_event("quorum_rejoined", group=self.group, rank=self.rank, quorum_id=seen.quorum_id,
                              members=sorted(seen.members), step=seen.max_step, reason=decision.reason)
                return _EpochQuorum(result, decision.epoch)
            if asked_before == 0:
                log_event("quorum_refused", group=self.group, rank=self.rank, quorum_id=seen.quorum_id,
                          members=sorted(seen.members), step=seen.max_step, reason=decision.reason)
            self._sleep(REJOIN_ASK_INTERVAL_SECONDS)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


class ReplicaGroup:
    """This group's torchft Manager: quorum, weighted cross-group gradient sum, commit, heal.

    Built after the group's own process group (the Manager shares the group's TCP store,
    ``MASTER_ADDR:MASTER_PORT``). ``use_async_quorum=False``: a healing group applies the
    peer's state before its forward pass and takes part in that very step, so every participant
    of a step trains on the same weights and the split counts every participant.
    """

    def __init__(self, *, group: int, data_replicas: int, min_replicas: int, group_rank: int, group_world: int,
                 lighthouse: str, job: str, timeout_s: float, cross_group_timeout_s: float, state: HealState,
                 device: torch.device, store_addr: str, store_port: int, rejoin_rounds: int) -> None:
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

        self.group, self.group_rank, self.data_replicas, self.state = group, group_rank, data_replicas, state
        timeout = timedelta(seconds=timeout_s)
        # the cross-group collectives give up sooner than the group's own (cross_group_timeout_seconds
        # in protocol/trainerconfig.py); the quorum, the commit vote and a heal keep the group's timeout
        pg_timeout = timedelta(seconds=cross_group_timeout_s)
        self.pg = (
            ProcessGroupNCCL(timeout=pg_timeout) if device.type == "cuda" else ProcessGroupGloo(timeout=pg_timeout)
        )
        host = advertised_host()
        self.manager = Manager(
            hostname=host,
            checkpoint_transport=checkpoint_transport(host, timeout),
            pg=self.pg,
            load_state_dict=state.load_state_dict,
            state_dict=state.state_dict,
            min_replica_size=min_replicas,
            use_async_quorum=False,
            timeout=timeout,
            quorum_timeout=timeout,
            connect_timeout=timeout,
            rank=group_rank,
            world_size=group_world,
            store_addr=store_addr,
            store_port=store_port,
            lighthouse_addr=lighthouse,
            replica_id=f"{job}-group-{group}",
            # the Lighthouse drops a group after lighthouse_heartbeat_timeout_ms of these missed
            heartbeat_interval=timedelta(milliseconds=LIGHTHOUSE_HEARTBEAT_INTERVAL_MS),
            # every group builds its model from the same seed: nothing to sync at step 0, and a
            # whole-job restart restores from the tiers instead (docs/fault-tolerance.md)
            init_sync=False,
            # a Lighthouse that does not answer (its node failed) is asked again about once a
            # second for the whole quorum timeout while the operator recreates it: its loss
            # restarts no group (lighthouse_quorum_retries; TORCHFT_QUORUM_RETRIES still overrides)
            quorum_retries=lighthouse_quorum_retries(timeout_s),
        )
        # the groups meet in one quorum on a Lighthouse the operator replaced, under ids unique
        # across Lighthouses (protocol/quorum.py); torchft 0.2.0's Manager asks its
        # ManagerClient ``_client`` for every quorum
        self.manager._client = RejoiningClient(self.manager._client, group=group, rank=group_rank,
                                               rejoin_rounds=rejoin_rounds)
        self.heals = 0
        self.failed_steps = 0
        #: How long this group waited for its last quorum (the step event's ``quorum_s``: a
        #: change of membership shows as one long wait)
        self.quorum_s = 0.0
        #: This group left the quorum for good (:meth:`leave`)
        self.left = False
        #: this step's process group was aborted after an error (one abort per step)
        self._aborted = False
        #: Inside the exchange with the other groups (the quorum; from the gradient sum to the
        #: commit): a rank that waits here for a stuck peer group is not stuck itself (heartbeat
        #: ``waiting_for_groups``).
        self.waiting = False
        log_event(
            "replica_joining", group=group, rank=group_rank, lighthouse=lighthouse, min_replicas=min_replicas, host=host
        )

    def start_step(self, *, consumed_of: Callable[[], int], batch_size: int, unit: int) -> Share:
        """Join this step's quorum (healing from a live peer first if we are behind) and return
        our share of the step's global batch; ``consumed_of`` is read after a heal."""
        before = self.manager.current_step()
        self._aborted = False
        t0 = time.monotonic()
        with self._exchange():
            self.manager.start_quorum()
        self.quorum_s = time.monotonic() - t0
        after = self.manager.current_step()
        rank = self.manager.participating_rank()
        participants = self.manager.num_participants()
        if after != before:
            self.heals += 1
            log_event(
                "replica_healed",
                group=self.group,
                from_step=before,
                to_step=after,
                source="live peer",
                participants=participants,
            )
        if rank is None:
            raise RuntimeError(
                "torchft quorum: this replica group is not participating; spare groups are not supported"
            )
        return plan_share(
            consumed=consumed_of(), batch_size=batch_size, unit=unit, rank=rank, participants=participants
        )

    def reduce_gradients(self, params: Iterable[torch.nn.Parameter], weight: float) -> None:
        """Gradients := sum over participating groups of (share of the batch x group mean).
        A failed collective is recorded by the Manager and fails this step's commit."""
        from torch.distributed import ReduceOp

        # from here to the commit this group waits on the others: the torchft collectives and
        # the in-group ones between them (clipping, the loss), which a rank reaches only as its
        # own torchft collective ends (``waiting`` until :meth:`commit` returns)
        self.waiting = True
        works = []
        for p in params:
            g = p.grad
            if g is None:
                continue
            local = g.to_local() if isinstance(g, DTensor) else g
            local.mul_(weight)
            works.append(self.manager.allreduce(local, reduce_op=ReduceOp.SUM))
        for w in works:
            w.wait()
        self._abort_if_errored()

    def reduce_scalar(self, value: torch.Tensor, weight: float) -> float:
        from torch.distributed import ReduceOp

        buf = value.detach().float().reshape(1).clone() * weight
        self.manager.allreduce(buf, reduce_op=ReduceOp.SUM).wait()
        self._abort_if_errored()
        return float(buf[0])

    def _abort_if_errored(self) -> None:
        """After a failed cross-group collective, close this step's process group at once.

        torchft records the failure and skips the step's remaining collectives, but leaves the
        connections open: in its ring only the lost group's neighbours see the lost peer's
        connection close, and a survivor that waits for data from one of them (which gave up
        the step) would wait out the collective timeout while the Lighthouse waits for it to
        join. Aborting closes our connections, so every peer waiting on us fails now too, asks
        for the next quorum, and the Lighthouse (which starts a new quorum id after a commit
        failure) has torchft build a new process group for it."""
        err = self.manager.errored()
        if err is None or self._aborted:
            return
        self._aborted = True
        log_event(
            "replica_collective_failed", group=self.group, rank=self.group_rank, error=str(err.original_exception)[:300]
        )
        self.pg.abort()

    def commit(self) -> bool:
        """Whether this step may be applied (every collective of it succeeded, enough groups)."""
        with self._exchange():
            ok = bool(self.manager.should_commit())
        if not ok:
            self.failed_steps += 1
        return ok

    @contextlib.contextmanager
    def _exchange(self) -> Iterator[None]:
        self.waiting = True
        try:
            yield
        finally:
            self.waiting = False

    def leave(self, step: int) -> None:
        """Leave the quorum for good after committing ``step`` (a planned move; the operator
        replaces this group): the Manager stops, so its heartbeats to the Lighthouse end and the
        other groups' next quorum leaves this group out once the Lighthouse's heartbeat timeout
        has passed (torchft has no leave request). Between steps nothing of this group is in
        flight with the others, so none of their steps fails for it."""
        log_event("replica_left", group=self.group, rank=self.group_rank, step=step)
        self.left = True
        self.manager.shutdown(wait=False)

    def set_step(self, step: int) -> None:
        """After a restore from a checkpoint tier: the quorum's step is the restored one."""
        self.manager.load_state_dict({"step": step, "batches_committed": self.manager.batches_committed()})

    def close(self) -> None:
        if not self.left:
            self.manager.shutdown(wait=False)


def group_from_env(env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(this group's index, the Lighthouse address) from the pod's environment."""
    e = os.environ if env is None else env
    problems = []
    group = podenv.REPLICA_GROUP.raw(e)
    lighthouse = podenv.LIGHTHOUSE.get(e)
    if not group.isdigit():
        problems.append(
            f"{podenv.REPLICA_GROUP.name}: {group!r} is not this replica group's index (a whole number); the operator "
            "sets it for faultTolerance.mode ReplicaGroups"
        )
    if not lighthouse:
        problems.append(
            f"{podenv.LIGHTHOUSE.name}: empty; give the Lighthouse's address (http://HOST:PORT of `railyard-train "
            "lighthouse`)"
        )
    if problems:
        raise ConfigError(problems)
    return int(group), lighthouse


# --------------------------------------------------------------------------- the Lighthouse


def lighthouse_main(argv: Sequence[str] | None = None) -> int:
    """``railyard-train lighthouse``: torchft's Lighthouse (the quorum server) in the trainer
    image, printing its address as an event and stopping on SIGTERM/SIGINT."""
    p = argparse.ArgumentParser(
        prog="railyard-train lighthouse", description="torchft Lighthouse for faultTolerance.mode ReplicaGroups"
    )
    p.add_argument(
        "--min-replicas",
        type=int,
        required=True,
        help="fewest replica groups that form a quorum (faultTolerance.minReplicas)",
    )
    p.add_argument("--bind", default="[::]:29510", help="address to listen on (port 0: any free port)")
    p.add_argument(
        "--join-timeout-ms",
        type=int,
        default=lighthouse_join_timeout_ms(DEFAULT_WATCHDOG_SECONDS),
        help="how long a quorum waits for the previous members to join again (default: the operator's rule for "
        "the default trainer.watchdogSeconds, protocol/trainerconfig.py lighthouse_join_timeout_ms)",
    )
    p.add_argument(
        "--heartbeat-timeout-ms",
        type=int,
        default=lighthouse_heartbeat_timeout_ms(),
        help="a group with no heartbeat for this long is dead",
    )
    p.add_argument("--quorum-tick-ms", type=int, default=100)
    args = p.parse_args(argv)
    from torchft.coordination import LighthouseServer

    server = LighthouseServer(bind=args.bind, min_replicas=args.min_replicas, join_timeout_ms=args.join_timeout_ms,
                              quorum_tick_ms=args.quorum_tick_ms, heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log_event("lighthouse", address=server.address(), min_replicas=args.min_replicas)
    sys.stdout.flush()
    stop.wait()
    server.shutdown()
    logging.getLogger(__name__).info("lighthouse stopped")
    return 0
