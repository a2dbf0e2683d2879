"""Training data: pre-tokenized shards, a deterministic synthetic language, and byte-level files.

Every sample is a pure function of its *global sample index*, and the loader's position is the
number of global samples consumed. Each step takes the next ``batch_size`` global samples and
data-parallel rank ``r`` of ``n`` takes the ``r``-th contiguous slice of them. So the global
batch of step ``s`` is the same whatever the data-parallel size, and a run resumed on a
different world size continues with exactly the samples the old one would have seen.

- ``tokens``: shards written by ``railyard-train prepare`` (:mod:`railyard_trainer.tokens`),
  memory-mapped; sample ``g`` is the window :class:`railyard_trainer.sampler.WindowSampler`
  assigns it (shuffled per epoch, seeded).
- ``synthetic``: a fixed random Markov chain (tests and demos).
- ``files``: the raw bytes of text files (vocabulary 256, no tokenizer).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from railyard_trainer.config import ConfigError, DatasetConfig
from railyard_trainer.sampler import WindowSampler
from railyard_trainer.tokens import TokenFormatError, TokenShards, read_index


class TokenSource(Protocol):
    name: str
    vocab_size: int

    def sample(self, index: int, length: int) -> np.ndarray:
        """``length`` int64 tokens of global sample ``index``."""


class SyntheticLanguage:
    """A fixed random Markov chain: each token has ``branching`` successors with skewed odds.

    The chain is drawn once from the seed. Its entropy (reported by :attr:`entropy`) is far
    below ``ln(vocab)``, so a model that learns the transitions drives the loss well under the
    uniform baseline; one that does not, stays near it.
    """

    PROBS = np.array([0.6, 0.25, 0.1, 0.05])

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.name = f"synthetic(vocab={vocab_size},seed={seed})"
        self.vocab_size = vocab_size
        self.seed = seed
        rng = np.random.default_rng([seed, 0x5EED])
        self.successors = np.stack(
            [rng.choice(vocab_size, size=len(self.PROBS), replace=False) for _ in range(vocab_size)]
        )
        self.cdf = np.cumsum(self.PROBS)
        self.cdf[-1] = 1.0

    @property
    def entropy(self) -> float:
        """Per-token entropy in nats: the best loss any model can reach (after the first token)."""
        return float(-(self.PROBS * np.log(self.PROBS)).sum())

    def sample(self, index: int, length: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, index])
        choice = np.searchsorted(self.cdf, rng.random(length - 1), side="right")
        out = np.empty(length, dtype=np.int64)
        tok = int(rng.integers(self.vocab_size))
        out[0] = tok
        succ = self.successors
        for i, c in enumerate(choice.tolist(), start=1):
            tok = int(succ[tok, c])
            out[i] = tok
        return out


class ByteFiles:
    """Bytes of the files at a path (a file, or every file under a directory in sorted order).

    Sample ``i`` is the window starting at byte ``(i * stride) mod (size - length)``.
    """

    def __init__(self, path: str, *, stride: int) -> None:
        root = Path(path)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        if not files:
            raise ConfigError(
                [f"trainer.dataset.path: no files at {path!r}; point it at a text file or a directory of them"]
            )
        self.data = np.concatenate([np.fromfile(p, dtype=np.uint8) for p in files])
        digest = hashlib.sha256(b"".join(str(p).encode() for p in files)).hexdigest()[:12]
        self.name = f"files({path},{len(files)} files,{self.data.size} bytes,{digest})"
        self.stride = stride
        self.vocab_size = 256

    def sample(self, index: int, length: int) -> np.ndarray:
        span = self.data.size - length
        if span <= 0:
            raise ConfigError(
                [
                    f"trainer.dataset.path: {self.data.size} bytes is shorter than one sample ({length}); add text or "
                    "lower trainer.seqLen"
                ]
            )
        start = (index * self.stride) % span
        return self.data[start : start + length].astype(np.int64)


class TokenWindows:
    """Pre-tokenized shards: global sample ``g`` is the window the sampler assigns it."""

    def __init__(self, path: str, *, seq_len: int, seed: int, shuffle: bool) -> None:
        try:
            self.shards = TokenShards(path)
        except TokenFormatError as exc:
            raise ConfigError([f"trainer.dataset.path: {p}" for p in exc.problems]) from exc
        index = self.shards.index
        try:
            self.sampler = WindowSampler(self.shards.tokens, seq_len, seed=seed, shuffle=shuffle)
        except ValueError as exc:
            raise ConfigError(
                [
                    f"trainer.seqLen: the shards at {path} hold {self.shards.tokens} tokens; {exc}. Lower "
                    "trainer.seqLen or add data"
                ]
            ) from exc
        self.vocab_size = index.vocab_size
        self.name = f"tokens({index.digest()},shuffle={shuffle},seed={seed})"

    @property
    def windows(self) -> int:
        return self.sampler.windows

    def sample(self, index: int, length: int) -> np.ndarray:
        return self.samples(index, 1, length)[0]

    def samples(self, first: int, count: int, length: int) -> np.ndarray:
        """Global samples ``first .. first + count - 1`` as a (count, length) int64 array (one
        vectorised permutation for the whole slice)."""
        starts = self.sampler.starts(np.arange(first, first + count, dtype=np.int64))
        return np.stack([self.shards.read(int(s), length) for s in starts])


def model_vocab_size(cfg: DatasetConfig, *, preset_vocab: int, fixed: int | None) -> int:
    """The model's vocabulary: ``trainer.vocabSize`` where the user fixed it, else the shards'
    tokenizer's (``vocab_size`` of their index.json) for ``tokens``, else the preset's. A model
    made for one's own tokenizer follows it: its embedding and output have one row per id."""
    data = _dataset_vocab(cfg)
    vocab = fixed if fixed is not None else data if cfg.type == "tokens" and data is not None else preset_vocab
    _check_vocab_fits(cfg, data, vocab, fixed=fixed is not None)
    return vocab


