"""Health decisions (pure): dead and hung ranks, stragglers, SDC verdicts.

Entry point: :func:`decide_health` (one job, one evaluation, takes ``now``). One policy per
module: ``liveness`` (dead, hang), ``straggler``, ``sdc``; ``model`` holds the vocabulary.
"""

from railyard.logic.health.evaluate import decide_health
from railyard.logic.health.liveness import compute_hang_timeout
from railyard.logic.health.model import (
    Action,
    FaultKind,
    HealthDecision,
    HealthEvent,
    HealthPolicy,
    HealthState,
    JobSignals,
    PodStatus,
    RankSignals,
    StragglerScore,
    Verdict,
)

__all__ = [
    "Action",
    "FaultKind",
    "HealthDecision",
    "HealthEvent",
    "HealthPolicy",
    "HealthState",
    "JobSignals",
    "PodStatus",
    "RankSignals",
    "StragglerScore",
    "Verdict",
    "compute_hang_timeout",
    "decide_health",
]
