"""The embedded API server answers the recorded exchanges of a real kube-apiserver v1.36 the way
that server did (kube-v1.36/README.md): every status code, every error message and cause, every
created object with its defaulted and admission-added fields, every watch's events in order.

What is kept different on purpose is in ``allowlist.txt``, one line per difference, with the reason.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from railyard_local.apiserver.process import start_server_process

from .replay import (
    Client,
    Replay,
    allowlist_problems,
    differences,
    load_allowlist,
    load_corpus,
    replay,
)

CASES = load_corpus()

# The recorded server had long compacted its history (067 asks for resourceVersion 2); a small
# event window makes the replayed server's history as short.
EVENT_WINDOW = 16


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    state: Path = tmp_path_factory.mktemp("golden-apiserver")
    # the recorded server ran without the gang scheduling gates: no scheduling.k8s.io/v1alpha2
    proc = start_server_process(state, token=secrets.token_hex(16),
                                extra_args=["--event-window", str(EVENT_WINDOW), "--no-workload-api"])
    try:
        exchanges = load_corpus()
        replay(Client(proc.url, proc.token, proc.ca_file), exchanges)
        yield Replay(exchanges, load_allowlist())
    finally:
        proc.stop()


def test_the_corpus_is_complete() -> None:
    """69 exchanges (numbered 000-069; there is no 064), each with a request and an answer."""
    assert len(CASES) == 69
    assert all(c.request.get("method") and "status" in c.expected for c in CASES)


def test_every_allowlist_entry_names_a_case_and_a_reason() -> None:
    assert allowlist_problems(load_allowlist(), CASES) == []


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_exchange_matches_the_record(replayed: Replay, name: str) -> None:
    ex = replayed.by_name(name)
    problems = differences(ex, replayed.allow)
    assert not problems, f"{name} ({ex.note}):\n  " + "\n  ".join(problems)
