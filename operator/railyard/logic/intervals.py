"""Each checkpoint tier's save interval, chosen by rule where the spec leaves it open.

A save stalls training for its snapshot (``C`` seconds per save); a failure throws away the work
since the newest checkpoint it can restore from (half an interval on average). Young (1974) and
Daly (2006) give the interval that minimises the two together: ``T = sqrt(2 C M)`` to first
order, ``M`` the mean time between the failures that checkpoint is restored after. Daly's
higher-order form, used here, corrects it where ``C`` is not small against ``M``.

Each tier is restored after its own kind of failure, so each gets its own ``M`` (docs/checkpoints.md,
"Intervals chosen by rule"):

- a failure that leaves the node (a software bug) is restored from the memory tier;
- a lost node (quarantined, its pod replaced) from the memory tier when it replicates (its shard's
  copy on the replica peer), else from the shared tier (the node's disk is gone with it);
- a silent data corruption needs a checkpoint from before it, older than the memory tier keeps by
  default: the local and the shared tier (both: the local tier's kept window may not reach back
  past the last passed check, and then the shared tier is the source).

With replica groups (faultTolerance ReplicaGroups) a lost group heals from a live peer, so the
first two kinds need a tier only when more than ``dataReplicas - minReplicas`` groups are down at
once (:func:`compute_beyond_groups`, the chance that a failure finds that many of the other
groups still out); a corruption reached every group through the cross-group reduction and stops
the whole job as before. Their rate is much lower, so the intervals get longer.

The interval in steps is ``T`` over the step time, rounded; at least the tier's background save
(a save that falls due while the previous one is still written is skipped), at most
:data:`MAX_INTERVAL_S`. A tier restored after a corruption saves on the SDC checks' steps (a
multiple of ``health.sdc.intervalSteps``), so that the checkpoint a corruption is restored from is
the one at the last check that passed; the others save at a multiple of the most frequent tier's
interval, so that their saves fall on a step whose snapshot is taken anyway (one snapshot serves
every tier due at a step).
A value the spec sets wins. Inputs with no measurement get defaults with their source (below);
``railyard plan`` prints each interval with its inputs, the operator writes them into config.json
(:func:`resolve_checkpoint`), and the simulator (railyard.sim) calls :func:`decide_intervals` with
its scenario's costs and failure rates. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from railyard.api.trainingjob import Checkpoint, TrainingJobSpec

Tier = Literal["memory", "local", "shared"]
TIERS: tuple[Tier, ...] = ("memory", "local", "shared")
#: How a failure leaves the tiers: the node stays (its RAM and disk), the node is lost, or the
#: state was silently corrupted some steps before it was found.
Kind = Literal["process", "node", "corruption"]


@dataclass(frozen=True, slots=True)
class Sourced:
    """A number and where it comes from: a measurement, a paper, the spec, a reason."""

    value: float
    source: str


# --------------------------------------------------------------------------- defaults

_LLAMA3 = "Llama 3 Table 5 (54 days, 16,384 GPUs)"
_LLAMA3_GPU_HOURS = 54 * 24 * 16_384
#: Llama 3 Table 5 (Dubey et al. 2024, §3.3.4): 419 unexpected interruptions in 54 days on 16,384
#: GPUs, split by what the operator's classification (logic/failures.py) does with each cause:
#: 56 leave the node (software bug 54, dependency 2), 6 are silent data corruptions, the other
#: 357 quarantine and replace a node. tests/operator/test_checkpoint_intervals_by_rule.py checks
#: the split against the simulator's table of causes.
FAILURES_PER_GPU_HOUR: Mapping[Kind, Sourced] = {
    "process": Sourced(56 / _LLAMA3_GPU_HOURS, f"{_LLAMA3}: 56 of 419 interruptions leave the node"),
    "node": Sourced(357 / _LLAMA3_GPU_HOURS, f"{_LLAMA3}: 357 of 419 interruptions take a node"),
    "corruption": Sourced(6 / _LLAMA3_GPU_HOURS, f"{_LLAMA3}: 6 silent data corruptions"),
}
_BENCH = "bench/results/checkpoint.json"
#: Measured by bench/checkpoint.py (preset small, 2 CPU cores): the step time, each tier's stall
#: per save (the snapshot; the parameters are copied beside the next step) and how long its
#: background write takes. A job's own figures, where known, are better: ``railyard plan
#: --step-time/--save-stall`` shows what they give, and the spec's intervals win.
STEP_S = Sourced(2.130226, f"{_BENCH} step_time_median")
SAVE_STALL_S: Mapping[Tier, Sourced] = {
    "memory": Sourced(0.012446, f"{_BENCH} memory_blocked_per_save_median"),
    "local": Sourced(0.012105, f"{_BENCH} local_blocked_per_save_median"),
    "shared": Sourced(0.012105, f"{_BENCH} shared_blocked_per_save_median"),
}
SAVE_DURATION_S: Mapping[Tier, Sourced] = {
    "memory": Sourced(2.673118, f"{_BENCH} memory_save_background_beside_training"),
    "local": Sourced(0.660684, f"{_BENCH} local_save_duration_background"),
    "shared": Sourced(1.440214, f"{_BENCH} shared_save_duration_background"),
}
#: How long a lost replica group is out: the last step before the failure to the group healed,
#: measured on the local cluster (bench/replica_groups.py, R = 3; a tiny model: GPU clusters
#: take longer to start a group, which the simulator's own figure includes).
GROUP_OUTAGE_S = Sourced(
    6.041, "bench/results/replica_groups.json: R=3 replica_groups: last step before the failure -> group healed"
)
#: The longest interval the rule chooses: the failure rates are another fleet's (Llama 3), so at
#: most an hour of work rests on them; also what a tier that no listed failure needs gets.
MAX_INTERVAL_S = 3600.0

#: Which tiers survive each kind of failure, fastest first, and whether the fastest suffices
#: ("first") or each may be the source ("each"; a corruption may predate the local tier's kept
#: checkpoints). The memory tier survives a lost node only through its replica
#: (``memory.replicate``), and a restart only when pods keep their memory (``medium: HostPath``,
#: or ``Pod`` with in-place restarts): :func:`compute_protected_rates` drops it where it does not.
SERVED_BY: Mapping[Kind, tuple[Literal["first", "each"], tuple[Tier, ...]]] = {
    "process": ("first", ("memory", "local", "shared")),
    "node": ("first", ("memory", "shared")),
    "corruption": ("each", ("local", "shared")),
}
#: What each kind is, in the words ``railyard plan`` prints.
KIND_WORDS: Mapping[Kind, str] = {
    "process": "failures that leave the node",
    "node": "lost nodes",
    "corruption": "silent data corruptions",
}


# --------------------------------------------------------------------------- inputs and choices


@dataclass(frozen=True, slots=True)
class TierCost:
    """What one save of a tier costs: the stall (training waits) and the background write."""

    stall_s: Sourced
    duration_s: Sourced


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    """faultTolerance ReplicaGroups: ``replicas`` groups, at least ``min_replicas`` commit a step."""

    replicas: int
    min_replicas: int
    #: How long a lost group is out (detection, restart, heal from a peer).
    outage_s: Sourced = GROUP_OUTAGE_S


@dataclass(frozen=True, slots=True)
class IntervalInputs:
    """Everything the rule reads, each number with its source."""

    step_s: Sourced
    #: The enabled tiers and what a save of each costs.
    costs: Mapping[Tier, TierCost]
    #: Failures per hour of the whole job, by kind.
    failures_per_hour: Mapping[Kind, Sourced]
    groups: ReplicaGroups | None = None
    #: The memory tier's replica on the peer node (restores a lost node's shard).
    memory_replicates: bool = True
    #: The memory tier survives a restart (HostPath, or Pod with in-place restarts).
    memory_survives_restart: bool = True
    #: The intervals the spec sets: they win.
    spec_steps: Mapping[Tier, int] = field(default_factory=dict)
    #: ``health.sdc.intervalSteps``: the steps the SDC checks run at (None: no checks).
    sdc_interval_steps: int | None = None
    max_interval_s: float = MAX_INTERVAL_S


@dataclass(frozen=True, slots=True)
class IntervalChoice:
    """One tier's interval and why."""

    tier: Tier
    steps: int
    chosen_by: Literal["spec", "rule"]
    #: The failures per hour this tier is restored after, and what they are.
    failures_per_hour: float
    protects_against: str
    #: Daly's optimum in seconds before rounding (inf: no failure needs the tier).
    optimum_s: float
    stall_s: float
    reason: str


