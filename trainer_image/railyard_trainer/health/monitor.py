"""The health monitor the train loop calls (hooks.HealthMonitor): SDC checks and heartbeats.

Per step (cheap, local): the parameter magnitude guard across the optimizer step and at rest,
and the gradient-norm spike detector, which triggers a collective replay of the step (every
layout: the train loop provides ``ctx.extra["replay_step"]``, pipelines included). Every
``sdc.intervalSteps`` steps, before the first step and before every checkpoint (collective,
:meth:`RailyardHealthMonitor.verify`): the known-answer test, the cross-replica checksums
(over every mesh dimension a parameter is replicated along: HSDP replicas, and the tensor
parallel group for norms) and a finiteness check of the optimizer state.

Verdicts are agreed: a rank that confirms corruption locally tells the others at the next
agreement point (one small all-reduce), so every rank raises :class:`hooks.SDCDetected`
together (the launcher exits SDC_DETECTED) instead of leaving peers in a collective. A check
that fails without confirming taints the attempt: every later state derives from the suspect
step, so :meth:`~RailyardHealthMonitor.checks_passed` stays false (and no later checkpoint is
marked sdc_passed) until the gang restarts from a clean checkpoint.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from railyard.protocol import podenv
from railyard.protocol.heartbeat import CheckpointEvent, HealthResult
from railyard.protocol.trainerconfig import Health, parse
from railyard_trainer.health.checks import (
    bit_sums,
    known_answer_checksum,
    local_tensor,
    magnitude_jumps,
    max_abs_per_tensor,
    odd_ones_out,
    tensor_checksum,
)
from railyard_trainer.health.client import BeatSender, PodAggregator
from railyard_trainer.health.reporter import Reporter
from railyard_trainer.health.spike import SpikeDetector
from railyard_trainer.hooks import SDCDetected, StepMetrics, TrainContext

log = logging.getLogger(__name__)


_DEFAULT = Health()


@dataclass
class HealthSettings:
    """What the monitor runs. The job's settings (``spec.health``) come from the shared schema
    (:class:`railyard.protocol.trainerconfig.Health`, :meth:`from_config`); the switches below
    them are for the SDC harness and tests, not part of the job's spec."""

    url: str = ""
    token: str = ""
    interval_s: float = _DEFAULT.heartbeat_interval_seconds
    sdc_interval_steps: int = _DEFAULT.sdc.interval_steps
    replay_on_spike: bool = _DEFAULT.sdc.replay_on_spike
    kat: bool = True
    replica_check: bool = True
    magnitude_guard: bool = True
    spike_z: float = 8.0
    #: Relative difference between a step and its replay that counts as a mismatch.
    replay_tolerance: float = 1e-3
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, health: Health | Mapping[str, Any] | None, env: Mapping[str, str]) -> HealthSettings:
        """``health``: the config's :class:`Health` (or its camelCase form, as in config.json)."""
        h = health if isinstance(health, Health) else parse(Health, health, where="health")
        return cls(
            url=podenv.HEARTBEAT_URL.get(env),
            token=podenv.HEARTBEAT_TOKEN.get(env),
            interval_s=h.heartbeat_interval_seconds,
            sdc_interval_steps=h.sdc.interval_steps,
            replay_on_spike=h.sdc.replay_on_spike,
        )


ReplayFn = Callable[[], tuple[float, float]]


