"""The model's vocabulary follows the prepared shards' tokenizer (their index.json) unless the
user fixes ``trainer.vocabSize``: a tokenizer of one's own (4,096 tokens) trains the tiny preset
as it is, and a fixed vocabulary too small for the tokenizer is refused naming the field."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from railyard_trainer.config import ConfigError, DatasetConfig, TrainerConfig
from railyard_trainer.model_args import PRESETS
from railyard_trainer.tokens import ShardWriter

from .launch import run_launcher

pytestmark = pytest.mark.torch

TOKENIZER_VOCAB = 4096


def write_shards(folder: Path, *, vocab: int, tokens: int = 6000, seed: int = 0) -> Path:
    """Shards as `railyard-train prepare` writes them, of ids a ``vocab``-token tokenizer made
    (the largest id included, so a model one row short would fail)."""
    ids = np.random.default_rng(seed).integers(0, vocab, size=tokens)
    ids[-1] = vocab - 1
    writer = ShardWriter(folder, vocab_size=vocab, eos_id=None, shard_tokens=tokens)
    writer.add(ids)
    writer.close()
    return folder


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shards(tmp_path_factory.mktemp("tok") / "shards", vocab=TOKENIZER_VOCAB)


@pytest.mark.parametrize(
    ("kind", "fixed", "expected"),
    [
        ("tokens", None, TOKENIZER_VOCAB),  # the tokenizer's, larger than tiny's 256
        ("tokens", 8192, 8192),  # fixed by the user: kept, room above the tokenizer
        ("tokens", TOKENIZER_VOCAB, TOKENIZER_VOCAB),
        ("synthetic", None, PRESETS["tiny"].vocab_size),
        ("synthetic", 1000, 1000),
        ("files", None, PRESETS["tiny"].vocab_size),  # bytes: the preset's (>= 256)
    ],
)
def test_the_model_vocabulary_is_the_users_else_the_tokenizers_else_the_presets(shards: Path, kind: str, fixed: int | None, expected: int) -> None:
    from railyard_trainer.data import model_vocab_size

    cfg = DatasetConfig(type=kind, path=str(shards) if kind != "synthetic" else None)  # type: ignore[arg-type]
    assert model_vocab_size(cfg, preset_vocab=PRESETS["tiny"].vocab_size, fixed=fixed) == expected


def test_a_smaller_shard_tokenizer_gives_a_smaller_model(tmp_path: Path) -> None:
    from railyard_trainer.data import model_vocab_size

    small = write_shards(tmp_path / "small", vocab=100)
    assert model_vocab_size(DatasetConfig(type="tokens", path=str(small)), preset_vocab=32768, fixed=None) == 100


@pytest.mark.parametrize(
    ("kind", "fixed", "message"),
    [
        ("tokens", 1000, r"trainer\.vocabSize: 1000 but the shards' tokenizer has 4096 tokens; raise trainer\.vocabSize to at least 4096, or leave it unset"),
        ("files", 128, r"trainer\.vocabSize: 128 but dataset type 'files' \(bytes\) needs 256 tokens"),
    ],
)
def test_a_fixed_vocabulary_too_small_for_the_data_is_refused_naming_the_field(shards: Path, kind: str, fixed: int, message: str) -> None:
    from railyard_trainer.data import build_source, model_vocab_size

    cfg = DatasetConfig(type=kind, path=str(shards))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        model_vocab_size(cfg, preset_vocab=256, fixed=fixed)
    with pytest.raises(ConfigError, match=message):  # the same rule where the source is built
        build_source(cfg, vocab_size=fixed, seed=0, seq_len=16, vocab_fixed=True)


def test_vocab_size_is_read_from_config_json_with_its_bounds() -> None:
    assert TrainerConfig.from_dict({"trainer": {"vocabSize": 4096}}).trainer.vocab_size == 4096
    assert TrainerConfig.from_dict({}).trainer.vocab_size is None
    with pytest.raises(ConfigError, match=r"trainer\.vocabSize"):
        TrainerConfig.from_dict({"trainer": {"vocabSize": 0}})


def test_the_tiny_preset_trains_on_shards_of_a_4096_token_tokenizer(shards: Path, tmp_path: Path) -> None:
    run = run_launcher(tmp_path / "run", ["--nproc-per-node", "1", "--dataset-path", str(shards)], trainer={"steps": 2})
    assert run.code == 0, run.explain()
    losses = run.losses()
    assert sorted(losses) == [1, 2]
    # random ids over 4,096 tokens: the first loss is near ln(4096) = 8.3, not ln(256) = 5.5
    assert abs(losses[1] - math.log(TOKENIZER_VOCAB)) < 1.0, losses
