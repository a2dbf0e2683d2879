"""Pre-tokenized shards on disk: what ``railyard-train prepare`` writes and the trainer memory-maps.

A dataset is one folder (numpy only, torch-free)::

    index.json         written last, atomically: the dataset exists once this file does
    tokens-00000.bin   token ids, little-endian, uint16 (vocabulary <= 65,536) or uint32
    tokens-00001.bin   ...
    tokenizer.json     a copy of the tokenizer that made them

``index.json``::

    {"format": "railyard-tokens", "version": 1, "dtype": "uint16", "vocab_size": 512,
     "eos_id": 1, "tokens": 1234567, "documents": 890,
     "shards": [{"file": "tokens-00000.bin", "tokens": 1000000, "sha256": "..."}, ...],
     "tokenizer": {"file": "tokenizer.json", "sha256": "..."}, "sources": ["book.txt"]}

The token stream is every document's ids followed by ``eos_id`` (when the tokenizer has an
end-of-text token; ``null`` otherwise), documents in input order, split into shard files of at
most ``--shard-tokens`` ids. A training sample is ``seq_len + 1`` consecutive ids of the stream
(it may cross document and shard boundaries: packing, as GPT-2 and nanoGPT do); see
:mod:`railyard_trainer.sampler` for which windows a step reads.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "railyard-tokens"
VERSION = 1
INDEX_NAME = "index.json"
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


class TokenFormatError(ValueError):
    """A shard folder that cannot be read; every problem is listed, each naming the file."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def sha256_file(path: Path, chunk: int = 4 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class ShardEntry:
    file: str
    tokens: int
    sha256: str = ""


@dataclass(frozen=True)
class TokenIndex:
    dtype: str
    vocab_size: int
    shards: tuple[ShardEntry, ...]
    eos_id: int | None = None
    documents: int = 0
    tokenizer: dict[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    def digest(self) -> str:
        """Identifies the token stream (shard names, sizes and checksums), for checkpoints."""
        body = json.dumps([[s.file, s.tokens, s.sha256] for s in self.shards] + [self.dtype], separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT, "version": VERSION, "dtype": self.dtype, "vocab_size": self.vocab_size,
                "eos_id": self.eos_id, "tokens": self.tokens, "documents": self.documents,
                "shards": [{"file": s.file, "tokens": s.tokens, "sha256": s.sha256} for s in self.shards],
                "tokenizer": self.tokenizer, "sources": list(self.sources),
            },
            indent=1,
        ) + "\n"


def read_index(folder: str | os.PathLike[str]) -> TokenIndex:
    """The folder's index, checked against the files (names, sizes); raises TokenFormatError."""
    root = Path(folder)
    path = root / INDEX_NAME
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise TokenFormatError(
            [
                f"{path}: missing; make the shards with `railyard-train prepare --tokenizer tokenizer.json --output "
                f"{root} <text files>`"
            ]
        ) from None
    except (OSError, ValueError) as exc:
        raise TokenFormatError([f"{path}: unreadable ({exc})"]) from exc
    problems: list[str] = []
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise TokenFormatError([f"{path}: not a {FORMAT} index (format field)"])
    if raw.get("version") != VERSION:
        problems.append(f"{path}: version {raw.get('version')!r}, this trainer reads version {VERSION}")
    dtype = raw.get("dtype")
    if dtype not in DTYPES:
        problems.append(f"{path}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        dtype = "uint32"
    vocab = raw.get("vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        problems.append(f"{path}: vocab_size must be a positive integer, got {vocab!r}")
        vocab = 1
    shards = []
    for i, s in enumerate(raw.get("shards") or []):
        try:
            entry = ShardEntry(file=str(s["file"]), tokens=int(s["tokens"]), sha256=str(s.get("sha256", "")))
        except (KeyError, TypeError, ValueError):
            problems.append(f"{path}: shards[{i}] needs file and tokens")
            continue
        f = root / entry.file
        want = entry.tokens * DTYPES[dtype].itemsize
        try:
            have = f.stat().st_size
        except OSError:
            problems.append(f"{f}: listed in {INDEX_NAME} but missing")
            continue
        if have != want:
            problems.append(f"{f}: {have} bytes, but {INDEX_NAME} lists {entry.tokens} {dtype} tokens ({want} bytes)")
        shards.append(entry)
    if not shards and not problems:
        problems.append(f"{path}: lists no shards")
    eos = raw.get("eos_id")
    if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int)):
        problems.append(f"{path}: eos_id must be an integer or null")
        eos = None
    if problems:
        raise TokenFormatError(problems)
    return TokenIndex(
        dtype=dtype, vocab_size=vocab, shards=tuple(shards), eos_id=eos, documents=int(raw.get("documents") or 0),
        tokenizer=dict(raw.get("tokenizer") or {}), sources=tuple(str(x) for x in raw.get("sources") or ()),
    )


