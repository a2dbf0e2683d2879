"""The speed probe: a fixed, collective-free workload each rank times every step.

In synchronous training every rank waits for the slowest, and under FSDP that wait happens
*inside* forward and backward (parameters are all-gathered block by block), so a healthy rank's
forward+backward time grows as much as the slow rank's: compute time is not a usable straggler
signal. The probe is: the same matrix products on every rank, on the rank's own device, timed
with a device sync and no communication. A throttled GPU (or a throttled simulated node) takes
longer; nothing else does. Its time is what heartbeats carry as ``compute_s``.

Each probe is three short runs and reports the median: one run delayed from outside (the OS
scheduling another process on a shared CPU, a page fault) does not move it, while a throttled
device is slow in every run. Sizes: about 3 x 0.5 ms
on an H100-class GPU (4096^2 bf16, 3 products each) and about 3 x 6 ms on one CPU core (256^2
fp32, 32 products each), a few percent of a step of the presets meant for each.
"""

from __future__ import annotations

import time

import torch


class SpeedProbe:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            n, self.iters, dtype = 4096, 3, torch.bfloat16
        else:
            n, self.iters, dtype = 256, 32, torch.float32
        self.repeats = 3
        gen = torch.Generator(device="cpu").manual_seed(1234)
        self.a = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype) / n**0.5
        self.b = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype) / n**0.5
        self.run()  # warm up kernels and allocator outside the measured steps

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self) -> float:
        """Seconds of the median of this probe's runs on this rank."""
        runs = sorted(self._once() for _ in range(self.repeats))
        return runs[len(runs) // 2]

    @torch.no_grad()
    def _once(self) -> float:
        self._sync()
        start = time.perf_counter()
        x = self.a
        for _ in range(self.iters):
            x = torch.mm(x, self.b)
        self._sync()
        return time.perf_counter() - start