def compute_beyond_groups(groups: ReplicaGroups, failures_per_hour: float) -> float:
    """The chance that a failure of one group finds at least ``replicas - min_replicas`` of the
    other groups still out, so more than that many are down at once (the tiers' case).

    Each group fails at ``failures_per_hour / replicas`` and is out ``outage_s`` each time, so at
    a random moment it is out with probability ``p = rate x outage`` (small, and independent of
    the others): the tail of Binomial(replicas - 1, p) at ``replicas - min_replicas``."""
    tolerated = groups.replicas - groups.min_replicas
    if tolerated <= 0:
        return 1.0
    others = groups.replicas - 1
    if tolerated > others:
        return 0.0
    p = min(1.0, failures_per_hour / groups.replicas / 3600.0 * groups.outage_s.value)
    if p >= 1.0:
        return 1.0
    if p <= 0.0:
        return 0.0
    # sum_{j >= tolerated} C(others, j) p^j (1-p)^(others-j), term by term from the first (in
    # logs: the first term may be far below a float's range at thousands of groups)
    log_term = math.lgamma(others + 1) - math.lgamma(tolerated + 1) - math.lgamma(others - tolerated + 1)
    log_term += tolerated * math.log(p) + (others - tolerated) * math.log1p(-p)
    total, j = 0.0, tolerated
    while j <= others:
        term = math.exp(log_term)
        total += term
        if j == others or term < total * 1e-17:
            break
        log_term += math.log((others - j) / (j + 1)) + math.log(p) - math.log1p(-p)
        j += 1
    return min(1.0, total)


