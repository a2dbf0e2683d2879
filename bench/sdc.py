"""SDC harness: random high-order bit flips in parameters or gradients of a small model, caught
before the next tier-2 checkpoint? And false positives over clean steps.

Runs the real trainer-side monitor (railyard_trainer.health) in one process on CPU; see
railyard_trainer/health/harness.py for the protocol. Prints a table, writes bench/results/sdc.json.

    python bench/sdc.py [--flips 200] [--clean-steps 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from railyard_trainer.health.harness import run

RESULTS = Path(__file__).parent / "results" / "sdc.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--flips", type=int, default=200)
    ap.add_argument("--clean-steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tier2-interval", type=int, default=20)
    ap.add_argument("--sdc-interval", type=int, default=10)
    ap.add_argument("--wide-flips", type=int, default=None, help="flips of the wider bit mix (default max(12, flips / 4))")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    main_run = run(flips=args.flips, clean_steps=args.clean_steps, seed=args.seed, tier2_interval=args.tier2_interval, sdc_interval=args.sdc_interval, bits=(30,))
    # Reported, no target: any of the top four exponent bits. Flips of a bit that is already set
    # shrink a value by 2^16..2^128 (to ~0): numerically benign, and invisible without replicas.
    wide = run(flips=args.wide_flips if args.wide_flips is not None else max(12, args.flips // 4), clean_steps=0, seed=args.seed + 1, tier2_interval=args.tier2_interval, sdc_interval=args.sdc_interval, bits=(27, 28, 29, 30))

    rate = main_run.caught / max(1, main_run.flips)
    rows = [
        ("flips injected (exponent MSB, params or grads)", main_run.flips, "flips", None, None),
        ("caught before the next tier-2 checkpoint", round(100 * rate, 2), "%", ">= 99", rate >= 0.99),
        ("caught and confirmed (SDCDetected raised)", main_run.confirmed, "flips", None, None),
    ]
    for target, (n, caught) in sorted(main_run.by_target.items()):
        rows.append((f"  caught: {target}", round(100 * caught / max(1, n), 2), "%", None, None))
    for check, n in sorted(main_run.by_check.items()):
        rows.append((f"  caught by {check}", n, "flips", None, None))
    lat = sorted(main_run.latency_steps)
    if lat:
        rows.append(("steps from flip to detection, max", lat[-1], "steps", f"< {args.tier2_interval}", lat[-1] < args.tier2_interval))
    rows += [
        ("clean steps", main_run.clean_steps, "steps", None, None),
        ("false SDC verdicts over clean steps", main_run.clean_false_sdc, "verdicts", "0", main_run.clean_false_sdc == 0),
        ("failed checks over clean steps", main_run.clean_failed_checks, "checks", "0", main_run.clean_failed_checks == 0),
        ("caught, any of exponent bits 27-30 (no target)", round(100 * wide.caught / max(1, wide.flips), 2), "%", None, None),
        ("wall time", round(main_run.wall_s + wide.wall_s, 1), "s", None, None),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'metric':<{width}}  {'value':>10}  {'unit':<9} {'target':<8} meets")
    for name, value, unit, target, meets in rows:
        print(f"{name:<{width}}  {value!s:>10}  {unit:<9} {target or '':<8} {'' if meets is None else ('yes' if meets else 'NO')}")
    if main_run.missed:
        print("missed:", json.dumps(main_run.missed[:10]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "bench": "sdc",
                "results": [
                    {"metric": n, "value": v, "unit": u, "target": t, "meets": m} for n, v, u, t, m in rows
                ],
                "missed": main_run.missed,
            },
            indent=2,
        )
        + "\n"
    )
    return 0 if rate >= 0.99 and main_run.clean_false_sdc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