class TokenShards:
    """The token stream of a shard folder, memory-mapped: nothing is read until asked for."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.root = Path(folder)
        self.index = read_index(self.root)
        dt = DTYPES[self.index.dtype]
        self._maps = [
            np.memmap(self.root / s.file, dtype=dt, mode="r", shape=(s.tokens,))
            for s in self.index.shards
            if s.tokens > 0
        ]
        self._starts = np.cumsum([0] + [len(m) for m in self._maps])
        self.tokens = int(self._starts[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """``length`` ids from stream position ``start`` as int64 (across shard boundaries)."""
        if start < 0 or start + length > self.tokens:
            raise IndexError(f"tokens [{start}, {start + length}) outside the stream of {self.tokens}")
        out = np.empty(length, dtype=np.int64)
        i = int(np.searchsorted(self._starts, start, side="right")) - 1
        filled = 0
        while filled < length:
            off = start + filled - int(self._starts[i])
            take = min(length - filled, len(self._maps[i]) - off)
            out[filled : filled + take] = self._maps[i][off : off + take]
            filled += take
            i += 1
        return out


class ShardWriter:
    """Appends documents' ids to numbered shard files; :meth:`close` writes index.json last."""

    def __init__(
        self, folder: str | os.PathLike[str], *, vocab_size: int, eos_id: int | None, shard_tokens: int
    ) -> None:
        self.root = Path(folder)
        self.root.mkdir(parents=True, exist_ok=True)
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.dtype = dtype_for(vocab_size)
        self.np_dtype = DTYPES[self.dtype]
        self.shard_tokens = shard_tokens
        self.documents = 0
        self.shards: list[ShardEntry] = []
        self._buf: list[np.ndarray] = []
        self._buffered = 0

    def add(self, ids: Sequence[int] | np.ndarray) -> None:
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= self.vocab_size):
            raise ValueError(f"token id {int(arr.max())} outside the vocabulary of {self.vocab_size}")
        if self.eos_id is not None:
            arr = np.append(arr, self.eos_id)
        self.documents += 1
        self._buf.append(arr.astype(self.np_dtype))
        self._buffered += arr.size
        while self._buffered >= self.shard_tokens:
            self._flush(self.shard_tokens)

    def _flush(self, n: int) -> None:
        data = np.concatenate(self._buf) if len(self._buf) != 1 else self._buf[0]
        head, rest = data[:n], data[n:]
        name = f"tokens-{len(self.shards):05d}.bin"
        tmp = self.root / (name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(head.astype(self.np_dtype).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / name)
        self.shards.append(ShardEntry(name, int(head.size), sha256_file(self.root / name)))
        self._buf = [rest] if rest.size else []
        self._buffered = int(rest.size)

    def close(self, *, tokenizer: dict[str, Any] | None = None, sources: Iterable[str] = ()) -> TokenIndex:
        if self._buffered:
            self._flush(self._buffered)
        index = TokenIndex(
            dtype=self.dtype, vocab_size=self.vocab_size, shards=tuple(self.shards), eos_id=self.eos_id,
            documents=self.documents, tokenizer=dict(tokenizer or {}), sources=tuple(sources),
        )
        tmp = self.root / (INDEX_NAME + ".tmp")
        tmp.write_text(index.to_json())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.root / INDEX_NAME)
        return index
