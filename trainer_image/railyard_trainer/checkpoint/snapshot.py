"""A save's snapshot: the host buffers the state is copied into, and the deferred copy.

The buffers are allocated once and reused (pinned when the model is on a GPU; the manager's
``prepare`` allocates them before the first save). What a forward may change is copied while
training waits; the parameters and the optimizer state, which only an optimizer step changes,
are left to the checkpoint's worker (:class:`Capture`, :meth:`HostSnapshot.copy_deferred`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.tensor import DTensor

from railyard_trainer.checkpoint.statedict import _defer, _local, _tensors, tensor_state
from railyard_trainer.hooks import TrainContext


@dataclass
class Capture:
    """The part of a snapshot copied in the background: the parameters and the optimizer
    state, which only an optimizer step changes. The worker copies them while training runs the
    next step's forward and backward, and the next optimizer step waits until it has
    (``CheckpointManager._before_optimizer_step``): the pipelined snapshot of CheckFreq
    (FAST '21), and DCP's asynchronous staging. Everything else (buffers, which a forward may
    change; the RNG state) is copied while training waits, as before."""

    step: int
    #: (live tensor, snapshot buffer) pairs, local shards.
    pairs: list[tuple[torch.Tensor, torch.Tensor]]
    #: On a GPU: recorded on training's stream at the save; the copy stream waits for it.
    event: Any = None
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Training reached an optimizer step before the copy was done, and waits (``stall_s``).
    waiting: bool = False
    accounted: threading.Event = field(default_factory=threading.Event)
    stall_s: float = 0.0
    #: The wait timed out before the copy was done and training went on: the copy may mix two
    #: steps, and the save fails. (``torn`` and ``done`` change under ``lock``: the first wins.)
    torn: bool = False
    error: str = ""

    def finish(self, error: str = "") -> None:
        with self.lock:
            self.error = self.error or error
            self.done.set()

    def stall(self, timeout_s: float) -> float:
        """Training waited this long at its optimizer step for the copy (the worker calls it
        after the copy: a wait that began before it ended is counted once it has)."""
        with self.lock:
            waiting = self.waiting
        if waiting:
            self.accounted.wait(timeout_s)
        return self.stall_s


class HostSnapshot:
    """The host copy of one rank's state that a save writes from (one at a time: a save waits
    for the one before it to be written)."""

    def __init__(self, *, defer_capture: bool) -> None:
        #: Leave the parameters and optimizer state to the worker (:class:`Capture`); the SDK
        #: turns it off (a program's own loop may change its parameters outside an optimizer step).
        self.defer_capture = defer_capture
        self.buffers: dict[str, Any] | None = None
        self._copy_stream: Any = None

    def allocate(self, state: dict[str, Any], *, on_gpu: bool) -> None:
        """Buffers shaped like ``state``, their pages faulted in now (not in the first save)."""
        buffers = _create_cpu_state_dict(state, pin_memory=on_gpu)
        for t in _tensors(buffers):
            (t.to_local() if isinstance(t, DTensor) else t).zero_()
        self.buffers = buffers

    def take(self, ctx: TrainContext) -> tuple[dict[str, Any], Capture | None]:
        """Copy what a forward may change now; the parameters and optimizer state, when they can
        be left to the worker (:class:`Capture`), are returned as pairs for it to copy (by
        :meth:`copy_deferred`)."""
        state = tensor_state(ctx)
        on_gpu = any(t.is_cuda for t in _tensors(state))
        live = self._deferrable(ctx)
        if self.buffers is None:
            self.buffers = _create_cpu_state_dict(state, pin_memory=on_gpu)
        try:
            snap, pairs = self._copy_now(state, live, on_gpu)
        except Exception:
            # The state's structure changed (e.g. optimizer state appeared): new buffers.
            self.buffers = _create_cpu_state_dict(state, pin_memory=on_gpu)
            snap, pairs = self._copy_now(state, live, on_gpu)
        event = None
        if on_gpu:
            if pairs:
                event = torch.cuda.Event()
                event.record()  # the copy stream starts after everything training queued so far
            torch.cuda.synchronize()
        return snap, (Capture(step=ctx.step, pairs=pairs, event=event) if pairs else None)

    def _deferrable(self, ctx: TrainContext) -> set[int] | None:
        """The storages of the parameters, when an optimizer step (and nothing else) changes
        them: the trainer's own loop with a torch optimizer, not a program's own state dict."""
        if not self.defer_capture or callable(ctx.extra.get("state_dict")):
            return None
        if not isinstance(ctx.optimizer, torch.optim.Optimizer):
            return None
        return {_local(p).untyped_storage().data_ptr() for m in ctx.model_parts for p in m.parameters()}

    def _copy_now(
        self, state: dict[str, Any], live: set[int] | None, on_gpu: bool
    ) -> tuple[dict[str, Any], list[tuple[torch.Tensor, torch.Tensor]]]:
        assert self.buffers is not None
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        source = state
        if live is not None:
            # The deferred leaves are replaced by their own buffers: copying a tensor onto
            # itself is a no-op, so the copy below takes only the rest.
            source = dict(state)
            source["model"] = _defer(state["model"], self.buffers["model"], live, pairs)
            if "optim" in state:
                source["optim"] = _defer(state["optim"], self.buffers["optim"], None, pairs)
        return _copy_state_dict(source, self.buffers, non_blocking=on_gpu), pairs

    def copy_deferred(self, cap: Capture) -> None:
        """Worker: copy a capture's pairs into the buffers (on a GPU on a stream of its own,
        after everything training had queued at the save). Raises what the copy raised."""
        if cap.event is not None:
            if self._copy_stream is None:
                self._copy_stream = torch.cuda.Stream(device=cap.pairs[0][0].device)
            with torch.no_grad(), torch.cuda.stream(self._copy_stream):
                self._copy_stream.wait_event(cap.event)
                for src, dst in cap.pairs:
                    dst.copy_(src, non_blocking=True)
            self._copy_stream.synchronize()
        else:
            with torch.no_grad():
                for src, dst in cap.pairs:
                    dst.copy_(src)
