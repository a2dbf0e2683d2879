"""Checkpoint settings parsing and the directory storage backend (no torch, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from railyard.protocol.manifest import Manifest, ShardInfo
from railyard_trainer.checkpoint.cleanup import main as cleanup_main
from railyard_trainer.checkpoint.settings import CheckpointConfigError, parse_checkpoint_settings
from railyard_trainer.checkpoint.storage import DirectoryStorage, delete_job_checkpoints
from railyard_trainer.worker import exit_code_for


def test_settings_from_spec_and_env() -> None:
    env = {"RAILYARD_CHECKPOINT_MEMORY_DIR": "/dev/shm/ry", "RAILYARD_CHECKPOINT_SHARED_DIR": "/mnt/ckpt"}
    s = parse_checkpoint_settings(
        {"memory": {"intervalSteps": 5, "keep": 3}, "local": {"enabled": True}, "cleanupOnDelete": True},
        env=env, restore={"tier": "memory", "step": 10},
    )
    mem, local, shared = (s.tier(n) for n in ("memory", "local", "shared"))
    assert (mem.interval_steps, mem.keep, mem.root, mem.replicate) == (5, 3, "/dev/shm/ry", True)
    assert local.enabled and not local.active, "local has no directory: inactive"
    assert shared.active and not shared.replicate
    assert [t.name for t in s.active_tiers] == ["memory", "shared"]
    assert s.cleanup_on_delete and s.restore_hint == {"tier": "memory", "step": 10}
    assert [mem.due(k) for k in (0, 4, 5, 10)] == [False, False, True, True]


def test_settings_report_every_problem_with_its_field() -> None:
    with pytest.raises(CheckpointConfigError) as e:
        parse_checkpoint_settings(
            {"memory": {"intervalSteps": 0}, "shared": {"keep": "x", "enabled": 1}, "cleanupOnDelete": "yes"}, env={}
        )
    fields = " ".join(e.value.problems)
    for f in ("checkpoint.memory.intervalSteps", "checkpoint.shared.keep", "checkpoint.shared.enabled", "checkpoint.cleanupOnDelete"):
        assert f in fields


def test_the_background_cpu_class_comes_from_the_environment_and_a_bad_one_is_named() -> None:
    assert parse_checkpoint_settings({}, env={}).cpu_class == "auto"
    for cls in ("auto", "idle", "nice"):
        assert parse_checkpoint_settings({}, env={"RAILYARD_CHECKPOINT_CPU": cls}).cpu_class == cls
    assert parse_checkpoint_settings({}, env={"RAILYARD_CHECKPOINT_CPU": " "}).cpu_class == "auto"
    with pytest.raises(CheckpointConfigError) as e:
        parse_checkpoint_settings({}, env={"RAILYARD_CHECKPOINT_CPU": "fast"})
    (problem,) = e.value.problems
    assert "RAILYARD_CHECKPOINT_CPU='fast'" in problem and "auto, idle, nice" in problem
    assert exit_code_for(e.value) == 64, "a bad setting is a configuration error, not the application's"


def _manifest(step: int, tier: str = "memory") -> Manifest:
    return Manifest(job="j", step=step, tier=tier, attempt=0, pp=1, dp=1, tp=1,
                    shards=(ShardInfo("rank-00000/x", 3, "ab", 0),))


def test_commit_is_what_makes_a_step_exist(tmp_path: Path) -> None:
    st = DirectoryStorage("memory", tmp_path, "j")
    st.write_bytes(7, "rank-00000/x", b"abc")
    assert st.list_steps() == [7] and st.read_manifest(7) is None
    st.commit(7, _manifest(7))
    assert st.read_manifest(7) == _manifest(7)
    assert st.file_state(7, "rank-00000/x") == (3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    assert not list(st.step_dir(7).glob(".*tmp*")), "temporary files left behind"
    # A manifest for another tier or step is not trusted; a garbled one neither.
    st.commit(8, _manifest(9))
    assert st.read_manifest(8) is None
    (st.step_dir(7) / "manifest.json").write_text("{not json")
    assert st.read_manifest(7) is None
    st.delete(7)
    assert st.list_steps() == [8]


def test_cleanup_removes_only_that_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for tier in ("memory", "shared"):
        for job in ("a", "b"):
            DirectoryStorage(tier, tmp_path / tier, job).commit(1, _manifest(1, tier))
    removed = delete_job_checkpoints({"memory": str(tmp_path / "memory"), "shared": ""}, "a")
    assert removed == [str(tmp_path / "memory" / "a")]
    assert (tmp_path / "memory" / "b").exists() and (tmp_path / "shared" / "a").exists()
    assert delete_job_checkpoints({"memory": str(tmp_path / "memory")}, "..") == []
    monkeypatch.setenv("RAILYARD_CHECKPOINT_SHARED_DIR", str(tmp_path / "shared"))
    monkeypatch.delenv("RAILYARD_CHECKPOINT_MEMORY_DIR", raising=False)
    monkeypatch.delenv("RAILYARD_CHECKPOINT_LOCAL_DIR", raising=False)
    assert cleanup_main(["--job", "a"]) == 0
    assert not (tmp_path / "shared" / "a").exists() and (tmp_path / "shared" / "b").exists()


def test_a_recycling_tier_keeps_the_retired_step_as_spares_and_hands_each_file_out_once(tmp_path: Path) -> None:
    st = DirectoryStorage("memory", tmp_path, "j", recycle=True)
    for step in (4, 8):
        st.write_bytes(step, "rank-00000/__0_0.distcp", f"step {step}".encode())
        st.write_bytes(step, "rank-00001/__0_0.distcp", b"replica")
        st.commit(step, _manifest(step))
    st.retire(4)
    # Retired means gone as a checkpoint: not listed, no manifest anywhere that could be restored.
    assert st.list_steps() == [8]
    assert list(tmp_path.rglob("manifest.json")) == [st.step_dir(8) / "manifest.json"]
    target = st.step_dir(12) / "rank-00000" / "new"
    target.parent.mkdir(parents=True)
    assert st.take_spare("rank-00000/__0_0.distcp", target)
    assert target.read_bytes() == b"step 4"
    assert not st.take_spare("rank-00000/__0_0.distcp", target.with_name("again")), "handed out twice"
    assert not st.take_spare("rank-00002/__0_0.distcp", target.with_name("other")), "never existed"
    # The next retirement replaces what the last save did not take.
    st.retire(8)
    assert st.list_steps() == [12]
    assert st.take_spare("rank-00000/__0_0.distcp", target.with_name("from-8"))
    assert target.with_name("from-8").read_bytes() == b"step 8"
    assert sorted(p.name for p in (tmp_path / "j" / ".spare").rglob("*") if p.is_file()) == ["__0_0.distcp"]


def test_a_tier_that_does_not_recycle_deletes_what_it_retires(tmp_path: Path) -> None:
    st = DirectoryStorage("shared", tmp_path, "j")
    st.write_bytes(4, "rank-00000/x", b"abc")
    st.commit(4, _manifest(4, "shared"))
    st.retire(4)
    assert st.list_steps() == [] and sorted(p.name for p in (tmp_path / "j").iterdir()) == []
    assert not st.take_spare("rank-00000/x", tmp_path / "y")
