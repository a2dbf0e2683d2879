"""What a bench result says about itself: the commit it measured, the date and the machine.

Every bench in bench/ writes its ``bench/results/<name>.json`` through :func:`write_results`,
which adds ``commit`` (HEAD of the checkout it ran in; ``dirty`` when the tree had uncommitted
changes), ``date`` (UTC), ``machine`` (cores and CPU model, merged with what the bench adds) and
``measures``, the code paths the bench declares it measures (its ``MEASURES``).
tests/bench/test_results_are_current.py fails when a result is older than the code it measures
by more than one round (the rule is in bench/README.md).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(measures: Sequence[str]) -> dict[str, Any]:
    """The fields :func:`write_results` adds (``commit`` is None outside a git checkout)."""
    # results written by earlier runs in the same checkout are not code: they do not make it dirty
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results")
    return {
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": {"cpus": os.cpu_count(), "cpu": _cpu_model()},
        "measures": list(measures),
    }


def write_results(out: Path | str, doc: dict[str, Any], measures: Sequence[str], *, indent: int = 2) -> None:
    """Write ``doc`` (``{"bench": name, "results": [...], ...}``) with its provenance."""
    made = provenance(measures)
    made["machine"] = {**made["machine"], **doc.get("machine", {})}
    rest = {k: v for k, v in doc.items() if k not in ("bench", "machine")}
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bench": doc["bench"], **made, **rest}, indent=indent) + "\n")
