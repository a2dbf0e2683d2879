"""Fixtures for the tests that run Prometheus's own tools: ``promtool`` and ``prometheus``.

They come from Debian's ``prometheus`` package (``.ci/run`` installs it). Outside CI a machine
without them skips these tests, saying why; in CI (``RAILYARD_CI=1``, set by ``.ci/run``) a
missing binary is a failure, so the checks can never be skipped silently where they must run.
"""

from __future__ import annotations

import os
import shutil

import pytest

IN_CI = os.environ.get("RAILYARD_CI") == "1"


def need_binary(name: str) -> str:
    """The path of ``name`` on PATH; skip (fail in CI) without it."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"`{name}` is not installed (Debian: apt-get install --no-install-recommends prometheus)"
    if IN_CI:
        pytest.fail(f"{message}; RAILYARD_CI=1 requires it (.ci/run installs it)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def promtool() -> str:
    return need_binary("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    return need_binary("prometheus")
