"""Committed bench results are no older than the code they measure by more than one round.

Every ``bench/<name>.py`` declares ``MEASURES`` (the code paths it measures) and writes
``bench/results/<name>.json`` with the commit it ran on (bench/provenance.py). The rule
(bench/README.md, "Keeping results true"): the recorded commit is an ancestor of HEAD, and
if anything under ``MEASURES`` or the bench script changed since, at most ``ROUND_COMMITS``
commits have landed since (a round: the last one landed 213). So a result may trail the code
for the rest of the round it was measured in, never into the next one; rerunning the bench
and committing its result resets the count. Outside a git checkout (an sdist, a shallow clone
without the commit) it skips and says why.
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
#: One round of development, in commits of HEAD's history (the last round landed 213).
ROUND_COMMITS = 250
#: Result files no bench/<name>.py writes, and why the rule does not apply to them.
NOT_FROM_A_BENCH_SCRIPT = {
    "ci_stability.json": "bench/ci_stability.sh: the suite's verdicts per run, recorded with its own commit",
    "ci_stability_e2e.json": "bench/ci_stability.sh on the end-to-end lane, recorded with its own commit",
    "simulate.json": "written by `railyard simulate` (a seeded trace; tests/sim reruns it)",
}
#: Result files a bench writes under another name (its ``--out``), by file: the bench that
#: writes them, whose MEASURES and age rule they follow.
OTHER_RESULTS = {
    "inplace_existing.json": "inplace.py",  # --kubeconfig: the bench against a separately started server
}


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)


def _require_git() -> None:
    try:
        inside = _git("rev-parse", "--is-inside-work-tree")
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no git to read the history with ({exc})")
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        pytest.skip("not a git checkout: the history that dates a result is not here")


def declared_measures(script: Path) -> tuple[str, ...]:
    """The bench's ``MEASURES`` literal, read without importing the bench (torch, kopf)."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MEASURES" for t in node.targets):
            value = ast.literal_eval(node.value)
            assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), f"{script.name}: MEASURES"
            return value
    raise AssertionError(f"{script.name}: declare MEASURES, the code paths this bench measures")


def bench_scripts() -> list[Path]:
    return sorted(p for p in BENCH.glob("*.py") if p.name not in ("provenance.py", "jobs.py"))  # helpers, not benches


def result_names() -> list[str]:
    return sorted(p.name for p in (BENCH / "results").glob("*.json"))


def test_every_result_file_has_a_bench_that_writes_it() -> None:
    scripts = {f"{p.stem}.json" for p in bench_scripts()}
    assert all((BENCH / s).exists() for s in OTHER_RESULTS.values()), OTHER_RESULTS
    strays = set(result_names()) - scripts - set(NOT_FROM_A_BENCH_SCRIPT) - set(OTHER_RESULTS)
    assert not strays, f"bench/results/{sorted(strays)}: no bench/<name>.py writes these; remove them or say why"


@pytest.mark.parametrize("script", [p.name for p in bench_scripts()])
def test_every_bench_declares_what_it_measures_and_writes_through_provenance(script: str) -> None:
    path = BENCH / script
    for measured in declared_measures(path):
        assert not measured.startswith("/") and ".." not in measured, f"{script}: {measured!r} must be repository-relative"
    assert "write_results(" in path.read_text(), f"{script}: write the results with provenance.write_results"


def results_and_scripts() -> list[tuple[str, str]]:
    """(result file, the bench that writes it) for every committed result a bench writes."""
    own = [(f"{p.stem}.json", p.name) for p in bench_scripts() if (BENCH / "results" / f"{p.stem}.json").exists()]
    return sorted(own + [(r, s) for r, s in OTHER_RESULTS.items() if (BENCH / "results" / r).exists()])


@pytest.mark.parametrize(("name", "script"), results_and_scripts())
def test_the_committed_result_is_no_older_than_its_code_by_more_than_a_round(name: str, script: str) -> None:
    _require_git()
    result = BENCH / "results" / name
    doc = json.loads(result.read_text())
    rerun = f"rerun `python bench/{script}` on this round's code and commit {result.relative_to(ROOT)}"
    commit = doc.get("commit")
    assert commit, f"{result.name} records no commit: {rerun}"
    assert doc.get("date") and doc.get("machine", {}).get("cpus"), f"{result.name} records no date or machine: {rerun}"
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
            pytest.skip(f"{result.name}'s commit {commit[:12]} is not in this shallow clone")
        raise AssertionError(f"{result.name} was measured on {commit[:12]}, which this repository does not have: {rerun}")
    ancestor = _git("merge-base", "--is-ancestor", commit, "HEAD")
    assert ancestor.returncode == 0, f"{result.name} was measured on {commit[:12]}, not an ancestor of HEAD: {rerun}"
    paths = [*declared_measures(BENCH / script), f"bench/{script}"]
    changed = int(_git("rev-list", "--count", f"{commit}..HEAD", "--", *paths).stdout)
    landed = int(_git("rev-list", "--count", f"{commit}..HEAD").stdout)
    assert changed == 0 or landed <= ROUND_COMMITS, (
        f"{result.name} was measured on {commit[:12]}, {landed} commits ago (more than a round, {ROUND_COMMITS}), and "
        f"{changed} of them changed what it measures ({', '.join(paths)}): {rerun}"
    )
