"""Garbage collection for the long-running control-plane processes: the operator, and the local
cluster's API server and node agent.

CPython's cycle collector runs its full (oldest-generation) pass over every tracked object, and
with the default thresholds (700, 10, 10) the young one every 700 net allocations. These
processes import a few hundred thousand long-lived objects (kopf, pydantic schemas, aiohttp, the
API server's registry) and then allocate a burst of short-lived dicts per watch event and
request: while a 1,000-pod gang started, the collector took ~45% of the operator's CPU and ~30%
of the API server's (issue 46, gc.callbacks over the gang's creation), mostly full passes walking
objects that never die. Freezing what start-up made (``gc.freeze``: the permanent generation,
never traversed) and collecting the young generation less often cuts that; garbage in cycles is
still collected, only later, and nothing about what the process does changes.

Standard library only: both sides (railyard and railyard_local) call it from their ``main``.
"""

from __future__ import annotations

import gc

#: Net allocations between young collections (CPython's default: 700). Larger bursts of
#: short-lived objects die by reference counting before the collector looks at them.
YOUNG_THRESHOLD = 10_000


def settle_after_start() -> None:
    """Once imports and start-up are done: collect, freeze what is left (it lives as long as the
    process), and raise the young generation's threshold; the older two keep theirs."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
