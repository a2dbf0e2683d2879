"""A node tier's save plan, made once per state structure (``checkpoint/saveplan.py``).

The same snapshot buffers are saved again and again; what is reused must never make a shard
hold anything but the values of the save that wrote it: tensors updated in place, scalars that
changed (the learning rate every step), a structure that changed (new optimizer state).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: E402

from railyard_trainer.checkpoint.saveplan import ReusedSavePlanner, frozen_value  # noqa: E402
from railyard_trainer.checkpoint.shardio import ShardReader, ShardWriter  # noqa: E402


def _buffers() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "model": {"w": torch.randn(300, 7, generator=g), "b": torch.zeros(7, dtype=torch.bfloat16)},
        "optim": {"state.w.step": torch.tensor(3.0), "param_groups.w.lr": 3e-4,
                  "param_groups.w.betas": (0.9, 0.95), "param_groups.w.foreach": None},
        "step": 12,
    }


def _save(state: dict[str, Any], path: Path, planner: Any) -> None:
    dcp.save(state, storage_writer=ShardWriter(path, fsync=False), planner=planner, no_dist=True)


def _load(path: Path, like: dict[str, Any]) -> dict[str, Any]:
    def empty(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: empty(v) for k, v in x.items()}
        return torch.full_like(x, -1) if isinstance(x, torch.Tensor) else None

    back = empty(like)
    dcp.load(back, storage_reader=ShardReader(path), no_dist=True)
    return back


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert type(a) is type(b) and a == b, where
        if isinstance(a, float):
            assert math.copysign(1, a) == math.copysign(1, b), where


def test_saves_of_the_same_buffers_plan_once_and_each_holds_its_own_values(tmp_path: Path) -> None:
    planner = ReusedSavePlanner()
    buffers = _buffers()
    for i in range(4):
        # What a snapshot does: the same tensors, overwritten in place; scalars as they are now.
        buffers["model"]["w"].mul_(1.5).add_(i)
        buffers["optim"]["state.w.step"].add_(1)
        snap = {
            "model": dict(buffers["model"]),
            "optim": dict(buffers["optim"], **{"param_groups.w.lr": 3e-4 * (i + 1)}),
            "step": 12 + i,
        }
        _save(snap, tmp_path / f"step-{i}", planner)
        _assert_same(_load(tmp_path / f"step-{i}", snap), snap)
    assert planner.plans_made == 1
    # The first save's files still hold the first save's values: nothing written later leaked in.
    first = _load(tmp_path / "step-0", _buffers())
    assert first["step"] == 12 and first["optim"]["param_groups.w.lr"] == 3e-4


def test_the_reused_plan_writes_what_dcps_own_planner_describes(tmp_path: Path) -> None:
    state = _buffers()
    _save(state, tmp_path / "default", DefaultSavePlanner())
    reused = ReusedSavePlanner()
    for name in ("once", "twice"):
        _save(state, tmp_path / name, reused)
    meta = {name: ShardReader(tmp_path / name).read_metadata() for name in ("default", "once", "twice")}
    assert meta["once"].state_dict_metadata == meta["default"].state_dict_metadata
    assert meta["twice"].state_dict_metadata == meta["default"].state_dict_metadata
    assert meta["twice"].planner_data == meta["default"].planner_data
    assert meta["twice"].storage_data.keys() == meta["default"].storage_data.keys()
    _assert_same(_load(tmp_path / "twice", state), state)


def test_a_changed_structure_is_planned_again(tmp_path: Path) -> None:
    planner = ReusedSavePlanner()
    state = _buffers()
    _save(state, tmp_path / "a", planner)
    # Optimizer state appeared (new keys), then a buffer was replaced by a new tensor (new
    # buffers after a structure change), then a value changed type: each plans afresh.
    state["optim"]["state.w.exp_avg"] = torch.ones(300, 7)
    _save(state, tmp_path / "b", planner)
    _assert_same(_load(tmp_path / "b", state), state)
    state["model"]["w"] = torch.arange(21.0).reshape(3, 7)
    _save(state, tmp_path / "c", planner)
    _assert_same(_load(tmp_path / "c", state), state)
    state["step"] = "twelve"
    _save(state, tmp_path / "d", planner)
    _assert_same(_load(tmp_path / "d", state), state)
    assert planner.plans_made == 4


def test_a_value_that_compares_equal_but_differs_is_serialised_again(tmp_path: Path) -> None:
    planner = ReusedSavePlanner()
    state = _buffers()
    for lr, step in ((0.0, 1), (-0.0, True), (float("nan"), 1.0)):
        state["optim"]["param_groups.w.lr"] = lr
        state["step"] = step
        _save(state, tmp_path / "s", planner)
        back = _load(tmp_path / "s", state)
        assert type(back["step"]) is type(step)
        got = back["optim"]["param_groups.w.lr"]
        assert (math.isnan(got) and math.isnan(lr)) or (got == lr and math.copysign(1, got) == math.copysign(1, lr))


def test_only_plain_immutable_values_have_a_reuse_key() -> None:
    assert frozen_value(0.0) != frozen_value(-0.0)
    assert frozen_value(1) != frozen_value(True) != frozen_value(1.0)
    assert frozen_value((0.9, 0.95)) == frozen_value((0.9, 0.95))
    assert frozen_value(None) == frozen_value(None)
    # Mutable or unknown values are serialised every time.
    assert frozen_value([0.9, 0.95]) is None
    assert frozen_value({"a": 1}) is None
    assert frozen_value((1, [2])) is None
    assert frozen_value(torch.tensor(1.0)) is None
