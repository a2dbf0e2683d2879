"""SDC catch rates: bit flips injected into the trainer, caught before the next checkpoint?

Two parts, each printed as a table and written to bench/results/sdc.json:

1. **Per layout** (railyard_trainer/health/layouts.py): the real trainer as gloo ranks on CPU in
   each layout (FSDP dp=2, dp x tp = 2 x 2, pp x dp = 2 x 2, HSDP 2 replicas x 2 shards); one
   bit of one element of one tensor on one rank flipped, at every exponent bit (30..23) and the
   top mantissa bits (22..19), in a parameter right after the optimizer step or in a gradient
   right after backward. Caught = an SDC verdict, or the next checkpoint (every ``--interval``
   steps) would not be marked clean.
2. **Single process** (railyard_trainer/health/harness.py): many flips of the top exponent bit and
   a clean run for false positives.

    python bench/sdc.py                      # the full table (about 10-15 minutes on 2 cores)
    python bench/sdc.py --smoke              # CI size: 1 flip per cell of 3 bits, small single run
    python bench/sdc.py --layouts hsdp --bits 22,21 --trials 20 --no-single
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

from provenance import write_results
from railyard_trainer.health.harness import run as run_single
from railyard_trainer.health.layouts import (
    EXPONENT_BITS,
    LAYOUTS,
    TARGETS,
    TOP_MANTISSA_BITS,
    CatchTable,
    plan_trials,
    run_layout,
)

#: The code this bench measures (bench/provenance.py: a result is stale once it changed for a round).
MEASURES = (
    "trainer_image/railyard_trainer/health",
    "trainer_image/railyard_trainer/grads.py",
)


RESULTS = Path(__file__).parent / "results" / "sdc.json"
Row = tuple[str, Any, str, Any, Any]


def _ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x)


def _pct(n: int, caught: int) -> float:
    return round(100 * caught / max(1, n), 1)


def _cell(cell: list[int]) -> str:
    n, caught, absorbed = cell
    text = f"{_pct(n, caught)}% ({caught}/{n})" if n else "-"
    return text + (f" +{absorbed} absorbed" if absorbed else "")


def layout_rows(table: CatchTable, bits: tuple[int, ...]) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    md = ["| layout | target | " + " | ".join(f"bit {b}" for b in bits) + " |", "|---|---|" + "---|" * len(bits)]
    for layout, by_target in table.cells.items():
        for target, cells in by_target.items():
            md.append(f"| {layout} | {target} | " + " | ".join(_cell(cells[b]) if b in cells else "" for b in bits) + " |")
            for b in bits:
                if b in cells:
                    n, c, absorbed = cells[b]
                    rows.append((f"caught: {layout} {target} bit {b}", _pct(n, c), "%", None, None))
                    if absorbed:
                        rows.append((f"absorbed (no effect on the state): {layout} {target} bit {b}", absorbed, "flips", None, None))
            exp = [cells[b][:2] for b in bits if b in cells and b >= 23]
            man = [cells[b][:2] for b in bits if b in cells and b < 23]
            if exp:
                n, c = sum(x[0] for x in exp), sum(x[1] for x in exp)
                top = cells.get(30)
                rows.append((f"caught: {layout} {target}, exponent bits", _pct(n, c), "%", None, None))
                if top:
                    rate = top[1] / max(1, top[0])
                    rows.append((f"caught: {layout} {target}, top exponent bit (30)", _pct(top[0], top[1]), "%", ">= 99", rate >= 0.99))
            if layout == "hsdp" and exp + man:
                n, c = sum(x[0] for x in exp + man), sum(x[1] for x in exp + man)
                rows.append((f"caught: hsdp {target}, every bit measured", _pct(n, c), "%", "100", c == n))
            if man:
                n, c = sum(x[0] for x in man), sum(x[1] for x in man)
                rows.append((f"caught: {layout} {target}, top mantissa bits", _pct(n, c), "%", None, None))
    return rows, md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma list of {', '.join(LAYOUTS)}")
    ap.add_argument("--bits", type=_ints, default=EXPONENT_BITS + TOP_MANTISSA_BITS, help="float32 bits to flip (default 30..19)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="param (after the update) and/or grad (after backward)")
    ap.add_argument("--trials", type=int, default=8, help="flips per (layout, target, bit) cell")
    ap.add_argument("--interval", type=int, default=2, help="steps between checkpoints")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--flips", type=int, default=200, help="single-process run: flips of the top exponent bit")
    ap.add_argument("--clean-steps", type=int, default=1000, help="single-process run: clean steps (false positives)")
    ap.add_argument("--layout-clean-steps", type=int, default=100, help="per layout: clean steps before the trials (false positives)")
    ap.add_argument("--no-single", action="store_true", help="skip the single-process run")
    ap.add_argument("--smoke", action="store_true", help="CI size: 1 flip per cell, bits 30,27,22, a small single-process run")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.smoke:
        args.trials, args.bits, args.flips, args.clean_steps, args.layout_clean_steps = 1, (30, 27, 22), 12, 60, 10
    logging.basicConfig(level=logging.ERROR)
    t0 = time.perf_counter()

    table = CatchTable()
    misses: list[dict[str, Any]] = []
    walls: dict[str, float] = {}
    clean: dict[str, tuple[int, int, int]] = {}
    targets = tuple(t for t in args.targets.split(",") if t)
    with tempfile.TemporaryDirectory() as tmp:
        for layout in [x for x in args.layouts.split(",") if x]:
            plan = plan_trials(targets=targets, bits=args.bits, trials=args.trials, world=LAYOUTS[layout][0], interval=args.interval, seed=args.seed)
            data = run_layout(layout, plan, Path(tmp) / f"{layout}.json", interval=args.interval, seed=args.seed, clean_steps=args.layout_clean_steps)
            walls[layout] = data["wall_s"]
            clean[layout] = (data["clean_steps"], len(data["clean_false_verdicts"]), len(data["clean_unclean_checkpoints"]))
            for r in data["results"]:
                table.add(r)
                if not r["caught"]:
                    misses.append(r)
    rows, md = layout_rows(table, tuple(args.bits))
    for layout, (steps, verdicts, unclean) in clean.items():
        rows.append((f"{layout}: clean steps (no flips)", steps, "steps", None, None))
        rows.append((f"{layout}: false SDC verdicts or unclean checkpoints over clean steps", verdicts + unclean, "events", "0", verdicts + unclean == 0))

    single: Any = None
    if not args.no_single:
        single = run_single(flips=args.flips, clean_steps=args.clean_steps, seed=args.seed, bits=(30,))
        rate = single.caught / max(1, single.flips)
        rows += [
            ("single process: flips of the top exponent bit", single.flips, "flips", None, None),
            ("single process: caught before the next checkpoint", round(100 * rate, 2), "%", ">= 99", rate >= 0.99),
            ("single process: clean steps", single.clean_steps, "steps", None, None),
            ("single process: false SDC verdicts over clean steps", single.clean_false_sdc, "verdicts", "0", single.clean_false_sdc == 0),
            ("single process: failed checks over clean steps", single.clean_failed_checks, "checks", "0", single.clean_failed_checks == 0),
        ]
    rows.append(("wall time", round(time.perf_counter() - t0, 1), "s", None, None))

    width = max(len(r[0]) for r in rows)
    print("\n".join(md))
    print()
    print(f"{'metric':<{width}}  {'value':>10}  {'unit':<9} {'target':<8} meets")
    for name, value, unit, target, meets in rows:
        print(f"{name:<{width}}  {value!s:>10}  {unit:<9} {target or '':<8} {'' if meets is None else ('yes' if meets else 'NO')}")
    by_check = {layout: dict(sorted(v.items())) for layout, v in table.by.items()}
    print("caught by:", json.dumps(by_check))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, {
        "bench": "sdc",
        "results": [{"metric": n, "value": v, "unit": u, "target": t, "meets": m} for n, v, u, t, m in rows],
        "table_markdown": md,
        "caught_by": by_check,
        "layout_wall_s": walls,
        "settings": {"bits": list(args.bits), "targets": list(targets), "trials_per_cell": args.trials, "checkpoint_interval": args.interval},
        "missed": misses,
    }, MEASURES)
    failed = [r for r in rows if r[4] is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
