"""The speed probe (the straggler signal) measures the device, not the machine around it: a
throttled device reads slower by its factor; another process competing for the same CPU core
does not move it. On the shared 2-core CI machine this is what makes the straggler verdicts the
same every run (tests/system/test_faults_end_to_end.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from railyard.protocol.device import SimulatedDevice, decode_device, read_device, write_device  # noqa: E402
from railyard_trainer.speed_probe import STANDIN_PROBE_S, SpeedProbe  # noqa: E402

pytestmark = pytest.mark.torch


def probe_median(probe: SpeedProbe, n: int = 9, slow_factor: float = 1.0) -> float:
    values = sorted(probe.run(slow_factor) for _ in range(n))
    return values[n // 2]


@contextlib.contextmanager
def alone_on_one_cpu() -> Iterator[int]:
    """Pin this thread (where torch computes, one intra-op thread) to one CPU; restore after."""
    before = os.sched_getaffinity(0)
    cpu = min(before)
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def hog(cpu: int) -> Iterator[None]:
    """A busy process on ``cpu`` for as long as the block runs."""
    proc = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def test_a_throttled_simulated_device_reads_slower_by_its_factor(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    full, slowed = tmp_path / "full.json", tmp_path / "slowed.json"
    write_device(full, SimulatedDevice(1.0))
    write_device(slowed, SimulatedDevice(1.3))
    fast = SpeedProbe(torch.device("cpu"), device_file=str(full))
    slow = SpeedProbe(torch.device("cpu"), device_file=str(slowed))
    assert slow.work_for(1.0) == 21 and fast.work_for(1.0) == 16
    t_fast, t_slow = probe_median(fast), probe_median(slow)
    # the stand-in reports its rated time times the measured slow-down (21/16 = 1.31)
    assert t_fast == pytest.approx(STANDIN_PROBE_S, rel=0.1)
    assert t_slow / t_fast == pytest.approx(21 / 16, rel=0.1)
    # the trainer's own slow fault multiplies in
    assert probe_median(fast, slow_factor=2.0) / t_fast == pytest.approx(2.0, rel=0.1)


def test_the_throttle_is_read_every_probe(tmp_path: Path) -> None:
    path = tmp_path / "device.json"
    probe = SpeedProbe(torch.device("cpu"), device_file=str(path))  # no file yet: full speed
    assert probe.work_for(1.0) == 16
    write_device(path, SimulatedDevice(2.0))
    assert probe.work_for(1.0) == 32 and probe.work_for(1.5) == 48
    path.write_text("not json")  # a torn or foreign file never fails a training step
    assert probe.work_for(1.0) == 16
    assert SpeedProbe(torch.device("cpu"), device_file="").work_for(1.0) == 16  # a real node


def test_another_process_on_the_same_core_does_not_move_the_probe() -> None:
    torch.set_num_threads(1)
    probe = SpeedProbe(torch.device("cpu"), device_file="")
    with alone_on_one_cpu() as cpu:
        quiet = probe_median(probe)
        with hog(cpu):
            t0 = time.perf_counter()
            contended = probe_median(probe)
            wall = time.perf_counter() - t0
    # wall time would read ~2x here (the core is shared half and half); device time does not
    assert contended / quiet == pytest.approx(1.0, abs=0.1), (quiet, contended, wall)


def test_device_files_are_checked() -> None:
    assert decode_device('{"slowFactor": 1.5}') == SimulatedDevice(1.5)
    for bad, field in (('{"slowFactor": "fast"}', "slowFactor"), ('{"slowFactor": 0.5}', "slowFactor"), ("[]", "object")):
        with pytest.raises(ValueError, match=field):
            decode_device(bad)
    assert read_device("/nonexistent/device.json") == SimulatedDevice()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_probe_times_cuda_events() -> None:
    probe = SpeedProbe(torch.device("cuda"), device_file="")
    t1, t2 = probe_median(probe, 5), probe_median(probe, 5, slow_factor=2.0)
    assert 0 < t1 < 0.1 and t2 / t1 == pytest.approx(2.0, rel=0.2)