def _dataset_vocab(cfg: DatasetConfig) -> int | None:
    """How many ids the data holds: the shards' tokenizer's, 256 for bytes, None for synthetic."""
    if cfg.type == "tokens":
        try:
            return read_index(cfg.path or "").vocab_size
        except TokenFormatError as exc:
            raise ConfigError([f"trainer.dataset.path: {p}" for p in exc.problems]) from exc
    return 256 if cfg.type == "files" else None


def _check_vocab_fits(cfg: DatasetConfig, data: int | None, vocab: int, *, fixed: bool) -> None:
    if data is None or data <= vocab:
        return
    what = "the shards' tokenizer has" if cfg.type == "tokens" else f"dataset type {cfg.type!r} (bytes) needs"
    if fixed:
        raise ConfigError(
            [
                f"trainer.vocabSize: {vocab} but {what} {data} tokens; raise trainer.vocabSize to at least {data}, or "
                "leave it unset to follow the data"
            ]
        )
    raise ConfigError(
        [
            f"trainer.dataset: {what} {data} tokens but the model's vocabulary is {vocab}; set trainer.vocabSize to "
            f"at least {data}"
        ]
    )


def build_source(
    cfg: DatasetConfig, *, vocab_size: int, seed: int, seq_len: int, vocab_fixed: bool = False
) -> TokenSource:
    """The dataset of ``trainer.dataset``; its vocabulary must fit the model's (``vocab_size``,
    from :func:`model_vocab_size`; ``vocab_fixed``: the user set it)."""
    src: TokenSource
    if cfg.type == "files":
        src = ByteFiles(cfg.path or "", stride=seq_len)
    elif cfg.type == "tokens":
        src = TokenWindows(cfg.path or "", seq_len=seq_len, seed=seed, shuffle=cfg.shuffle)
    else:
        return SyntheticLanguage(vocab_size, seed)
    _check_vocab_fits(cfg, src.vocab_size, vocab_size, fixed=vocab_fixed)
    return src


class ShardedBatches:
    """Hands this data-parallel rank its slice of each global batch; stateful for checkpoints."""

    def __init__(
        self, source: TokenSource, *, batch_size: int, seq_len: int, dp_rank: int, dp_size: int, device: torch.device
    ) -> None:
        if batch_size % dp_size:
            raise ConfigError([f"trainer.batchSize: {batch_size} is not divisible by the data-parallel size {dp_size}"])
        self.source = source
        self.batch_size = batch_size
        self.local_batch = batch_size // dp_size
        self.seq_len = seq_len
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.device = device
        #: Global samples consumed so far (the position saved in checkpoints).
        self.consumed = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, labels), each (local_batch, seq_len) int64, labels shifted by one."""
        out = self._rows(self.consumed + self.dp_rank * self.local_batch, self.local_batch)
        self.consumed += self.batch_size
        return out

    def share_batch(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of a replica group's share ``[first, first + count)`` of the global
        batch (railyard_trainer.replicas): the ``dp_rank``-th of ``dp_size`` contiguous slices.
        The position moves only when the step commits (:meth:`advance`)."""
        per_rank = count // self.dp_size
        return self._rows(first + self.dp_rank * per_rank, per_rank)

    def advance(self, samples: int) -> None:
        self.consumed += samples

    def _rows(self, first: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        many = getattr(self.source, "samples", None)
        if callable(many):
            rows = many(first, n, self.seq_len + 1)
        else:
            rows = np.stack([self.source.sample(first + j, self.seq_len + 1) for j in range(n)])
        t = torch.from_numpy(rows).to(self.device)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        return {"consumed_samples": self.consumed, "source": self.source.name, "seq_len": self.seq_len}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the checkpoint's position. The position is in global samples, so another
        data-parallel degree or global batch size continues exactly (nothing skipped or
        repeated); another dataset or sequence length would give the number another meaning."""
        consumed = int(state["consumed_samples"])
        problems = []
        if state.get("source", self.source.name) != self.source.name:
            problems.append(
                f"trainer.dataset: the checkpoint was written reading {state['source']}, this run reads "
                f"{self.source.name}; resume with the dataset (and seed) the run started with"
            )
        if int(state.get("seq_len", self.seq_len)) != self.seq_len:
            problems.append(
                f"trainer.seqLen: the checkpoint was written with seqLen {state['seq_len']}, this run has "
                f"{self.seq_len}"
            )
        if problems:
            raise ConfigError(problems)
        self.consumed = consumed


def uniform_loss(vocab_size: int) -> float:
    return math.log(vocab_size)
