"""faultTolerance ReplicaGroups, the trainer's pieces for the other failure classes: a fault that
names a group fires only there, and ``params_crc32`` (the ``done`` event's) tells two groups'
parameters apart by one flipped bit and finds identical ones equal."""

from __future__ import annotations

import torch
from torch import nn

from railyard_trainer.config import FaultSpec
from railyard_trainer.faults import FaultInjector, flip_bit
from railyard_trainer.replicas import params_crc32


def test_a_fault_that_names_a_group_fires_only_in_that_group() -> None:
    faults = (FaultSpec(kind="hang", rank=0, step=4, group=2), FaultSpec(kind="crash", rank=0, step=5))
    in_group = {g: [f.kind for f in FaultInjector(faults, rank=0, log=lambda *a, **k: None, group=g).faults] for g in (0, 2)}
    assert in_group == {0: ["crash"], 2: ["hang", "crash"]}, "an unnamed group: every group"
    assert [f.kind for f in FaultInjector(faults, rank=0, log=lambda *a, **k: None).faults] == ["crash"], "one world: group-bound faults never fire"


def test_params_crc32_is_equal_for_equal_parameters_and_sees_one_flipped_bit() -> None:
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    b = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    b.load_state_dict(a.state_dict())
    assert params_crc32([a]) == params_crc32([b])
    with torch.no_grad():
        flip_bit(b[0].weight, 3)  # a low mantissa bit: no magnitude check would notice
    assert params_crc32([a]) != params_crc32([b])