class RailyardHealthMonitor:
    """The checks; what they find goes out through the rank's :class:`Reporter` (the SDK's, in
    ``ctx.extra["reporter"]``, or one of its own when used alone). Heartbeat steps are the train
    loop's to report (``railyard_trainer.sdk.report_step``), not the monitor's."""

    def __init__(self, settings: HealthSettings, ctx: TrainContext, *, reporter: Reporter | None = None) -> None:
        self.s = settings
        self.rank, self.node = ctx.rank, ctx.node
        self.grad_spikes = SpikeDetector(z_threshold=settings.spike_z)
        self.loss_spikes = SpikeDetector(z_threshold=settings.spike_z)
        #: max |g| / ||g|| of this rank's gradients: one flipped element dominates the norm.
        self.conc_spikes = SpikeDetector(z_threshold=settings.spike_z, early_ratio=8.0)
        self.runs: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        #: The first failed check of this attempt that could mean corruption (persistent).
        self._taint: str | None = None
        #: A failed check that concerns only this step (a loss spike without a gradient spike).
        self._step_failed = False
        #: A corruption this rank confirmed, raised on every rank at the next agreement point.
        self._verdict: SDCDetected | None = None
        self._verdict_kind = ""
        self._checked_at = -1
        self._kat_reference: int | None = None
        self._after_step_max: list[float] | None = None
        self._before_step_max: list[float] | None = None
        self._after_step_sums: list[int] | None = None
        self._lock = threading.Lock()
        #: faultTolerance ReplicaGroups: fingerprint the state for the operator's cross-group vote.
        ft = getattr(getattr(ctx, "config", None), "fault_tolerance", None)
        self._group_fingerprints = getattr(ft, "mode", "None") == "ReplicaGroups"
        given = reporter if reporter is not None else ctx.extra.get("reporter")
        self._owns_reporter = not isinstance(given, Reporter)
        self.reporter: Reporter = given if isinstance(given, Reporter) else Reporter(
            rank=ctx.rank, local_rank=ctx.local_rank, pod_index=ctx.pod_index, node=ctx.node, job=ctx.job,
            namespace=getattr(ctx.config, "namespace", "default"), attempt=ctx.attempt,
            url=settings.url, token=settings.token, interval_s=settings.interval_s, progress=True,
        )

    @property
    def aggregator(self) -> PodAggregator | None:
        return self.reporter.aggregator

    @property
    def sender(self) -> BeatSender | None:
        return self.reporter.sender

    # ------------------------------------------------------------------ hooks
    def preflight(self, ctx: TrainContext) -> None:
        self._bind_saving(ctx)
        # after a restore the first beats report the restored step, not 0
        self.reporter.set_step(ctx.step)
        restore = ctx.extra.get("restore")
        tier = getattr(restore, "tier", None) if restore is not None else None
        if tier:
            self.note_restore(str(tier), int(getattr(restore, "step", -1)))
        self._periodic_checks(ctx)
        self._settle(ctx)
        if self.s.magnitude_guard:
            self._after_step_max = max_abs_per_tensor(_params(ctx))
            self._after_step_sums = bit_sums(_params(ctx))
        self.reporter.send(force=True)

    def after_backward(self, ctx: TrainContext, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        step = ctx.step
        if self.s.magnitude_guard:
            sums = bit_sums(_params(ctx))
            prev = self._after_step_sums
            if prev is not None and len(prev) == len(sums):
                changed = [i for i, (a, b) in enumerate(zip(prev, sums, strict=True)) if a != b]
                self._record("state_guard", step, not changed)
                if changed:
                    self._confirmed(
                        ctx,
                        "state_guard",
                        step,
                        f"parameter {_name(ctx, changed[0])} changed at rest between steps (its bits no longer match)",
                        ctx.rank,
                    )
            # Unchanged since after_step: its maxima are the ones before this optimizer step.
            self._before_step_max = self._after_step_max
        gn = float(grad_norm)
        spike = self.grad_spikes.check(gn, "grad norm")
        conc = _concentration(_params(ctx))
        cspike = self.conc_spikes.check(conc, "largest gradient element's share of the norm")
        self.runs["spike"] += 1
        # One agreement for both: a verdict from the state guard, and a spike (the norm is
        # global but the concentration is this rank's) that needs a collective replay.
        verdict, spiked = self._agree(ctx, spike.spike or cspike.spike)
        if verdict is not None:
            raise verdict
        if spiked:
            self._suspect(ctx, step, spike.detail or cspike.detail or "a peer rank saw a gradient spike", gn)
            self._settle(ctx)
        else:
            self.grad_spikes.accept(gn)
            self.conc_spikes.accept(conc)
        lv = float(loss)
        ls = self.loss_spikes.check(lv, "loss") if lv != 0.0 else None
        if ls is not None and ls.spike and not spike.spike:
            self._fail("spike", step, f"loss spike without a gradient spike: {ls.detail}", persistent=False)
        elif ls is not None:
            self.loss_spikes.accept(lv)

    def after_step(self, ctx: TrainContext, metrics: StepMetrics) -> None:
        step = metrics.step
        if self.s.magnitude_guard:
            now_max = max_abs_per_tensor(_params(ctx))
            before = self._before_step_max
            if before is not None and len(before) == len(now_max):
                jumps = magnitude_jumps(before, now_max)
                self._record("magnitude_guard", step, not jumps)
                if jumps:
                    i = jumps[0]
                    self._confirmed(
                        ctx,
                        "magnitude_guard",
                        step,
                        f"optimizer step moved {_name(ctx, i)} max |p| {before[i]:.3g} -> {now_max[i]:.3g}, beyond "
                        "any update",
                        ctx.rank,
                    )
            self._after_step_max = now_max
            self._after_step_sums = bit_sums(_params(ctx))
        if step % self.s.sdc_interval_steps == 0:
            self._periodic_checks(ctx)
        self._settle(ctx)

    def verify(self, ctx: TrainContext, *, force: bool = False) -> None:
        """Before a checkpoint of this step: the collective checks (unless they just ran at this
        step; ``force``: even then, as an explicit SDK ``health_check`` asks), the optimizer
        state's finiteness, and one agreement, so every rank (and the rank that writes the
        manifest) holds the same verdict on the state about to be saved."""
        if force or self._checked_at != ctx.step:
            self._periodic_checks(ctx)
        self._optimizer_state(ctx)
        verdict, (taint, step_failed) = self._agree_all(ctx, self._taint is not None, self._step_failed)
        if verdict is not None:
            raise verdict
        if taint and self._taint is None:
            self._taint = f"step {ctx.step}: a peer rank's checks failed"
        self._step_failed = self._step_failed or step_failed

    def checks_passed(self) -> bool:
        """The state at this step may be marked clean: this step's checks passed and nothing
        that could mean corruption failed earlier in this attempt."""
        with self._lock:
            ok = self._taint is None and not self._step_failed
            self._step_failed = False
        return ok

    def params_replaced(self, ctx: TrainContext) -> None:
        """The parameters were replaced on purpose between steps (a replica group healed from a
        live peer at a step's quorum): the at-rest guards start again from them, as after a
        restore. Without it the next step's state guard saw the peer's bits as a change at rest."""
        if self.s.magnitude_guard:
            self._after_step_max = max_abs_per_tensor(_params(ctx))
            self._after_step_sums = bit_sums(_params(ctx))

    def reset_after_restore(self) -> None:
        """Forget this attempt's failures (the SDC harness restores a clean snapshot in place,
        as a restarted gang would from a clean checkpoint)."""
        with self._lock:
            self._taint, self._step_failed, self._verdict = None, False, None

    def close(self) -> None:
        if self._owns_reporter:
            self.reporter.close()
        else:
            self.reporter.send(force=True)

    # ------------------------------------------------------------------ reporting API
    def note_checkpoint(self, event: CheckpointEvent) -> None:
        """The checkpointer reports a committed (or failed) save; forwarded to the operator."""
        self.reporter.note_checkpoint(event)

    def note_restore(self, tier: str, step: int) -> None:
        self.reporter.note_restore(tier, step)

    # ------------------------------------------------------------------ checks
    def _periodic_checks(self, ctx: TrainContext) -> None:
        self._checked_at = ctx.step
        if self.s.kat:
            self._known_answer(ctx)
        if self.s.replica_check:
            self._replicas(ctx)
        if self._group_fingerprints:
            self._fingerprint(ctx)

    def _optimizer_state(self, ctx: TrainContext) -> None:
        """Adam's moments must be finite: an inf/NaN there (a corrupted gradient squared into
        exp_avg_sq) stops moving its parameter without changing it, so no parameter check sees it."""
        bad = _nonfinite_optimizer_state(ctx)
        self._record("optimizer_state", ctx.step, bad is None)
        if bad is not None:
            self._fail("optimizer_state", ctx.step, f"optimizer state {bad} holds non-finite values")

    def _known_answer(self, ctx: TrainContext) -> None:
        step = ctx.step
        device = _device(ctx)
        value = known_answer_checksum(device)
        own_changed = self._kat_reference is not None and value != self._kat_reference
        if self._kat_reference is None:
            self._kat_reference = value
        values = _all_gather_int(value, device, None)
        bad, majority = odd_ones_out(values)
        if majority and not bad and not own_changed:
            self._record("kat", step, True)
            return
        if majority and bad:
            suspect = bad[0]
            self._confirmed(
                ctx,
                "kat",
                step,
                f"known-answer checksum of rank {suspect} differs from the majority of {len(values)} ranks",
                suspect,
            )
        if own_changed:
            self._confirmed(
                ctx, "kat", step, "known-answer checksum differs from this rank's own earlier result", ctx.rank
            )
        self._fail(
            "kat",
            step,
            f"known-answer checksums disagree with no majority ({len(set(values))} distinct values in {len(values)} "
            "ranks)",
        )

    def _replicas(self, ctx: TrainContext) -> None:
        """Per mesh dimension, the parameters replicated along it must be bit-identical across
        its group. A majority names the odd rank; a tie (two replicas) is corruption all the
        same (replicas run the same arithmetic), only without a name."""
        for dim_name, group, tensors in _replicated_sets(ctx):
            if not tensors:
                continue
            device = _device(ctx)
            value = tensor_checksum(tensors)
            values = _all_gather_int(value, device, group)
            bad, majority = odd_ones_out(values)
            kind = "replica_checksum"
            if not bad:
                self._record(kind, ctx.step, True)
                continue
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(len(values)))
            if majority:
                suspect = ranks[bad[0]]
                self._confirmed(
                    ctx,
                    kind,
                    ctx.step,
                    f"parameters replicated over {dim_name!r} differ on rank {suspect} from the majority of "
                    f"{len(ranks)}",
                    suspect,
                )
            else:
                self._confirmed(
                    ctx,
                    kind,
                    ctx.step,
                    f"parameters replicated over {dim_name!r} differ between ranks {ranks}; no majority names the bad "
                    "one",
                    -1,
                )
            return

    def _fingerprint(self, ctx: TrainContext) -> None:
        """faultTolerance ReplicaGroups: this rank's parameters and optimizer moments are the same
        bits as those of the same rank of every other group (a world of its own, one replica,
        so :meth:`_replicas` has nothing to compare). Their checksum goes into the heartbeats;
        the operator compares the groups' (logic/health/groups.py) and evicts the group that
        differs from the majority."""
        moments = _optimizer_moments(ctx)
        tensors: list[torch.Tensor] = []
        for p in _params(ctx):
            tensors.append(p)
            tensors.extend(moments.get(id(p), ()))
        value = tensor_checksum(tensors) & ((1 << 64) - 1)
        self.runs["group_fingerprint"] += 1
        self.reporter.set_fingerprint(ctx.step, f"{value:016x}")

    def _suspect(self, ctx: TrainContext, step: int, detail: str, orig: float) -> None:
        """A spike: replay the step on the same batch (all ranks together) to confirm."""
        replay = _replay_fn(ctx) if self.s.replay_on_spike else None
        if replay is None:
            self._fail("spike", step, f"{detail}; no replay available to confirm")
            return
        params = _params(ctx)
        saved = [p.grad for p in params]
        orig_local = _local_sq(saved)
        for p in params:
            p.grad = None
        _, replay_norm = replay()
        replay_local = _local_sq([p.grad for p in params])
        self.runs["replay"] += 1
        # Agreed: with replicas (HSDP, TP-replicated norms) a corrupted local gradient makes
        # the ranks' norms differ, and every rank must take the same branch below.
        reproduced = not _any_rank(not _close(orig, replay_norm, self.s.replay_tolerance), _device(ctx))
        if reproduced:
            for p, g in zip(params, saved, strict=True):
                p.grad = g
            # Deterministic arithmetic gave the same norm twice: a real spike, not corruption.
            self._record("replay", step, True)
            log.info("step %d: %s; the replay reproduced it (a real spike, not corruption)", step, detail)
            return
        ratio = math.inf if not math.isfinite(orig_local) else orig_local / max(replay_local, 1e-300)
        ratios = _all_gather_float(ratio, _device(ctx))
        suspect = max(range(len(ratios)), key=lambda i: ratios[i]) if len(set(ratios)) > 1 or len(ratios) == 1 else -1
        self._confirmed(ctx, "replay", step, f"{detail}; the replay gives grad norm {replay_norm:.4g}", suspect)

    # ------------------------------------------------------------------ bookkeeping
    def _record(self, kind: str, step: int, ok: bool) -> None:
        self.runs[kind] += 1
        if ok and kind in ("kat", "replica_checksum", "replay"):
            self.reporter.add_result(HealthResult(kind, True, step))

    def _fail(
        self, kind: str, step: int, detail: str, *, suspect: int = -1, confirmed: bool = False, persistent: bool = True
    ) -> None:
        self.failures[kind] += 1
        log.warning("health check %s failed at step %d: %s", kind, step, detail)
        with self._lock:
            if persistent and self._taint is None:
                self._taint = f"step {step}: {kind}: {detail}"
            self._step_failed = True
        self.reporter.add_result(
            HealthResult(kind, False, step, detail[:500], suspect_rank=suspect, confirmed=confirmed)
        )

    def _confirmed(self, ctx: TrainContext, kind: str, step: int, detail: str, suspect: int) -> None:
        """Corruption for certain: report it at once; it is raised at the next agreement
        point, on every rank together (``suspect`` -1: which rank is unknown)."""
        self._fail(kind, step, detail, suspect=suspect, confirmed=suspect >= 0)
        self.reporter.send(force=True, urgent=True)
        self.reporter.flush()
        if self._verdict is None:
            node = ctx.node if suspect == ctx.rank else ""
            self._verdict = SDCDetected(f"{kind}: {detail}", rank=suspect, node=node, step=step)
            self._verdict_kind = kind

    def _agree_all(self, ctx: TrainContext, *flags: bool) -> tuple[SDCDetected | None, tuple[bool, ...]]:
        """One all-reduce (MAX) over the world: is there a verdict anywhere (and whose, which
        check), and each flag ORed over the ranks. Every rank calls it at the same points."""
        world = dist.get_world_size() if _dist_on() else 1
        v = self._verdict
        code = 0 if v is None else _VERDICT_KINDS.index(self._verdict_kind) + 1
        vec = [code, world - v.rank if v is not None and v.rank >= 0 else 0, *(int(f) for f in flags)]
        if _dist_on():
            t = torch.tensor(vec, dtype=torch.int64, device=_device(ctx))
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            vec = [int(x) for x in t.tolist()]
        verdict = None
        if vec[0]:
            self._verdict = None
            if v is not None:
                verdict = v
            else:
                kind = _VERDICT_KINDS[vec[0] - 1]
                suspect = world - vec[1] if vec[1] else -1
                verdict = SDCDetected(
                    f"{kind}: confirmed by a peer rank (suspect rank {suspect})", rank=suspect, step=ctx.step
                )
        return verdict, tuple(bool(x) for x in vec[2:])

    def _agree(self, ctx: TrainContext, flag: bool) -> tuple[SDCDetected | None, bool]:
        verdict, (any_flag,) = self._agree_all(ctx, flag)
        return verdict, any_flag

    def _settle(self, ctx: TrainContext) -> None:
        """Agreement point: raise a verdict confirmed on any rank, on every rank."""
        verdict, _ = self._agree_all(ctx)
        if verdict is not None:
            raise verdict

    def _bind_saving(self, ctx: TrainContext) -> None:
        cp = ctx.extra.get("checkpointer")
        is_saving = getattr(cp, "is_saving", None)
        if callable(is_saving):
            self.reporter.add_saving_probe(is_saving)


