#!/usr/bin/env bash
# The prepared GPU run: one command, at most 8 minutes, results in one folder.
#
#   bash bench/gpu/run.sh --out DIR [--dry] [--budget SECONDS] [--only PART,...]
#
# Uses the machine's python3 and its torch. Wheels in .gpu-wheels/ (bench/gpu/fetch-wheels.sh)
# are unpacked into a folder on PYTHONPATH, each only if its module is not importable already
# (typing_extensions always: tyro needs a newer one than torch may have); no pip, no index,
# nothing replaces torch. Then bench/gpu/run.py runs the parts (bench/gpu/README.md).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [[ ${args[i]} == --out ]] && out=${args[i + 1]:-}
done
[[ -n $out ]] || { echo "usage: bash bench/gpu/run.sh --out DIR [--dry] [--budget S] [--only PART,...]" >&2; exit 2; }
mkdir -p "$out"
py=${PYTHON:-python3}
wheels=${RAILYARD_GPU_WHEELS:-$root/.gpu-wheels}
site=$(mktemp -d "${TMPDIR:-/tmp}/railyard-gpu-site.XXXXXX")
trap 'rm -rf "$site"' EXIT
"$py" - "$wheels" "$site" > "$out/setup.txt" 2>&1 <<'PY'
import importlib.util, pathlib, sys, zipfile
wheels, site = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
print(f"wheels in {wheels}: {len(found)}")
for whl in found:
    with zipfile.ZipFile(whl) as z:
        tops = sorted({n.split("/")[0].removesuffix(".py") for n in z.namelist() if ".dist-info" not in n.split("/")[0] and not n.startswith(".")})
        present = [t for t in tops if t.isidentifier() and importlib.util.find_spec(t) is not None]
        if present and not whl.name.startswith("typing_extensions"):
            print(f"kept the machine's {present} ({whl.name} not unpacked)")
            continue
        z.extractall(site)
        print(f"unpacked {whl.name}")
PY
export PYTHONPATH="$root/operator:$root/trainer_image:$site${PYTHONPATH:+:$PYTHONPATH}"
cat "$out/setup.txt"
# 8 minutes in all: the parts' overall budget (run.py --budget, default 440 s) plus a margin.
timeout -k 10 470 "$py" "$root/bench/gpu/run.py" "$@"
rc=$?
[[ $rc == 124 ]] && echo "bench/gpu/run.sh: stopped at 470 s; the parts finished so far are in $out/parts" >&2
exit $rc
