"""A bench imported as a module (tests/bench/test_checkpoint_overhead_estimate.py) finds its
sibling helper bench/provenance.py as it does when run as a script (bench/ first on sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
