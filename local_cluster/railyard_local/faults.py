"""The node faults the agent plays on real processes: a slow node runs its pods' processes only
part of the time (SIGSTOP/SIGCONT). A failed node's pods are killed by the agent
(Agent.on_control -> PodWorker.kill), as a node's death takes every process at once.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from railyard_local.processes import process_tree, signal_pids

#: Period of a slow node's SIGSTOP/SIGCONT duty cycle: short, so the node's processes are slowed
#: evenly (wall clock) rather than in visible bursts. The straggler signal does not come from it:
#: the speed probe sees the node's simulated device (Agent.device_file), which is exact under any load.
SLOW_PERIOD = 0.004


async def run_duty_cycle(slow_factor: Callable[[], float], pgids: Callable[[], list[int]]) -> None:
    """Let the node's processes run 1/factor of the time, so CPU-bound work takes factor x
    longer. Timers on a busy machine overshoot by about a millisecond, a large part of a
    4 ms period, so the cycle keeps count: it runs the processes only while their running
    time is behind ``elapsed / factor``, and the overshoot of one run is taken off the next."""
    pids: list[int] = []
    refreshed = 0.0
    loop = asyncio.get_running_loop()
    factor, start, ran = 0.0, 0.0, 0.0
    try:
        while True:
            now = loop.time()
            if slow_factor() != factor or now - start > 2.0:
                # a new factor, or a fresh window so an old debt cannot starve or burst
                factor, start, ran = slow_factor(), now, 0.0
            share = 1.0 / max(factor, 1.0)
            if now - refreshed > 0.5:  # pods and their workers come and go
                pids = process_tree(pgids())
                refreshed = now
            if ran <= share * (now - start):
                signal_pids(pids, signal.SIGCONT)
                await asyncio.sleep(SLOW_PERIOD * share)
                signal_pids(pids, signal.SIGSTOP)
                ran += loop.time() - now
            else:
                await asyncio.sleep(SLOW_PERIOD * (1.0 - share))
    finally:
        signal_pids(process_tree(pgids()) + pids, signal.SIGCONT)
