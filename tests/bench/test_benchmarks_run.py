"""Every benchmark in bench/ runs from a clean checkout, at a small size, and writes its results
in the documented shape, so that each figure of the README can be reproduced with the command
next to it. (A benchmark nobody ran for a while rots: bench/operator.py hung for weeks on every
pod's init container before this test existed.) Sizes here are for completion, not figures: no
target is asserted, only that the script finished and reported every row.

The whole set takes about 1.5 minutes on a 2-core machine; the six heaviest smoke runs
(UNDER_THE_OPERATOR) only with ``RAILYARD_BENCH_SMOKE=all``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
#: Only catches a hang: the slowest smoke run takes ~20 s on a loaded 2-core machine.
HANG_S = 420

#: script -> (arguments of the smoke run, JSON "bench" name). Writes to a temporary --out.
SMOKE: dict[str, tuple[list[str], str]] = {
    "apiserver.py": (["--scale", "64"], "apiserver"),
    "checkpoint.py": (["--preset", "tiny", "--rounds", "1", "--memory-interval", "2"], "checkpoint"),
    # the real trainer under the operator: kubectl drain of a node under a ReplicaGroups job (the
    # in-place mode only in the full run); about 1.5 minutes
    "drain.py": (["--smoke"], "drain"),
    "goodput.py": (["--seeds", "1", "--days", "2"], "goodput"),
    # one node lost from a gang with a held spare, restarted in place then in full
    "inplace.py": (["--pods", "8", "--nodes", "12"], "inplace"),
    "heartbeats.py": (["--seconds", "1", "--clients", "1", "--concurrency", "4", "--prefill-steps", "2",
                       "--client", "aiohttp", "--pods", "32"], "heartbeats"),
    "local_scheduler.py": (["--pods", "24", "--nodes", "6", "--decision-nodes", "64"], "local_scheduler"),
    # the simulated-pod path: the operator in its own process, a gang, a node failure, a restart
    "operator.py": (["--pods", "8", "--restart-pods", "4", "--nodes", "12"], "operator"),
    "placement.py": (["--small"], "placement"),
    "nvl72_placement.py": (["--small"], "nvl72_placement"),
    # a few nodes of the local agent on the embedded server with the node lifecycle rule, briefly
    "node_heartbeats.py": (["--nodes", "8", "--hold", "3"], "node_heartbeats"),
    # the real trainer under the operator: one node lost under replica groups (the in-place and
    # full modes, and the no-failure reference, only in the full run), at R = 3 only: every line
    # of the script runs for one R as for several, R = 3 has a lost group's ring neighbours that
    # R = 2 lacks, and R = 2 under the operator is tests/system's; 1-3 minutes
    "replica_groups.py": (
        ["--smoke", "--modes", "replica_groups", "--no-reference", "--groups", "3"], "replica_groups"),
    "restore_choice.py": (["--pods", "64", "--repeats", "1"], "restore_choice"),
    "sdc.py": (["--smoke", "--layouts", "fsdp"], "sdc"),
    "trainer.py": (["--layouts", "single", "--steps", "4", "--batch-size", "4", "--seq-len", "16"], "trainer"),
}
#: Scripts that need hardware CI does not have; run by hand (docs name the machine).
NEEDS_GPU = {"gpu/mfu.py"}
#: The prepared GPU run: its dry mode on the CPU is tests/bench/test_gpu_run_dry.py.
DRY_ELSEWHERE = {"gpu/run.py", "gpu/titan.py"}
#: Not a benchmark: what every benchmark writes beside its results (commit, date, machine).
HELPERS = {"provenance.py", "jobs.py"}


def run_bench(script: str, args: list[str], out: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAILYARD_", "KUBECONFIG"))}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    argv = [sys.executable, str(BENCH / script), *args, *(["--out", str(out)] if out else [])]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_S)


def check_shape(doc: Any, name: str) -> None:
    assert isinstance(doc, dict) and doc.get("bench") == name, doc
    rows = doc.get("results")
    assert isinstance(rows, list) and rows, f"{name}: no results"
    for row in rows:
        assert {"metric", "value", "unit", "target", "meets"} <= set(row), f"{name}: row {row}"
        assert isinstance(row["metric"], str) and row["metric"], row
        assert isinstance(row["unit"], str), row
        assert row["meets"] in (True, False, None), row


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.relative_to(BENCH).as_posix() for p in BENCH.rglob("*.py")}
    missing = scripts - set(SMOKE) - NEEDS_GPU - DRY_ELSEWHERE - HELPERS
    assert not missing, f"add a smoke run for {sorted(missing)} to SMOKE"


#: Smoke runs of many trainer processes, each on a path a test of its own already runs: the real
#: trainer under the operator (drain.py: tests/system/test_draining_a_node.py's replica-group
#: drain; replica_groups.py: tests/system/test_replica_groups_under_the_operator.py's lost group;
#: inplace.py: tests/system/test_in_place_restart.py), and the trainer's layouts, checkpoint tiers
#: and SDC checks (trainer.py, checkpoint.py, sdc.py: tests/trainer, tests/checkpoint,
#: tests/health). CI skips them (about 160 s of CPU, an eighth of the suite's); with
#: ``RAILYARD_BENCH_SMOKE=all`` they run, and every rerun of a benchmark runs its script, whose
#: results tests/bench/test_results_are_current.py holds to the code.
UNDER_THE_OPERATOR = {"drain.py", "replica_groups.py", "inplace.py", "trainer.py", "checkpoint.py", "sdc.py"}
ALL_SMOKES = os.environ.get("RAILYARD_BENCH_SMOKE") == "all"


def smoke_params() -> list[Any]:
    return [
        pytest.param(s, marks=pytest.mark.skipif(
            s in UNDER_THE_OPERATOR and not ALL_SMOKES,
            reason="many trainer processes on a path a test of its own runs: RAILYARD_BENCH_SMOKE=all runs it"))
        for s in sorted(SMOKE)
    ]


@pytest.mark.slow
@pytest.mark.timeout(HANG_S + 60)
@pytest.mark.parametrize("script", smoke_params())
def test_the_benchmark_runs_at_a_small_size(script: str, tmp_path: Path) -> None:
    args, name = SMOKE[script]
    out = tmp_path / f"{name}.json"
    done = run_bench(script, args, out)
    tail = f"\n--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}"
    # exit 1 is a target missed at this size (placement's, for one); a crash prints a traceback
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, tail
    assert out.exists(), f"{script} wrote no {out.name}{tail}"
    doc = json.loads(out.read_text())
    check_shape(doc, name)
    assert doc.get("date") and doc.get("machine", {}).get("cpus") and "commit" in doc and doc.get("measures"), (
        f"{script}: no provenance (write the results with bench/provenance.py's write_results)")
    assert done.stdout.strip(), f"{script} printed no table{tail}"


def test_the_gpu_benchmark_refuses_clearly_without_a_gpu(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: run bench/gpu/mfu.py itself (minutes, not a smoke run)")
    done = run_bench("gpu/mfu.py", [], None)
    assert done.returncode != 0 and "needs at least one CUDA GPU" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_the_committed_results_have_the_documented_shape() -> None:
    """What the README quotes: bench/results/<name>.json of every benchmark."""
    for script, (_, name) in SMOKE.items():
        path = BENCH / "results" / f"{name}.json"
        assert path.exists(), f"{script}: no committed {path.name}"
        check_shape(json.loads(path.read_text()), name)


def stand_in_hog(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The script's environment with a hog that records its pid and sleeps: the loaded run's hog
    is started and stopped as the busy loop would be, without taking a core from the suite."""
    pids = tmp_path / "hog-pids"
    return {**os.environ, "RAILYARD_STABILITY_HOG": f"echo $$ >> {pids}; exec sleep 600"}, pids