# ---------------------------------------------------------------------- helpers
#: Checks whose confirmed verdict travels to the other ranks by index (see _agree_all).
_VERDICT_KINDS = ("kat", "replica_checksum", "state_guard", "magnitude_guard", "replay", "optimizer_state")


def _params(ctx: TrainContext) -> list[torch.Tensor]:
    return [p for m in ctx.model_parts for p in m.parameters()]


def _name(ctx: TrainContext, i: int) -> str:
    names = [n for m in ctx.model_parts for n, _ in m.named_parameters()]
    return names[i] if 0 <= i < len(names) else f"#{i}"


def _device(ctx: TrainContext) -> torch.device:
    dev = ctx.extra.get("device")
    if isinstance(dev, torch.device):
        return dev
    ps = _params(ctx)
    return ps[0].device if ps else torch.device("cpu")


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


def _all_gather_int(value: int, device: torch.device, group: Any) -> list[int]:
    if not _dist_on():
        return [value]
    t = torch.tensor([value], dtype=torch.int64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t, group=group)
    return [int(x.item()) for x in out]


def _all_gather_float(value: float, device: torch.device) -> list[float]:
    if not _dist_on():
        return [value]
    t = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(x.item()) for x in out]


def _any_rank(flag: bool, device: torch.device) -> bool:
    if not _dist_on():
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


