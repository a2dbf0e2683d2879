"""The data path: `railyard-train prepare` writes shards with a tokenizer.json, the trainer
memory-maps them, and the sampler visits every window once per epoch in a seeded order that a
resumed run (on any data-parallel degree) continues exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from railyard_trainer.config import ConfigError, DatasetConfig
from railyard_trainer.prepare import PrepareError, prepare, train_tokenizer
from railyard_trainer.sampler import FeistelPermutation, WindowSampler
from railyard_trainer.tokens import TokenFormatError, TokenShards, read_index

TEXT = Path(__file__).resolve().parents[2] / "examples" / "data" / "apache-2.0.txt"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BPE tokenizer trained on our own text (nothing is downloaded)."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    assert train_tokenizer([str(TEXT)], vocab_size=256, output=str(path)) == 256
    return path


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_the_permutation_is_a_bijection_and_depends_on_its_key(n: int) -> None:
    p = FeistelPermutation(n, key=42)
    out = p(np.arange(n))
    assert sorted(out.tolist()) == list(range(n))
    assert (p(np.arange(n)) == out).all(), "deterministic"
    if n >= 64:
        assert (FeistelPermutation(n, key=43)(np.arange(n)) != out).mean() > 0.9
        assert abs(float(np.corrcoef(np.arange(n), out)[0, 1])) < 0.2, "shuffled, not a rotation"


def test_every_window_is_read_once_per_epoch_in_a_new_order() -> None:
    s = WindowSampler(10_001, 10, seed=3, shuffle=True)
    assert s.windows == 1000
    e0, e1 = s.starts(np.arange(0, 1000)), s.starts(np.arange(1000, 2000))
    assert sorted(e0.tolist()) == sorted(e1.tolist()) == list(range(0, 10_000, 10))
    assert (e0 != e1).mean() > 0.9
    assert (s.starts(np.arange(1500, 1510)) == e1[500:510]).all(), "any position, no state but the index"
    plain = WindowSampler(10_001, 10, seed=3, shuffle=False)
    assert plain.starts(np.arange(998, 1002)).tolist() == [9980, 9990, 0, 10]
    with pytest.raises(ValueError, match="no sequence"):
        WindowSampler(10, 10, seed=0, shuffle=True)


def test_prepare_writes_shards_that_decode_back_to_the_text(tmp_path: Path, tokenizer: Path) -> None:
    from tokenizers import Tokenizer

    docs = tmp_path / "docs.jsonl"
    lines = [ln for ln in TEXT.read_text().splitlines() if ln.strip()][:40]
    docs.write_text("".join(json.dumps({"text": ln, "id": i}) + "\n" for i, ln in enumerate(lines)))
    index = prepare([str(docs)], tokenizer_path=str(tokenizer), output=str(tmp_path / "out"), shard_tokens=97)
    assert index.documents == 40 and len(index.shards) > 3 and index.dtype == "uint16"
    assert read_index(tmp_path / "out") == index
    shards = TokenShards(tmp_path / "out")
    stream = shards.read(0, shards.tokens)
    assert shards.tokens == index.tokens == sum(s.tokens for s in index.shards)
    # a read that crosses a shard boundary is the same as the stream's slice
    assert (shards.read(90, 20) == stream[90:110]).all()
    eos = index.eos_id
    assert eos is not None and int((stream == eos).sum()) == 40
    tok = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    first_doc = stream[: int(np.argmax(stream == eos))]
    assert tok.decode(first_doc.tolist()) == lines[0]


def test_prepare_and_the_reader_say_what_is_wrong(tmp_path: Path, tokenizer: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"body": "no text field"}\n')
    with pytest.raises(PrepareError, match="--text-field"):
        prepare([str(tmp_path / "bad.jsonl")], tokenizer_path=str(tokenizer), output=str(tmp_path / "o1"))
    prepare([str(TEXT)], tokenizer_path=str(tokenizer), output=str(tmp_path / "o2"))
    with pytest.raises(PrepareError, match="not empty"):
        prepare([str(TEXT)], tokenizer_path=str(tokenizer), output=str(tmp_path / "o2"))
    shard = tmp_path / "o2" / "tokens-00000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(TokenFormatError, match=r"tokens-00000\.bin: .* bytes, but index\.json lists"):
        read_index(tmp_path / "o2")
    with pytest.raises(TokenFormatError, match="railyard-train prepare"):
        read_index(tmp_path / "nothing-here")


@pytest.mark.torch
def test_token_batches_are_the_same_for_every_data_parallel_degree(tmp_path: Path, tokenizer: Path) -> None:
    import torch

    from railyard_trainer.data import ShardedBatches, build_source

    prepare([str(TEXT)], tokenizer_path=str(tokenizer), output=str(tmp_path / "s"), line_documents=True)
    cfg = DatasetConfig(type="tokens", path=str(tmp_path / "s"))
    src = build_source(cfg, vocab_size=256, seed=5, seq_len=32)
    stream = src.shards.read(0, src.shards.tokens)  # type: ignore[attr-defined]

    def global_batches(dp: int, steps: int, resume_at: int = 0) -> list[torch.Tensor]:
        loaders = [ShardedBatches(src, batch_size=8, seq_len=32, dp_rank=r, dp_size=dp, device=torch.device("cpu")) for r in range(dp)]
        for ld in loaders:
            ld.load_state_dict({"consumed_samples": resume_at * 8, "source": src.name, "seq_len": 32})
        return [torch.cat([ld.next_batch()[0] for ld in loaders]) for _ in range(steps)]

    one = global_batches(1, 30)  # > 1 epoch: the stream holds ~150 windows of 33
    assert all(torch.equal(a, b) for a, b in zip(one, global_batches(4, 30), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(one[20:], global_batches(2, 10, resume_at=20), strict=True))
    # each row is a real window of the stream; labels are the inputs shifted by one
    x, y = ShardedBatches(src, batch_size=8, seq_len=32, dp_rank=0, dp_size=1, device=torch.device("cpu")).next_batch()
    start = int(src.sampler.starts(np.array([0]))[0])  # type: ignore[attr-defined]
    assert x[0].tolist() == stream[start : start + 32].tolist() and y[0].tolist() == stream[start + 1 : start + 33].tolist()
    with pytest.raises(ConfigError, match=r"trainer\.dataset"):
        ShardedBatches(build_source(cfg, vocab_size=256, seed=6, seq_len=32), batch_size=8, seq_len=32, dp_rank=0, dp_size=1,
                       device=torch.device("cpu")).load_state_dict({"consumed_samples": 8, "source": src.name, "seq_len": 32})
    with pytest.raises(ConfigError, match="vocabulary is 128"):
        build_source(cfg, vocab_size=128, seed=5, seq_len=32)
