"""Pipeline parallelism over the mesh's pp dimension with torch.distributed.pipelining.

A stage is a copy of the model with the other stages' layers deleted (and the embedding only on
the first stage, norm and output only on the last): no model code changes, and parameter names
are the same as in the unsplit model. GPipe and 1F1B run one stage per rank; Interleaved1F1B
runs two ("virtual") stages per rank, stage ``i`` on pp rank ``i % pp``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.distributed.device_mesh import DeviceMesh

from railyard_trainer.config import ConfigError
from railyard_trainer.model import Transformer

if TYPE_CHECKING:  # imported where a pipeline is built: torch.distributed.pipelining loads
    # torch._dynamo (about 0.5 s of CPU in every worker), which runs without pp do not need
    from torch.distributed.pipelining.schedules import _PipelineSchedule
    from torch.distributed.pipelining.stage import _PipelineStageBase

STAGES_PER_RANK = {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": 2}


def stage_layer_ranges(n_layers: int, n_stages: int) -> list[range]:
    """Contiguous layer ranges, as even as possible; earlier stages get the remainder."""
    base, extra = divmod(n_layers, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        out.append(range(start, start + size))
        start += size
    return out


def check_microbatches(schedule: str, pp: int, microbatches: int, local_batch: int) -> int:
    """The number of microbatches to use (0 means one per stage); raises ConfigError."""
    n_stages = pp * STAGES_PER_RANK[schedule]
    m = microbatches or n_stages
    problems = []
    if local_batch % m:
        problems.append(
            f"parallelism.microbatches: {m} does not divide the per-data-parallel-rank batch {local_batch}; choose "
            "trainer.batchSize = data x microbatches x k"
        )
    if m < pp:
        problems.append(f"parallelism.microbatches: {m} is fewer than the {pp} pipeline ranks; every stage would idle")
    if schedule == "Interleaved1F1B" and m % pp:
        problems.append(
            f"parallelism.microbatches: Interleaved1F1B needs a multiple of the pipeline size {pp}, got {m}"
        )
    if problems:
        raise ConfigError(problems)
    return m


@dataclass
class Pipeline:
    schedule: _PipelineSchedule
    parts: list[Transformer]
    has_first: bool
    has_last: bool


def build_pipeline(
    model: Transformer,
    *,
    pp_mesh: DeviceMesh,
    device: torch.device,
    schedule: str,
    microbatches: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    parallelize: Callable[[Transformer], Transformer],
) -> Pipeline:
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    pp, pp_rank = pp_mesh.size(), pp_mesh.get_local_rank()
    per_rank = STAGES_PER_RANK[schedule]
    n_stages = pp * per_rank
    ranges = stage_layer_ranges(model.args.n_layers, n_stages)
    stage_ids = [pp_rank + v * pp for v in range(per_rank)]
    parts: list[Transformer] = []
    stages: list[_PipelineStageBase] = []
    for sid in stage_ids:
        part = copy.deepcopy(model)
        keep = {str(i) for i in ranges[sid]}
        for name in list(part.layers.keys()):
            if name not in keep:
                del part.layers[name]
        if sid != 0:
            part.tok_embeddings = None
        if sid != n_stages - 1:
            part.norm = None
            part.output = None
        part = parallelize(part)
        parts.append(part)
        stages.append(PipelineStage(part, sid, n_stages, device, group=pp_mesh.get_group()))
    sched: _PipelineSchedule
    if schedule == "Interleaved1F1B":
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=microbatches, loss_fn=loss_fn)
    else:
        cls = ScheduleGPipe if schedule == "GPipe" else Schedule1F1B
        sched = cls(stages[0], n_microbatches=microbatches, loss_fn=loss_fn)
    return Pipeline(sched, parts, has_first=0 in stage_ids, has_last=n_stages - 1 in stage_ids)