def compute_protected_rates(inputs: IntervalInputs) -> dict[Tier, tuple[float, list[str]]]:
    """Per enabled tier: the failures per hour it is restored after, and the words for them."""
    enabled = [t for t in TIERS if t in inputs.costs]
    rates: dict[Tier, float] = dict.fromkeys(enabled, 0.0)
    #: tier -> the kinds it serves (those replica groups contain first, the rest after)
    kinds: dict[Tier, tuple[list[str], list[str]]] = {t: ([], []) for t in enabled}
    groups = inputs.groups if inputs.groups is not None and inputs.groups.replicas > 1 else None
    beyond = 1.0
    if groups is not None:
        contained = sum(r.value for k, r in inputs.failures_per_hour.items() if k != "corruption")
        beyond = compute_beyond_groups(groups, contained)
    for kind, rate in inputs.failures_per_hour.items():
        how, tiers = SERVED_BY[kind]
        survivors = [t for t in tiers if t in rates]
        if "memory" in survivors and (
            not inputs.memory_survives_restart or (kind == "node" and not inputs.memory_replicates)
        ):
            survivors.remove("memory")
        by_groups = groups is not None and kind != "corruption"
        for tier in survivors if how == "each" else survivors[:1]:
            rates[tier] += rate.value * (beyond if by_groups else 1.0)
            kinds[tier][0 if by_groups else 1].append(KIND_WORDS[kind])
    out: dict[Tier, tuple[float, list[str]]] = {}
    for tier in enabled:
        contained_words, other_words = kinds[tier]
        words = list(other_words)
        if contained_words and groups is not None:
            words.insert(0, f"{_and(contained_words)} with more than {groups.replicas - groups.min_replicas} of "
                            f"{groups.replicas} replica groups down at once")
        out[tier] = (rates[tier], words)
    return out