@torch.no_grad()
def _concentration(params: list[torch.Tensor]) -> float:
    """Largest |gradient element| over the L2 norm of this rank's gradients (1.0 if one dominates)."""
    grads = [local_tensor(p.grad).detach() for p in params if p.grad is not None]
    grads = [g for g in grads if g.numel()]
    if not grads:
        return 0.0
    maxes = torch._foreach_norm(grads, float("inf"))
    l2s = torch._foreach_norm(grads, 2.0)
    top = float(torch.stack([m.float() for m in maxes]).max())
    total = float(torch.stack([n.double() for n in l2s]).pow(2).sum().sqrt())
    if not (math.isfinite(top) and math.isfinite(total)):
        return math.inf
    return top / total if total > 0 else 0.0


def _local_sq(grads: list[torch.Tensor | None]) -> float:
    total = 0.0
    for g in grads:
        if g is None:
            continue
        x = local_tensor(g).detach().double()
        total += float((x * x).sum())
    return total


def _close(a: float, b: float, tol: float) -> bool:
    if not (math.isfinite(a) and math.isfinite(b)):
        return a == b or (a != a and b != b)
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-12)


def _replay_fn(ctx: TrainContext) -> ReplayFn | None:
    """The loop's ``extra["replay_step"]``, or a replay of ``extra["batch"]`` without pipelining."""
    fn = ctx.extra.get("replay_step")
    if callable(fn):
        return fn  # type: ignore[no-any-return]
    batch = ctx.extra.get("batch")
    if batch is None or len(ctx.model_parts) != 1 or getattr(ctx.dims, "pp_enabled", False):
        return None
    inputs, labels = batch

    def replay() -> tuple[float, float]:
        from railyard_trainer.model import cross_entropy_loss

        part = ctx.model_parts[0]
        with torch.enable_grad():
            loss = cross_entropy_loss(part(inputs), labels)
            loss.backward()  # type: ignore[no-untyped-call]
        return float(loss.detach()), _global_grad_norm(ctx)

    return replay


