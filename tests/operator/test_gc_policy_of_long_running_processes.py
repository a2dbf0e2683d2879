"""railyard.gcpolicy: what start-up made is frozen out of the collector's passes, the young
generation is collected less often, and cyclic garbage made later is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from railyard import gcpolicy


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_start_up_objects_are_frozen_and_later_cycles_still_collected(restored_gc: None) -> None:
    before = gc.get_threshold()
    gcpolicy.settle_after_start()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (gcpolicy.YOUNG_THRESHOLD, before[1], before[2])
    a, b = _Node(), _Node()
    a.other, b.other = b, a  # a cycle: reference counting alone never frees it
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None
