"""`railyard-train export --checkpoint ck` takes the folder `--checkpoint-dir ck` was given (the
launcher writes the steps to ck/<job>/), a tier root holding the job in several tiers, or the job
folder itself; checkpoints of several jobs below the folder are named so the user can pick one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .launch import run_launcher
from .test_model_vocabulary_follows_the_tokenizer import write_shards

pytestmark = pytest.mark.torch

VOCAB = 4096


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain DCP checkpoint folder written by the real launcher (job name "local", its
    default): steps 2 and 4 in ck/local/."""
    root = tmp_path_factory.mktemp("export")
    shards = write_shards(root / "shards", vocab=VOCAB)
    ck = root / "ck"
    run = run_launcher(root / "run", ["--nproc-per-node", "1", "--dataset-path", str(shards), "--checkpoint-dir", str(ck), "--checkpoint-interval", "2"],
                       trainer={"steps": 4}, config={"job": "local"})
    assert run.code == 0, run.explain()
    assert sorted(p.name for p in (ck / "local").glob("step-*")) == ["step-00000002", "step-00000004"]
    return ck


def _export(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object] | str]:
    from railyard_trainer.export import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, json.loads(out.strip().splitlines()[-1]) if code == 0 else err


def test_export_takes_the_folder_given_as_checkpoint_dir(ck: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, info = _export(capsys, "--checkpoint", str(ck), "--output", str(tmp_path / "hf"))
    assert code == 0, info
    assert isinstance(info, dict) and info["checkpoint"] == str(ck / "local" / "step-00000004") and info["preset"] == "tiny"
    # the model's vocabulary is the shards' tokenizer's, and the export says so
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == VOCAB
    code, info = _export(capsys, "--checkpoint", str(ck), "--step", "2", "--output", str(tmp_path / "hf2"))
    assert code == 0 and isinstance(info, dict) and info["checkpoint"] == str(ck / "local" / "step-00000002")
    # the job folder and a step folder still work as before
    code, info = _export(capsys, "--checkpoint", str(ck / "local"), "--output", str(tmp_path / "hf3"))
    assert code == 0 and isinstance(info, dict) and info["checkpoint"] == str(ck / "local" / "step-00000004")


def test_a_tier_root_holding_the_job_twice_gives_the_newest_step(ck: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "tiers"
    shutil.copytree(ck / "local", root / "shared" / "local")
    shutil.copytree(ck / "local" / "step-00000002", root / "memory" / "local" / "step-00000002")
    code, info = _export(capsys, "--checkpoint", str(root), "--output", str(tmp_path / "hf"))
    assert code == 0 and isinstance(info, dict) and info["checkpoint"] == str(root / "shared" / "local" / "step-00000004")


def test_checkpoints_of_several_jobs_are_named_to_pick_one(ck: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "two"
    shutil.copytree(ck / "local", root / "local")
    shutil.copytree(ck / "local", root / "other")
    code, err = _export(capsys, "--checkpoint", str(root), "--output", str(tmp_path / "hf"))
    assert code == 2
    assert f"{root / 'local'} (newest step 4)" in str(err) and f"{root / 'other'} (newest step 4)" in str(err)
    assert "give one of these folders as --checkpoint" in str(err)
    code, err = _export(capsys, "--checkpoint", str(tmp_path / "empty-or-missing"), "--output", str(tmp_path / "hf"))
    assert code == 2 and "no such folder" in str(err)
    (tmp_path / "empty").mkdir()
    code, err = _export(capsys, "--checkpoint", str(tmp_path / "empty"), "--output", str(tmp_path / "hf"))
    assert code == 2 and "no committed, SDC-clean checkpoint here or in its subfolders" in str(err)