def _global_grad_norm(ctx: TrainContext) -> float:
    """The total gradient norm exactly as the train loop computes it (so a clean replay
    reproduces it): the loop's own norm function without clipping."""
    from railyard_trainer.grads import clip_grad_norm_

    return float(clip_grad_norm_(ctx.model_parts, 0.0, pp_group=None))


def _replicated_sets(ctx: TrainContext) -> list[tuple[str, Any, list[torch.Tensor]]]:
    """Per dimension of the world mesh: its process group and the local tensors that must be
    bit-identical along it. A parameter is replicated along a dimension when its DTensor
    placement there is ``Replicate`` (HSDP's ``dp_replicate``), or when its mesh does not
    include that dimension at all: the norms under tensor parallelism are plain tensors (or
    DTensors over ``dp`` only) that every rank of the TP group holds whole. Pipeline stages
    hold different parameters and are never compared."""
    mesh = ctx.mesh
    if mesh is None or not _dist_on():
        return []
    names = tuple(mesh.mesh_dim_names or ())
    dims = [n for n in names if n != "pp" and mesh[n].size() > 1]
    if not dims:
        return []
    # A flattened "dp" stands for the HSDP pair it was made from.
    covers = {
        "dp": {"dp", "dp_replicate", "dp_shard"},
        "dp_replicate": {"dp_replicate", "dp"},
        "dp_shard": {"dp_shard", "dp"},
    }
    sets: dict[str, list[torch.Tensor]] = {d: [] for d in dims}
    # A parameter's optimizer moments are replicated exactly as it is: a corrupted gradient that
    # reached exp_avg / exp_avg_sq but moved the parameter by less than an ulp shows there.
    moments = _optimizer_moments(ctx)
    for p in _params(ctx):
        placements = getattr(p, "placements", None)
        pnames: tuple[str, ...] = tuple(p.device_mesh.mesh_dim_names or ()) if placements is not None else ()  # type: ignore[attr-defined]
        present: set[str] = set()
        for n in pnames:
            present |= covers.get(n, {n})
        for d in dims:
            if d in pnames:
                i = pnames.index(d)
                if placements[i].is_replicate():  # type: ignore[index]
                    sets[d].append(p)
                    sets[d].extend(moments.get(id(p), ()))
            elif d not in present:
                sets[d].append(p)
                sets[d].extend(moments.get(id(p), ()))
    return [(d, mesh[d].get_group(), sets[d]) for d in dims if sets[d]]