def assert_one_hog_ran_and_stopped(pids: Path) -> None:
    (pid,) = map(int, pids.read_text().split())  # one loaded run of two
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_stability_script_reports_a_test_whose_verdict_flips(tmp_path: Path) -> None:
    """bench/ci_stability.sh at its smallest: two runs (one with a CPU hog) of a steady test and
    of one that fails every second time it runs."""
    tests = tmp_path / "t"
    tests.mkdir()
    counter = tmp_path / "count"
    (tests / "test_probe.py").write_text(
        "from pathlib import Path\n"
        f"COUNT = Path({str(counter)!r})\n"
        "def test_steady():\n    assert True\n"
        "def test_flips():\n"
        "    n = int(COUNT.read_text()) if COUNT.exists() else 0\n"
        "    COUNT.write_text(str(n + 1))\n"
        "    assert n % 2 == 0\n"
    )
    out = tmp_path / "ci_stability.json"
    env, hogs = stand_in_hog(tmp_path)
    done = subprocess.run(["bash", str(BENCH / "ci_stability.sh"), "-n", "2", "--out", str(out), "--junit-dir", str(tmp_path / "junit"),
                           str(tests)], cwd=ROOT, capture_output=True, text=True, timeout=HANG_S, env=env)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # a mixed verdict fails it
    assert_one_hog_ran_and_stopped(hogs)
    report = json.loads(out.read_text())
    check_shape(report, "ci_stability")
    assert [r["loaded"] for r in report["runs"]] == [False, True]
    (flips,) = report["mixed"]
    assert flips.endswith("::test_flips")
    assert report["tests"][flips]["verdicts"] == ["passed", "failed"]
    steady = next(n for n in report["tests"] if n.endswith("::test_steady"))
    assert report["tests"][steady]["verdicts"] == ["passed", "passed"]
    assert "test_flips" in done.stdout and "passed / failed" in done.stdout


