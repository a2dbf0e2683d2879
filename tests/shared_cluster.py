"""Run test sessions at once on one shared cluster, as they would run on a real one (issue 46).

A real cluster has nodes that are not a test's, a scheduler that binds every pod it can, and other
users beside the test. This starts one embedded API server with the local cluster's scheduler and
a node agent serving nodes that belong to no test (``other-0..``), then runs ``--sessions`` pytest
sessions concurrently against it through ``RAILYARD_TEST_KUBECONFIG``: each session adds its own
nodes (existing mode) and must use only those and only what it created. A test that lists every
node, leaves a pod to whichever node the scheduler picks, or expects a pod to stay unbound while a
scheduler serves it, fails here::

    python -m tests.shared_cluster run -- tests/local tests/operator tests/conformance
    python -m tests.shared_cluster serve            # only the cluster; prints its kubeconfig

``run`` exits 0 only when every session passed, and prints each session's summary line.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The shared cluster's own nodes: the "other agent" every session must keep off.
OTHER_PREFIX = "other-"


@contextmanager
def shared_cluster(state: Path, *, other_nodes: int) -> Iterator[dict[str, str]]:
    """An embedded API server with a scheduler and ``other_nodes`` nodes of its own; yields the
    environment that points a test session at it. The nodes have GPUs, as a real cluster's would:
    a test pod that asks for GPUs and says nothing about where finds room on them.

    The embedded server serves pods/log from the files in its log dir (kube-apiserver asks the
    node's kubelet endpoint instead): the sessions' node agents write there (``POD_LOG_DIR_ENV``)."""
    from tests.clusters import POD_LOG_DIR_ENV

    from railyard_local.cluster import LocalCluster

    cluster = LocalCluster(state, mode="embedded", scheduler=True, nodes=other_nodes, gpus_per_node=2,
                           topology="spine=1,leaf=2", node_prefix=OTHER_PREFIX, node_ip_offset=200,
                           lease_interval=2.0)
    kubeconfig = cluster.start(timeout=120)
    try:
        yield {"RAILYARD_TEST_KUBECONFIG": str(kubeconfig), POD_LOG_DIR_ENV: str(cluster.log_dir)}
    finally:
        cluster.stop()


def _summary(log: Path) -> list[str]:
    """What pytest said of the session: its FAILED and ERROR lines, then its last line
    (``3 failed, 120 passed in ...``)."""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    failed = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    return [*failed, lines[-1] if lines else "(no output)"]


def run_sessions(given: dict[str, str], pytest_args: list[str], *, sessions: int, logs: Path) -> int:
    """Start ``sessions`` pytest runs at once with ``given`` in their environment (the shared
    cluster's); wait for all; report each."""
    env = dict(os.environ, **given)
    procs: list[tuple[int, subprocess.Popen[bytes], Path]] = []
    started = time.monotonic()
    for index in range(sessions):
        log = logs / f"session-{index}.log"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
        with log.open("wb") as out:
            procs.append((index, subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT), log))
        print(f"session {index}: {' '.join(argv[1:])} > {log}", flush=True)
    worst = 0
    for index, proc, log in procs:
        code = proc.wait()
        worst = worst or code
        *failed, last = _summary(log)
        print(f"session {index}: exit {code} after {time.monotonic() - started:.0f} s: {last}", flush=True)
        for line in failed:
            print(f"  {line}", flush=True)
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.shared_cluster", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    run = sub.add_parser("run", help="start the shared cluster, run the sessions at once, report, stop")
    run.add_argument("--sessions", type=int, default=2)
    run.add_argument("pytest_args", nargs="*", default=["tests/local", "tests/operator", "tests/conformance"])
    serve = sub.add_parser("serve", help="start the shared cluster and keep it up until SIGINT/SIGTERM")
    for p in (run, serve):
        p.add_argument("--state-dir", type=Path, help="where the cluster keeps its state (default: a temporary folder)")
        p.add_argument("--other-nodes", type=int, default=4, help="nodes that belong to no test session")
    run.add_argument("--log-dir", type=Path, help="where each session's output goes (default: a new temporary folder, kept)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="railyard-shared-") as tmp:
        state = (args.state_dir or Path(tmp) / "cluster").absolute()
        with shared_cluster(state, other_nodes=args.other_nodes) as given:
            if args.action == "serve":
                print(" ".join(f"{k}={v}" for k, v in given.items()), flush=True)
                done = threading.Event()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    signal.signal(sig, lambda *_: done.set())
                done.wait()
                return 0
            logs = (args.log_dir or Path(tempfile.mkdtemp(prefix="railyard-shared-logs-"))).absolute()
            logs.mkdir(parents=True, exist_ok=True)
            return run_sessions(given, args.pytest_args, sessions=args.sessions, logs=logs)


if __name__ == "__main__":
    sys.exit(main())
