"""The speed probe: a fixed, collective-free workload each rank runs every step, timed in the
device's own clock. Its time is what heartbeats carry as ``compute_s``, the straggler signal.

Why a probe: in synchronous training every rank waits for the slowest, and under FSDP that wait
happens *inside* forward and backward (parameters are all-gathered block by block), so a
healthy rank's forward+backward time grows as much as the slow rank's. The probe is the same
matrix products on every rank, on the rank's own device, with no communication.

Why the device's clock, not the wall clock: the score compares ranks, so anything that delays
one rank's probe without slowing its device would fake a straggler, and anything that delays
the healthy ones would hide one.

- **GPU**: CUDA events around the products. A throttling GPU (power, thermals, a bad HBM stack)
  takes longer on its own timeline for the same work; the host being descheduled between
  launches does not enter (the products are queued back to back and the GPU runs them without
  waiting for the host).
- **CPU** (the local cluster, tests, the demo): the CPU stands in for an accelerator. Wall time is
  useless on a shared machine (another process on the core stretches it), and so, measured here,
  is process CPU time alone: on a virtual machine the same products cost 7 ms of CPU on one
  vCPU and 10-11 ms on the other for seconds at a time, because the host's sibling hyperthreads
  and other tenants change a vCPU's speed. So each run measures, in the thread's CPU time, the
  nominal work (the host's cost of it right now) and the stand-in device's work, interleaved
  product by product on the same thread. The ratio is the device's slow-down, free of the
  host's noise (healthy ranks score 0.95-1.0 against each other even with the machine's load at
  18 and a busy loop on one core); ``compute_s`` is that ratio times the stand-in's rated probe
  time.

The device's work is the nominal work times its slow-down: ``slow_factor`` from the trainer's
own ``slow`` fault, times the simulated node's throttle (``railyard local node slow``), which the
local cluster's node agent publishes per node (railyard.protocol.device). On a real node there
is no such file and a throttled device is simply slower. Either way the operator's rule
(logic/health/straggler.py) reads one thing: how long this rank's device takes for the same
work, against its peers.

Each probe is three runs and reports the median: one run disturbed from outside (a page fault,
the stand-in's host switching speed between the two halves of a pair) does not move it, while a
throttled device is slow in every run. Sizes: about 3 x 1.5 ms on an H100-class GPU (8 products
of 4096^2 bf16 each) and about 3 x 2 x 3.5 ms on one CPU core (16 products of 256^2 fp32 each), a
few percent of a step of the presets meant for each.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from railyard.protocol.device import SIMULATED_DEVICE_ENV, read_device

#: The stand-in device's rated time for one probe run (16 products of 256^2 fp32 at full speed).
STANDIN_PROBE_S = 0.004


class SpeedProbe:
    def __init__(self, device: torch.device, *, device_file: str | None = None) -> None:
        self.device = device
        #: The simulated node's device state (the local cluster only; "" on real nodes).
        self.device_file = os.environ.get(SIMULATED_DEVICE_ENV, "") if device_file is None else device_file
        if device.type == "cuda":
            n, self.iters, dtype = 4096, 8, torch.bfloat16
        else:
            n, self.iters, dtype = 256, 16, torch.float32
        self.repeats = 3
        gen = torch.Generator(device="cpu").manual_seed(1234)
        self.a = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype) / n**0.5
        self.b = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype) / n**0.5
        self.run()  # warm up kernels and allocator outside the measured steps

    def device_slow_factor(self) -> float:
        """The simulated node's throttle, read each probe (it may change mid-run); 1.0 elsewhere."""
        return read_device(self.device_file).slow_factor if self.device_file else 1.0

    def work_for(self, slow_factor: float) -> int:
        """Products the device does in one run: the nominal count times its slow-down."""
        return max(1, round(self.iters * slow_factor * self.device_slow_factor()))

    def run(self, slow_factor: float = 1.0) -> float:
        """Device seconds of this rank's probe (median of its runs); ``slow_factor`` is the
        trainer's own ``slow`` fault."""
        work = self.work_for(slow_factor)
        if self.device.type == "cuda":
            runs = sorted(self._cuda_once(work) for _ in range(self.repeats))
            return runs[len(runs) // 2]
        ratios = sorted(self._standin_once(work) for _ in range(self.repeats))
        return STANDIN_PROBE_S * ratios[len(ratios) // 2]

    @torch.no_grad()
    def _products(self, work: int) -> torch.Tensor:
        x = self.a
        for _ in range(work):
            x = torch.mm(x, self.b)
        return x

    def _cuda_once(self, work: int) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        self._products(work)
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3

    def _standin_once(self, work: int) -> float:
        """The device's work over the nominal work, in this thread's CPU time.

        One chain of products, the nominal ones and the device's interleaved in proportion, each
        product timed on its own: both sides see the same moments of the host (its speed changes
        within milliseconds). Each side's time is its count times its median product: a product
        hit by a preemption (its caches refilled afterwards) or an interrupt moves neither.
        """
        clock = _cpu_clock()
        nominal: list[float] = []
        device: list[float] = []
        x = self.a
        with torch.no_grad():
            while len(nominal) < self.iters or len(device) < work:
                t0 = clock()
                x = torch.mm(x, self.b)
                t = clock() - t0
                if len(device) >= work or (
                    len(nominal) < self.iters and len(nominal) * work <= len(device) * self.iters
                ):
                    nominal.append(t)
                else:
                    device.append(t)
        return (len(device) * _median(device)) / max(len(nominal) * _median(nominal), 1e-12)


def _median(xs: list[float]) -> float:
    ys = sorted(xs)
    k = len(ys)
    return ys[k // 2] if k % 2 else (ys[k // 2 - 1] + ys[k // 2]) * 0.5


def _cpu_clock() -> Callable[[], float]:
    """The calling thread's CPU clock when torch computes in it (one intra-op thread, as the
    trainer runs on CPU); the process's otherwise (its intra-op pool does the work)."""
    return time.thread_time if torch.get_num_threads() == 1 else time.process_time