def test_the_stability_script_runs_ci_in_fresh_clones_and_merges_the_lanes(tmp_path: Path) -> None:
    """Without pytest args every run is ``bash .ci/run`` in a fresh clone of HEAD, and the JUnit
    XML of its lanes is merged: here a repository whose .ci/run runs two lanes of pytest (one of
    them with a test that fails in every second clone), as the real one does."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / ".ci").mkdir()
    (repo / "bench" / "ci_stability.sh").write_text((BENCH / "ci_stability.sh").read_text())
    counter = tmp_path / "count"
    (repo / "t_a").mkdir()
    (repo / "t_a" / "test_a.py").write_text("def test_steady():\n    assert True\n")
    (repo / "t_b").mkdir()
    (repo / "t_b" / "test_b.py").write_text(
        "from pathlib import Path\n"
        f"COUNT = Path({str(counter)!r})\n"
        "def test_flips():\n"
        "    n = int(COUNT.read_text()) if COUNT.exists() else 0\n"
        "    COUNT.write_text(str(n + 1))\n"
        "    assert n % 2 == 0\n"
    )
    (repo / ".ci" / "run").write_text(
        "set -u\n"
        "test ! -e uncommitted.txt || exit 3  # a clone has only what is committed\n"
        f"{sys.executable} -m pytest -q -p no:cacheprovider --junitxml=$RAILYARD_CI_JUNIT_DIR/lane-a.xml t_a\n"
        f"{sys.executable} -m pytest -q -p no:cacheprovider --junitxml=$RAILYARD_CI_JUNIT_DIR/lane-b.xml t_b\n"
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (repo / "uncommitted.txt").write_text("not cloned")
    out = tmp_path / "ci_stability.json"
    clones = tmp_path / "clones"  # the script's mktemp -d
    clones.mkdir()
    env, hogs = stand_in_hog(tmp_path)
    done = subprocess.run(["bash", "bench/ci_stability.sh", "-n", "2", "--out", str(out), "--junit-dir", str(tmp_path / "junit")],
                          cwd=repo, capture_output=True, text=True, timeout=HANG_S, env={**env, "TMPDIR": str(clones)})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert_one_hog_ran_and_stopped(hogs)
    report = json.loads(out.read_text())
    check_shape(report, "ci_stability")
    assert report["mode"] == "bash .ci/run in a fresh clone" and len(report["commit"]) == 40, report["mode"]
    assert [r["loaded"] for r in report["runs"]] == [False, True]
    assert [r["tests"] for r in report["runs"]] == [2, 2], "both lanes' XML of each run"
    (flips,) = report["mixed"]
    assert flips.endswith("test_flips") and report["tests"][flips]["verdicts"] == ["passed", "failed"]
    assert list(clones.iterdir()) == [], "the clones are removed"
