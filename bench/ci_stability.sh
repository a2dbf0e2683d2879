#!/usr/bin/env bash
# Does every test give the same verdict every run? Runs the test suite N times (default 4), every
# second run with a CPU hog pinned to one core for the whole run (`taskset -c 1` a busy loop, as
# another tenant of a shared 2-core CI machine would), and reports per test how often it passed,
# failed or was skipped. A test with a mixed verdict is a defect (DEVELOPERS.md).
#
#   bash bench/ci_stability.sh [-n N] [--out FILE] [--junit-dir DIR]            # CI, as it lands
#   bash bench/ci_stability.sh [-n N] [--out FILE] [--junit-dir DIR] PYTEST_ARGS  # here, one pytest
#   bash bench/ci_stability.sh -n 2 tests/system tests/local tests/operator
#
# Without pytest args every run is exactly what CI does: a fresh `git clone` of this repository's
# HEAD (commit first: only committed work is cloned) runs `bash .ci/run` (packages, venv, static
# checks, the suite in its two lanes, the images), and the lanes' JUnit XML is collected. With
# pytest args every run is `python -m pytest ARGS` in this checkout.
#
# Writes the JUnit XML and the log of every run (--junit-dir, default .railyard/ci-stability) and
# FILE (default bench/results/ci_stability.json):
# {"bench": "ci_stability", "results": [...], "runs": [...], "tests": {nodeid: {...}}}; prints a
# table of the tests with mixed verdicts. Exit 0 when no test had a mixed verdict.
# RAILYARD_STABILITY_HOG: a shell command to run as the hog instead of the busy loop.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=4
out=bench/results/ci_stability.json
junit_dir=.railyard/ci-stability
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) runs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --junit-dir) junit_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) break ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "ci_stability: -n wants a positive integer, got '$runs'" >&2; exit 2; }
command -v taskset >/dev/null || { echo "ci_stability: needs taskset (apt-get install util-linux)" >&2; exit 2; }

python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python
export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo PYTHONUNBUFFERED=1
cores=$(getconf _NPROCESSORS_ONLN)  # not nproc: it honours OMP_NUM_THREADS
hog_core=$(( cores > 1 ? 1 : 0 ))
rm -rf "$junit_dir"
mkdir -p "$junit_dir" "$(dirname "$out")"
abs_junit_dir=$(cd "$junit_dir" && pwd)
work=$(mktemp -d)  # the fresh clones (CI mode)
meta="$junit_dir/runs.tsv"
: > "$meta"

#: the hog; RAILYARD_STABILITY_HOG replaces it with another command (the script's own test uses one
#: that records that it ran and then sleeps, to leave the core to the suite it runs in)
hog_cmd=${RAILYARD_STABILITY_HOG:-"exec $python -c 'while True: pass'"}
hog_pid=""
test_pid=""
stop_hog() {
  if [[ -n "$hog_pid" ]]; then
    kill "$hog_pid" 2>/dev/null || true
    wait "$hog_pid" 2>/dev/null || true
    hog_pid=""
  fi
}
interrupted() {
  [[ -n "$test_pid" ]] && kill "$test_pid" 2>/dev/null
  stop_hog
  echo "ci_stability: interrupted" >&2
  exit 130
}
trap 'stop_hog; rm -rf "$work"' EXIT
trap interrupted INT TERM

