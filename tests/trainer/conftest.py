"""Session-cached trainer runs, so several tests share one training job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .launch import Run, run_launcher


@pytest.fixture(scope="session")
def trainer_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Run]]:
    """``trainer_runs(key, args, **kw)``: run once per session per key, then reuse."""
    cache: dict[str, Run] = {}
    root = tmp_path_factory.mktemp("runs")

    def get(key: str, args: list[str], **kw: Any) -> Run:
        if key not in cache:
            cache[key] = run_launcher(root / key, args, **kw)
        return cache[key]

    yield get
