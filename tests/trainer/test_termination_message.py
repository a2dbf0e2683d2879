"""The launcher's termination message: the rank whose exit code is the pod's, first to fail,
with the end of its traceback, within the kubelet's 4096 bytes. Pure (no torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from railyard.protocol.termination import MAX_TERMINATION_MESSAGE_BYTES, TERMINATION_LOG_ENV
from railyard_trainer.termination import (
    WORKER_ERROR_FILE_ENV,
    build_termination_message,
    fit_termination_message,
    read_worker_errors,
    record_worker_error,
    write_termination_message,
)


def _error(rank_dir: Path, rank: int, exc: BaseException, code: int) -> None:
    try:
        raise exc
    except BaseException as caught:
        record_worker_error(caught, code, {WORKER_ERROR_FILE_ENV: str(rank_dir / f"error-{rank}.json")})


def test_the_first_rank_with_the_pods_exit_code_is_quoted(tmp_path: Path) -> None:
    _error(tmp_path, 1, FileNotFoundError(2, "No such file or directory", "/data/shard-7"), 1)
    _error(tmp_path, 0, RuntimeError("gloo: connection reset by peer"), 70)
    _error(tmp_path, 3, ValueError("a later crash"), 1)
    errors = read_worker_errors(tmp_path, [0, 1, 2, 3])
    assert sorted(errors) == [0, 1, 3], "rank 2 recorded nothing"
    text = build_termination_message({0: 70, 1: 1, 2: 143, 3: 1}, errors, code=1)
    head, _, body = text.partition("\n")
    assert head == "rank 1 exited with code 1 (Application) first; then ranks [0, 2, 3]"
    assert body.rstrip().endswith("FileNotFoundError: [Errno 2] No such file or directory: '/data/shard-7'")
    assert "Traceback (most recent call last)" in body


def test_without_recorded_errors_the_codes_still_say_who(tmp_path: Path) -> None:
    assert build_termination_message({0: 0, 1: 137}, {}, code=137) == "rank 1 exited with code 137 (Infrastructure) first"


@pytest.mark.parametrize("size", [100, 4096, 20000])
def test_long_messages_keep_their_first_line_and_their_end(size: int) -> None:
    text = "rank 0 exited with code 1 (Application) first\n" + "".join(f"frame {i}\n" for i in range(size)) + "Boom: the end"
    got = fit_termination_message(text)
    assert len(got.encode()) <= MAX_TERMINATION_MESSAGE_BYTES
    assert got.startswith("rank 0 exited") and got.endswith("Boom: the end")


def test_the_message_goes_only_where_the_pod_says(tmp_path: Path) -> None:
    write_termination_message("x", {})  # outside a pod: nowhere, no error
    target = tmp_path / "termination-log"
    write_termination_message("rank 0 failed", {TERMINATION_LOG_ENV: str(target)})
    assert target.read_text() == "rank 0 failed"
    write_termination_message("y", {TERMINATION_LOG_ENV: str(tmp_path / "no" / "such" / "dir")})  # never raises
