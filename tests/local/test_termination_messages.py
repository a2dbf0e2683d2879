"""The node agent fills ``state.terminated.message`` as the kubelet does: the container's
termination message file, else (``FallbackToLogsOnError``, non-zero exit) the end of its log."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from railyard_local.termination import (
    FALLBACK_LOG_BYTES,
    FALLBACK_LOG_LINES,
    build_termination_message,
)

from .builders import make_pod
from .conftest import wait_phase


@pytest.mark.parametrize(("file_text", "log_lines", "policy", "code", "expected"), [
    ("my last words\n", ["a", "b"], "File", 1, "my last words\n"),
    ("my last words\n", ["a", "b"], "FallbackToLogsOnError", 1, "my last words\n"),
    ("", ["a", "b"], "FallbackToLogsOnError", 1, "a\nb\n"),
    ("", ["a", "b"], "FallbackToLogsOnError", 0, ""),
    ("", ["a", "b"], "File", 1, ""),
    ("", [f"line {i}" for i in range(200)], "FallbackToLogsOnError", 2, "".join(f"line {i}\n" for i in range(120, 200))),
], ids=["file", "file wins over the log", "fallback", "no fallback on success", "no fallback with File", "last 80 lines"])
def test_the_message_is_the_file_else_the_end_of_the_log(tmp_path: Path, file_text: str, log_lines: list[str], policy: str, code: int, expected: str) -> None:
    (tmp_path / "msg").write_text(file_text)
    (tmp_path / "log").write_text("".join(f"{ln}\n" for ln in log_lines))
    assert build_termination_message(tmp_path / "msg", tmp_path / "log", policy=policy, exit_code=code) == expected


def test_the_log_fallback_keeps_at_most_2048_bytes(tmp_path: Path) -> None:
    (tmp_path / "log").write_text("".join(f"{i:04d}" + "x" * 95 + "\n" for i in range(50)))  # 100-byte lines
    got = build_termination_message(tmp_path / "missing", tmp_path / "log", policy="FallbackToLogsOnError", exit_code=1)
    assert len(got.encode()) == FALLBACK_LOG_BYTES < 50 * 100 and got.endswith("0049" + "x" * 95 + "\n")
    assert got.count("\n") <= FALLBACK_LOG_LINES


PY = sys.executable


@pytest.mark.cluster
def test_pods_report_their_termination_messages(core: k8s.CoreV1Api, namespace: str) -> None:
    writes = make_pod("writes").command(PY, "-c", textwrap.dedent("""
        import os, sys
        print("noise on stdout")
        open(os.environ["MSG_FILE"], "w").write("wrote my own last words")
        sys.exit(3)
    """)).env({"name": "MSG_FILE", "value": "/dev/termination-log"}).obj()
    fallback = make_pod("fallback").command(PY, "-c", "import sys; print('loading data from /data/shard-7 ... FileNotFoundError'); sys.exit(1)").obj()
    fallback["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    plain = make_pod("plain").command(PY, "-c", "import sys; print('said nothing to the file'); sys.exit(1)").obj()
    for pod in (writes, fallback, plain):
        core.create_namespaced_pod(namespace, pod)

    def message(name: str) -> Any:
        pod = wait_phase(core, namespace, name, ("Failed",), timeout=60)
        return pod.status.container_statuses[0].state.terminated.message

    assert message("writes") == "wrote my own last words"
    assert message("fallback") == "loading data from /data/shard-7 ... FileNotFoundError\n"
    assert not message("plain"), "policy File, empty file: no message"