def _optimizer_moments(ctx: TrainContext) -> dict[int, list[torch.Tensor]]:
    """id(parameter) -> its optimizer state tensors (Adam's moments), in a fixed order."""
    opt = ctx.optimizer
    if opt is None:
        return {}
    out: dict[int, list[torch.Tensor]] = {}
    for o in getattr(opt, "inner", None) or [opt]:
        for param, st in o.state.items():
            out[id(param)] = [
                st[k]
                for k in sorted(st)
                if isinstance(st[k], torch.Tensor) and st[k].is_floating_point() and st[k].numel() > 1
            ]
    return out


def _nonfinite_optimizer_state(ctx: TrainContext) -> str | None:
    """The name of the first optimizer state tensor with a non-finite element, or None."""
    opt = ctx.optimizer
    if opt is None:
        return None
    inners = getattr(opt, "inner", None) or [opt]
    names = {id(p): n for m in ctx.model_parts for n, p in m.named_parameters()}
    tensors: list[tuple[str, torch.Tensor]] = []
    for o in inners:
        for param, st in o.state.items():
            for key, v in st.items():
                if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1:
                    tensors.append((f"{names.get(id(param), '?')}.{key}", local_tensor(v).detach()))
    if not tensors:
        return None
    finite = (
        torch.stack(
            [t.isfinite().all() if t.numel() else torch.ones((), dtype=torch.bool, device=t.device) for _, t in tensors]
        )
        .cpu()
        .tolist()
    )
    return next((name for (name, _), ok in zip(tensors, finite, strict=True) if not ok), None)