def compute_daly_interval(stall_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum of the compute time between saves (FGCS 22, 2006, eq. 37):
    ``sqrt(2 C M) [1 + sqrt(C / 2M) / 3 + (C / 2M) / 9] - C`` for ``C < 2M``, else ``M``."""
    if math.isinf(mtbf_s):
        return math.inf
    if stall_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = stall_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * stall_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - stall_s


def _hours(seconds: float) -> str:
    if math.isinf(seconds):
        return "never"
    if seconds >= 3.6e9:
        return "over a million hours"
    if seconds >= 36_000:
        return f"{seconds / 3600.0:,.0f} h"
    return f"{seconds / 3600.0:.3g} h" if seconds >= 360 else f"{seconds / 60.0:.3g} min"


def _and(words: list[str]) -> str:
    return " and ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " and " + words[-1]


def _align(steps: int, base: int, cap: int, floor: int) -> int:
    """``steps`` as a multiple of ``base`` (the nearest, within the cap where one fits, never
    below the background save ``floor``)."""
    aligned = max(base, round(steps / base) * base)
    if aligned > max(cap, base):
        aligned = max(base, cap // base * base)
    while aligned < floor:
        aligned += base
    return aligned


def decide_intervals(inputs: IntervalInputs) -> tuple[IntervalChoice, ...]:
    """Each enabled tier's interval in steps (fastest tier first), the spec's where it sets one."""
    step = inputs.step_s.value
    if not step > 0:
        raise ValueError(f"step time: must be > 0 s, got {step} ({inputs.step_s.source})")
    bad = [f"{tier} save: {name} must be >= 0 s, got {figure.value} ({figure.source})"
           for tier, cost in inputs.costs.items()
           for name, figure in (("stall", cost.stall_s), ("background write", cost.duration_s))
           if not figure.value >= 0]
    if bad:
        raise ValueError("; ".join(bad))
    cap = max(1, math.floor(inputs.max_interval_s / step))
    protected = compute_protected_rates(inputs)
    #: tier -> (Daly's optimum in s, the rule's steps before alignment, the background save floor)
    raw: dict[Tier, tuple[float, int, int]] = {}
    for tier, (rate, _) in protected.items():
        cost = inputs.costs[tier]
        optimum = compute_daly_interval(cost.stall_s.value, 3600.0 / rate if rate > 0 else math.inf)
        floor = max(1, math.ceil(cost.duration_s.value / step - 1e-9))
        target = cap if math.isinf(optimum) else min(cap, max(1, round(optimum / step)))
        raw[tier] = (optimum, max(target, floor), floor)
    given = {t: inputs.spec_steps[t] for t in raw if t in inputs.spec_steps}
    # a tier restored after a corruption saves on the SDC checks' steps (where its optimum is not
    # far below their interval): the checkpoint it is restored from is then the one at the last
    # check that passed, not one up to an interval before it
    sdc = inputs.sdc_interval_steps
    corruption = inputs.failures_per_hour.get("corruption")
    on_checks = {
        t: _align(raw[t][1], sdc, cap, raw[t][2]) for t in SERVED_BY["corruption"][1]
        if sdc and corruption is not None and corruption.value > 0 and t in raw and t not in given
        and 2 * raw[t][1] >= sdc
    }
    # one snapshot serves every tier due at a step: align to the most frequent tier's interval
    base = min([*given.values(), *on_checks.values(),
                *(s for t, (_, s, _) in raw.items() if t not in given and t not in on_checks)], default=1)
    out: list[IntervalChoice] = []
    for tier, (optimum, steps, floor) in raw.items():
        rate, words = protected[tier]
        protects = _and(words) or "no listed failure"
        stall = inputs.costs[tier].stall_s.value
        mtbf = 3600.0 / rate if rate else math.inf
        every = (" (none expected)" if not rate else f" every {_hours(mtbf)}" if mtbf < 3.6e9
                 else " (less than once in a million hours)")
        said = f"save stall {stall:.3g} s, protects against {protects}{every}"
        if tier in given:
            out.append(IntervalChoice(tier, given[tier], "spec", rate, protects, optimum, stall,
                                      f"{tier} every {given[tier]} steps: set in the spec (the rule: {steps}; {said})"))
            continue
        chosen = on_checks[tier] if tier in on_checks else _align(steps, base, cap, floor)
        if math.isinf(optimum):
            why = f"the longest interval ({_hours(inputs.max_interval_s)})"
        else:
            notes = [f"optimum {optimum:.3g} s = {optimum / step:.3g} steps of {step:.3g} s"]
            if optimum / step > cap:
                notes = [f"the optimum is beyond the cap of {_hours(inputs.max_interval_s)}"]
            if floor > round(optimum / step):
                notes.append(f"at least one background save ({inputs.costs[tier].duration_s.value:.3g} s)")
            if tier in on_checks and chosen != steps:
                notes.append(f"a multiple of the SDC checks' {sdc} steps (restored from the last passed check)")
            elif chosen != steps:
                notes.append(f"a multiple of {base} (one snapshot serves every tier due)")
            why = f"Young/Daly ({', '.join(notes)})"
        out.append(IntervalChoice(tier, chosen, "rule", rate, protects, optimum, stall,
                                  f"{tier} every {chosen} steps: {said} -> {why}"))
    return tuple(out)


# --------------------------------------------------------------------------- the operator's inputs


def build_interval_inputs(
    spec: TrainingJobSpec,
    *,
    step_s: Sourced = STEP_S,
    save_stall_s: Mapping[Tier, Sourced] = SAVE_STALL_S,
    save_duration_s: Mapping[Tier, Sourced] = SAVE_DURATION_S,
    failures_per_gpu_hour: Mapping[Kind, Sourced] = FAILURES_PER_GPU_HOUR,
    group_outage_s: Sourced = GROUP_OUTAGE_S,
) -> IntervalInputs:
    """The rule's inputs for a TrainingJob: its tiers, its size and replica groups from the
    spec; what is not measured yet from the defaults above (``railyard plan`` may pass others)."""
    ck = spec.checkpoint
    enabled = {"memory": ck.memory.enabled, "local": ck.local.enabled, "shared": ck.shared.enabled}
    tiers: dict[Tier, TierCost] = {t: TierCost(save_stall_s[t], save_duration_s[t]) for t in TIERS if enabled[t]}
    # failure rates are per GPU; a pod that asks for none counts its processes
    gpus = spec.nodes * (spec.gpus or spec.procs_per_node)
    rates = {k: Sourced(r.value * gpus, f"{r.source}, x {gpus:,} GPUs") for k, r in failures_per_gpu_hour.items()}
    groups = (ReplicaGroups(spec.replica_groups, spec.fault_tolerance.min_replicas, group_outage_s)
              if spec.replica_groups > 1 else None)
    given = {"memory": ck.memory.interval_steps, "local": ck.local.interval_steps, "shared": ck.shared.interval_steps}
    return IntervalInputs(
        step_s=step_s,
        costs=tiers,
        failures_per_hour=rates,
        groups=groups,
        memory_replicates=ck.memory.replicate,
        memory_survives_restart=ck.memory.medium == "HostPath" or spec.restart_policy.in_place,
        spec_steps={t: v for t, v in given.items() if v is not None and t in tiers},
        sdc_interval_steps=spec.health.sdc.interval_steps,
    )


def resolve_checkpoint(spec: TrainingJobSpec) -> Checkpoint:
    """``spec.checkpoint`` with every interval the spec leaves open chosen by the rule: what the
    operator writes into config.json (the same for every attempt: a change of inputs between
    attempts would give the pods of one job different intervals)."""
    ck = spec.checkpoint
    if all(t.interval_steps is not None for t in (ck.memory, ck.local, ck.shared)):
        return ck
    chosen = {c.tier: c.steps for c in decide_intervals(build_interval_inputs(spec))}
    # a disabled tier saves never; it still gets a number (the contract's field is one)
    fallback = max(chosen.values(), default=1)
    return replace(
        ck,
        memory=replace(ck.memory, interval_steps=ck.memory.interval_steps or chosen.get("memory", fallback)),
        local=replace(ck.local, interval_steps=ck.local.interval_steps or chosen.get("local", fallback)),
        shared=replace(ck.shared, interval_steps=ck.shared.interval_steps or chosen.get("shared", fallback)),
    )
