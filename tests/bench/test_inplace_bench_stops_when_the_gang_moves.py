"""bench/inplace.py measures the repair of one failure of a settled gang: when the gang moves
before the failure is injected (a pod of the first attempt deleted, one of a later attempt
created) it stops at once with the reason, rather than wait 900 s for pods that will never all
run (issue 46). Its cleanup on SIGINT/SIGTERM was checked by hand against an API server (see
the bench's docstring); here the decision to stop."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "inplace.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("railyard_bench_inplace", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def watch(bench: ModuleType, added: list[str], deleted: list[str] = ()) -> Any:  # type: ignore[assignment]
    w = bench.PodWatch(kube=None)
    w.added = dict.fromkeys(added, 1.0)
    w.deleted = dict.fromkeys(deleted, 2.0)
    return w


FIRST = [f"gang-a0-{i}" for i in range(4)]


@pytest.mark.parametrize(("added", "deleted", "moved"), [
    (FIRST, [], False),
    (FIRST[:2], [], False),  # still being created
    (FIRST, ["gang-a0-2"], True),  # a pod of the first attempt gone
    ([*FIRST, "gang-a1-2"], [], True),  # the replacement of a later attempt
    ([*FIRST, "gang-a1-0", "gang-a1-1"], FIRST, True),  # a whole new gang
    ([*FIRST, "full-a1-0", "gang-spare-0"], [], False),  # another job's pods and the spare are not the gang
])
def test_the_gang_moved_when_its_first_attempt_changed(bench: ModuleType, added: list[str], deleted: list[str],
                                                       moved: bool) -> None:
    why = bench.gang_moved(watch(bench, added, deleted), "gang", FIRST)
    assert (why is not None) == moved
    if moved:
        assert "the gang moved before the failure was injected" in why and "NotReady" in why


def test_waiting_stops_at_once_with_the_reason(bench: ModuleType) -> None:
    w = watch(bench, [*FIRST, "gang-a1-3"], ["gang-a0-3"])
    started = time.perf_counter()
    with pytest.raises(bench.BenchError, match=r"all pods Running: the gang moved .*1 pods of the first attempt deleted"):
        asyncio.run(bench.until("gang: all pods Running", lambda: False, 900, 0.01,
                                fail=lambda: bench.gang_moved(w, "gang", FIRST)))
    assert time.perf_counter() - started < 60, "not the 900 s timeout"
