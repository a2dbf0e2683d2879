"""JSON-lines events on stdout: one object per line, each with ``event`` and ``time``.

Workers inherit the launcher's stdout; one ``write`` per line keeps lines from different
processes whole (each is far below the pipe's atomic-write size).
"""

from __future__ import annotations

import json
import math
import sys
import time
from typing import Any


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def log_event(event: str, **fields: Any) -> None:
    record = {"event": event, "time": round(time.time(), 3), **{k: _clean(v) for k, v in fields.items()}}
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()
