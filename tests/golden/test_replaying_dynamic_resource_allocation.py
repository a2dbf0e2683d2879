"""The embedded API server answers the resource.k8s.io/v1 exchanges of kube-v1.36-dra/ as the
documentation says a real kube-apiserver does: DeviceClasses, ResourceClaimTemplates,
ResourceClaims and ResourceSlices stored, defaulted and validated, and a pod's container claims
checked against the pod's claims. Those exchanges were WRITTEN FROM THE DOCUMENTATION, not
recorded (kube-v1.36-dra/README.md, allowlist-dra.txt)."""

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

CORPUS = Path(__file__).parent / "kube-v1.36-dra"
ALLOWLIST = Path(__file__).parent / "allowlist-dra.txt"
CASES = load_corpus(CORPUS)


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    state: Path = tmp_path_factory.mktemp("golden-dra-apiserver")
    proc = start_server_process(state, token=secrets.token_hex(16))
    try:
        exchanges = load_corpus(CORPUS)
        replay(Client(proc.url, proc.token, proc.ca_file), exchanges, namespace="golden-dra", before={})
        yield Replay(exchanges, load_allowlist(ALLOWLIST))
    finally:
        proc.stop()


def test_the_corpus_is_complete_and_says_it_was_not_recorded() -> None:
    assert [c.number for c in CASES] == [f"{i:03d}" for i in range(9)]
    assert "WRITTEN FROM THE DOCUMENTATION" in (CORPUS / "README.md").read_text()
    assert "NOT RECORDED" in ALLOWLIST.read_text()


def test_every_allowlist_entry_names_a_case_and_a_reason() -> None:
    assert allowlist_problems(load_allowlist(ALLOWLIST), CASES) == []


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_exchange_matches_the_documented_answer(replayed: Replay, name: str) -> None:
    ex = replayed.by_name(name)
    problems = differences(ex, replayed.allow)
    assert not problems, f"{name} ({ex.note}):\n  " + "\n  ".join(problems)
