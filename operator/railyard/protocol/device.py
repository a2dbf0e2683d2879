"""What a simulated node tells the trainer about its accelerator.

A real node needs nothing of this: a throttling GPU takes longer, in its own clock (CUDA
events), for the same work, and the trainer's speed probe sees it. The local cluster's
simulated nodes have no accelerator; the trainer runs on a CPU that stands in for one, and
``railyard local node slow --factor F`` throttles that simulated device. The node agent
publishes the device's state as a small JSON file and names it in the pod's environment
(:data:`SIMULATED_DEVICE_ENV`); the speed probe reads it every step and gives the stand-in
device ``F`` times the work, which is what a throttled GPU amounts to: more device time for the
same probe. Standard library only: both the agent and the trainer import it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from railyard.protocol import podenv

#: Environment variable naming the node's device file (set by the local node agent only).
SIMULATED_DEVICE_ENV = podenv.SIMULATED_DEVICE_FILE.name


@dataclass(frozen=True)
class SimulatedDevice:
    """The simulated accelerator of one node; ``slow_factor`` 1.0 is full speed."""

    slow_factor: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.slow_factor) or self.slow_factor < 1.0:
            raise ValueError(f"slowFactor: {self.slow_factor!r} must be a finite number >= 1")


def encode_device(device: SimulatedDevice) -> str:
    return json.dumps({"slowFactor": device.slow_factor}) + "\n"


def decode_device(text: str) -> SimulatedDevice:
    """Parse a device file; ValueError names the field when it is malformed."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"simulated device file is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("simulated device file must hold a JSON object")
    factor = data.get("slowFactor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        raise ValueError(f"slowFactor: {factor!r} is not a number")
    return SimulatedDevice(slow_factor=float(factor))


def write_device(path: Path, device: SimulatedDevice) -> None:
    """Atomically (a reader sees the old or the new state, never half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(encode_device(device))
    os.replace(tmp, path)


def read_device(path: str | Path) -> SimulatedDevice:
    """The device's state; full speed when the file is missing or unreadable (a node being
    set up, or a pod started outside the local cluster), so a probe never fails on it."""
    try:
        return decode_device(Path(path).read_text())
    except (OSError, ValueError):
        return SimulatedDevice()