for ((i = 1; i <= runs; i++)); do
  loaded=$(( i % 2 == 0 ? 1 : 0 ))
  if (( loaded )); then
    taskset -c "$hog_core" bash -c "$hog_cmd" &
    hog_pid=$!
  fi
  label=$([[ $loaded == 1 ]] && echo "with a CPU hog on core $hog_core" || echo "idle")
  start=$(date +%s)
  load_before=$(cut -d' ' -f1 /proc/loadavg)
  # in the background and waited for, so that an interrupt reaches the trap at once
  if (( $# == 0 )); then
    echo "== run $i of $runs ($label): bash .ci/run in a fresh clone of $(git rev-parse --short HEAD)"
    clone="$work/run-$i"
    mkdir -p "$junit_dir/run-$i"
    git clone -q . "$clone"
    (cd "$clone" && RAILYARD_CI_JUNIT_DIR="$abs_junit_dir/run-$i" exec bash .ci/run) > "$junit_dir/run-$i.log" 2>&1 &
  else
    echo "== run $i of $runs ($label): pytest $*"
    "$python" -m pytest -q -p no:cacheprovider -o junit_logging=system-out --junitxml="$junit_dir/run-$i.xml" "$@" \
      > "$junit_dir/run-$i.log" 2>&1 &
  fi
  test_pid=$!
  set +e
  wait "$test_pid"
  rc=$?
  set -e
  test_pid=""
  stop_hog
  [[ -z "${clone:-}" ]] || rm -rf "$clone"  # its venv is 2 GB
  tail -n 15 "$junit_dir/run-$i.log"
  printf '%s\t%s\t%s\t%s\t%s\n' "$i" "$loaded" "$rc" "$(( $(date +%s) - start ))" "$load_before" >> "$meta"
done

"$python" - "$junit_dir" "$out" "$*" "$(git rev-parse HEAD 2>/dev/null || echo unknown)" <<'EOF'
"""Collect the runs' JUnit XML into one report: per test, its verdict in every run."""
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

junit_dir, out, args, commit = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
runs = []
for line in (junit_dir / "runs.tsv").read_text().splitlines():
    i, loaded, rc, seconds, load = line.split("\t")
    runs.append({"run": int(i), "loaded": loaded == "1", "exit_code": int(rc), "seconds": int(seconds), "load_average_at_start": float(load)})

tests: dict[str, dict] = {}
for run in runs:
    one = junit_dir / f"run-{run['run']}.xml"  # pytest mode; CI mode: one file per lane
    xmls = [one] if one.exists() else sorted((junit_dir / f"run-{run['run']}").glob("*.xml"))
    seen: dict[str, str] = {}
    for xml in xmls:
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                verdict = "failed"
            elif case.find("skipped") is not None:
                verdict = "skipped"
            else:
                verdict = "passed"
            seen[name] = verdict
    run["tests"] = len(seen)
    run["failed"] = sorted(n for n, v in seen.items() if v == "failed")
    for name in set(seen) | set(tests):
        entry = tests.setdefault(name, {"verdicts": ["missing"] * (run["run"] - 1)})
        entry["verdicts"].append(seen.get(name, "missing"))

mixed = {}
for name, entry in sorted(tests.items()):
    v = entry["verdicts"]
    entry.update(passed=v.count("passed"), failed=v.count("failed"), skipped=v.count("skipped"))
    entry["idle"] = [x for x, r in zip(v, runs) if not r["loaded"]]
    entry["loaded"] = [x for x, r in zip(v, runs) if r["loaded"]]
    if len(set(v)) > 1:
        mixed[name] = entry
always_failed = [n for n, e in tests.items() if e["failed"] == len(runs)]

def row(metric, value, unit, target=None, meets=None):
    return {"metric": metric, "value": value, "unit": unit, "target": target, "meets": meets}

results = [
    row("runs", len(runs), "runs"),
    row("runs with a CPU hog on one core", sum(r["loaded"] for r in runs), "runs"),
    row("tests seen", len(tests), "tests"),
    row("tests with a mixed verdict", len(mixed), "tests", 0, len(mixed) == 0),
    row("tests failing in every run", len(always_failed), "tests", 0, not always_failed),
    row("runs that passed", sum(r["exit_code"] == 0 for r in runs), "runs", len(runs), all(r["exit_code"] == 0 for r in runs)),
]
report = {"bench": "ci_stability", "mode": "pytest " + args if args else "bash .ci/run in a fresh clone", "commit": commit, "results": results, "runs": [{k: v for k, v in r.items()} for r in runs],
          "mixed": sorted(mixed), "tests": tests}
out.write_text(json.dumps(report, indent=1) + "\n")

print()
print(f"{'run':>4} {'CPU hog':>8} {'exit':>5} {'seconds':>8} {'load@start':>10} {'tests':>6}  failed")
for r in runs:
    print(f"{r['run']:>4} {'yes' if r['loaded'] else 'no':>8} {r['exit_code']:>5} {r['seconds']:>8} {r['load_average_at_start']:>10.2f} {r['tests']:>6}  {', '.join(r['failed']) or '-'}")
print()
if mixed:
    width = max(len(n) for n in mixed)
    print(f"{'test with a mixed verdict':<{width}}  idle runs / runs with a CPU hog")
    for name, e in mixed.items():
        print(f"{name:<{width}}  {' '.join(e['idle'])} / {' '.join(e['loaded'])}")
else:
    print(f"no test had a mixed verdict over {len(runs)} runs ({sum(r['loaded'] for r in runs)} with a CPU hog)")
for m in results:
    meets = "" if m["meets"] is None else ("yes" if m["meets"] else "NO")
    print(f"{m['metric']:<36} {m['value']:>6} {m['unit']:<6} {meets}")
print(f"wrote {out}")
sys.exit(1 if mixed else 0)
EOF
