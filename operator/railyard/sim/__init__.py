"""Goodput of a long training run on a large cluster, simulated with the project's own policies.

A discrete-event simulation (``heapq``), seeded and pure: no clock, no I/O, no kopf, kubernetes or
torch. The decisions come from :mod:`railyard.logic` (placement, failure classification, restart
budgets, health detection rules, checkpoint choice); this package only models what happens
between them: failures, time, bandwidths. See docs/simulate.md.
"""

from railyard.sim.engine import RunResult, simulate
from railyard.sim.model import (
    LLAMA3_CAUSES,
    Cause,
    PolicyConfig,
    Scenario,
    baseline_policy,
    our_policy,
)
from railyard.sim.report import Comparison, compare
from railyard.sim.trace import Event, generate_trace

__all__ = [
    "LLAMA3_CAUSES",
    "Cause",
    "Comparison",
    "Event",
    "PolicyConfig",
    "RunResult",
    "Scenario",
    "baseline_policy",
    "compare",
    "generate_trace",
    "our_policy",
    "simulate",
]
