"""The torch-free half of the trainer: config parsing and self-validating parallel dimensions."""

from __future__ import annotations

import sys

import pytest

from railyard.protocol.ranktable import RankEntry
from railyard_trainer.config import ConfigError, TrainerConfig
from railyard_trainer.model_args import PRESETS
from railyard_trainer.parallel_dims import ParallelDims


def test_empty_config_gives_working_defaults() -> None:
    cfg = TrainerConfig.from_dict({})
    assert cfg.trainer.preset == "tiny"
    assert cfg.parallelism.data is None  # derived from the world size
    assert cfg.trainer.faults == ()


def test_config_round_trips_through_camel_case() -> None:
    raw = {
        "job": "j", "namespace": "ns", "attempt": 2,
        "trainer": {"preset": "small", "steps": 7, "batchSize": 16, "seqLen": 32, "learningRate": 1e-3,
                    "dataset": {"type": "files", "path": "/data"}, "mixedPrecision": "bf16",
                    "faults": [{"kind": "slow", "rank": 1, "step": 3, "factor": 1.5, "attempt": 2}]},
        "parallelism": {"tensor": 2, "pipeline": 2, "data": 1, "pipelineSchedule": "GPipe", "microbatches": 4},
        "checkpoint": {"anything": {"passed": "through"}},
        "health": {"sdc": {"intervalSteps": 7}},
        "restore": {"tier": "memory", "step": 5},
    }
    cfg = TrainerConfig.from_dict(raw)
    assert cfg.health.sdc.interval_steps == 7 and cfg.health.heartbeat_interval_seconds == 2.0
    assert cfg.trainer.dataset.path == "/data"
    assert cfg.parallelism.pipeline_schedule == "GPipe"
    assert cfg.checkpoint == {"anything": {"passed": "through"}}
    assert TrainerConfig.from_dict(cfg.to_dict()) == cfg


def test_every_problem_is_reported_with_its_field() -> None:
    with pytest.raises(ConfigError) as err:
        TrainerConfig.from_dict({
            "trainer": {"preset": "huge", "steps": 0, "learningRate": "fast", "dataset": {"type": "files"},
                        "faults": [{"kind": "meteor"}]},
            "parallelism": {"pipelineSchedule": "Zigzag", "tensor": 0},
        })
    text = str(err.value)
    for field in ("trainer.preset", "trainer.steps", "trainer.learningRate", "trainer.dataset.path",
                  "trainer.faults[0].kind", "parallelism.pipelineSchedule", "parallelism.tensor"):
        assert field in text, field
    assert len(err.value.problems) == 7


def test_unknown_fields_are_errors_with_the_likely_fix() -> None:
    with pytest.raises(ConfigError) as err:
        TrainerConfig.from_dict({"trainer": {"learning_rate": 0.1}, "health": {"sdc": {"intervalsteps": 3}}, "tranier": {}})
    text = str(err.value)
    assert "trainer.learning_rate: unknown field; did you mean 'learningRate'?" in text
    assert "health.sdc.intervalsteps: unknown field; did you mean 'intervalSteps'?" in text
    assert "tranier: unknown top-level field" in text


def test_health_settings_come_from_the_shared_schema_only() -> None:
    from railyard_trainer.health.monitor import HealthSettings

    s = HealthSettings.from_config({"heartbeatIntervalSeconds": 0.5, "sdc": {"intervalSteps": 4, "replayOnSpike": False}}, {})
    assert (s.interval_s, s.sdc_interval_steps, s.replay_on_spike) == (0.5, 4, False)
    with pytest.raises(ValueError, match="interval_steps: unknown field"):
        HealthSettings.from_config({"sdc": {"interval_steps": 4}}, {})  # no snake_case second spelling


def test_faults_apply_only_to_the_attempt_they_name() -> None:
    raw = {"attempt": 1, "trainer": {"faults": [{"kind": "crash"}, {"kind": "exit", "attempt": 1}]}}
    cfg = TrainerConfig.from_dict(raw)
    assert [f.kind for f in cfg.active_faults()] == ["exit"]


def test_config_module_stays_torch_free() -> None:
    import subprocess

    code = "import sys, railyard_trainer.config, railyard_trainer.parallel_dims, railyard_trainer.model_args; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize(
    ("pp", "dp", "tp", "world", "ppn", "expect_dp"),
    [(1, -1, 1, 4, 4, 4), (2, 0, 2, 8, 4, 2), (1, 2, 2, 4, 2, 2), (4, 1, 1, 4, 1, 1)],
)
def test_data_parallel_size_is_derived(pp: int, dp: int, tp: int, world: int, ppn: int, expect_dp: int) -> None:
    assert ParallelDims(pp=pp, dp=dp, tp=tp, world_size=world, procs_per_node=ppn).dp == expect_dp


@pytest.mark.parametrize(
    ("pp", "dp", "tp", "world", "ppn", "field"),
    [
        (1, 2, 2, 8, 4, "world size is 8"),  # product mismatch
        (3, -1, 1, 4, 4, "not divisible"),  # cannot derive
        (1, 1, 3, 3, 2, "parallelism.tensor"),  # TP neither inside a node nor on whole nodes
        (1, 2, 6, 12, 4, "parallelism.tensor"),  # a TP group over one and a half nodes
        (0, 1, 1, 1, 1, "pp"),
    ],
)
def test_bad_dims_are_refused(pp: int, dp: int, tp: int, world: int, ppn: int, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ParallelDims(pp=pp, dp=dp, tp=tp, world_size=world, procs_per_node=ppn)


def test_coordinates_follow_the_rank_table_convention() -> None:
    dims = ParallelDims(pp=2, dp=3, tp=2, world_size=12, procs_per_node=4)
    for rank in range(12):
        pp, dp, tp = dims.coordinates(rank)
        entry = RankEntry(rank=rank, node="n", pod_index=0, local_rank=0, rail=0, pp=pp, dp=dp, tp=tp)
        assert (entry.pp * 3 + entry.dp) * 2 + entry.tp == rank
        assert dims.rank_of(pp, dp, tp) == rank


def test_presets_split_as_advertised() -> None:
    assert PRESETS["tiny"].problems(tp=2, stages=4) == []
    assert PRESETS["8b"].problems(tp=8, stages=8) == []
    assert any("parallelism.pipeline" in p for p in PRESETS["tiny"].problems(tp=1, stages=8))
    assert any("parallelism.tensor" in p for p in PRESETS["tiny"].problems(tp=4, stages=1))
    # Llama-3.1-8B has about 8.0e9 parameters.
    assert 7.5e9 < PRESETS["8b"].num_params() < 8.5e9
