"""``railyard-train prepare``: tokenize text into the shards the trainer memory-maps.

    railyard-train prepare --tokenizer tokenizer.json --output /data/shards book.txt more/ data.jsonl
    railyard-train prepare --tokenizer tokenizer.json --output /data/shards --hf-dataset /data/hf-saved
    railyard-train tokenizer --vocab-size 512 --output tokenizer.json book.txt

Inputs: ``.txt`` (one document per file, or per line with ``--line-documents``), ``.jsonl``
(one JSON object per line, the text in ``--text-field``), folders of those (sorted), or with
``--hf-dataset`` a Hugging Face ``datasets`` folder written by ``save_to_disk`` (needs the
``datasets`` package). The tokenizer is a ``tokenizer.json`` read by the ``tokenizers``
library (any Hugging Face fast tokenizer's file, e.g. Llama 3's); ``railyard-train tokenizer``
trains a small byte-level BPE one for tests and examples. Output format: :mod:`railyard_trainer.tokens`.
torch-free.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from railyard_trainer.tokens import INDEX_NAME, ShardWriter, TokenIndex, sha256_file

#: End-of-text tokens, in the order they are looked for when ``--eos-token`` is not given.
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "[EOS]", "<|eot_id|>")
TEXT_SUFFIXES = (".txt", ".text", ".md")
JSONL_SUFFIXES = (".jsonl", ".ndjson")


class PrepareError(RuntimeError):
    pass


def _files(inputs: Sequence[str]) -> list[Path]:
    out: list[Path] = []
    for raw in inputs:
        p = Path(raw)
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in TEXT_SUFFIXES + JSONL_SUFFIXES))
        elif p.is_file():
            out.append(p)
        else:
            raise PrepareError(f"{raw}: no such file or folder")
    if not out:
        raise PrepareError(f"no .txt or .jsonl files in {', '.join(inputs)}")
    return out


def iter_documents(files: Sequence[Path], *, text_field: str, line_documents: bool) -> Iterator[str]:
    for f in files:
        if f.suffix in JSONL_SUFFIXES:
            with open(f, encoding="utf-8") as fh:
                for n, line in enumerate(fh, start=1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except ValueError as exc:
                        raise PrepareError(f"{f}:{n}: not JSON ({exc})") from exc
                    text = obj.get(text_field) if isinstance(obj, dict) else None
                    if not isinstance(text, str):
                        raise PrepareError(
                            f"{f}:{n}: no string field {text_field!r}; name the text field with --text-field"
                        )
                    yield text
        else:
            text = f.read_text(encoding="utf-8")
            if line_documents:
                yield from (line for line in text.splitlines() if line.strip())
            else:
                yield text


def iter_hf_documents(path: str, *, text_field: str, split: str) -> Iterator[str]:
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise PrepareError("--hf-dataset needs the `datasets` package: pip install datasets") from exc
    ds: Any = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise PrepareError(f"{path}: no split {split!r} (has {', '.join(ds)}); choose one with --split")
        ds = ds[split]
    if text_field not in ds.column_names:
        raise PrepareError(
            f"{path}: no column {text_field!r} (has {', '.join(ds.column_names)}); name it with --text-field"
        )
    for row in ds:
        yield row[text_field]


def load_tokenizer(path: str) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - a dependency of railyard[trainer]
        raise PrepareError("the `tokenizers` package is missing: pip install 'railyard[trainer]'") from exc
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:
        raise PrepareError(
            f"--tokenizer {path}: cannot load it with the tokenizers library ({exc}); give a Hugging Face "
            "tokenizer.json"
        ) from exc


def find_eos(tokenizer: Any, name: str | None) -> int | None:
    if name:
        tid = tokenizer.token_to_id(name)
        if tid is None:
            raise PrepareError(f"--eos-token {name!r}: not in the tokenizer's vocabulary")
        return int(tid)
    for cand in EOS_CANDIDATES:
        tid = tokenizer.token_to_id(cand)
        if tid is not None:
            return int(tid)
    return None


def prepare(
    inputs: Sequence[str],
    *,
    tokenizer_path: str,
    output: str,
    text_field: str = "text",
    line_documents: bool = False,
    shard_tokens: int = 100_000_000,
    eos_token: str | None = None,
    hf_dataset: str | None = None,
    split: str = "train",
    overwrite: bool = False,
    batch_documents: int = 256,
) -> TokenIndex:
    out = Path(output)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise PrepareError(f"--output {out}: not empty; choose a new folder or pass --overwrite")
        shutil.rmtree(out)
    tok = load_tokenizer(tokenizer_path)
    eos = find_eos(tok, eos_token)
    vocab = int(tok.get_vocab_size(with_added_tokens=True))
    if hf_dataset:
        docs = iter_hf_documents(hf_dataset, text_field=text_field, split=split)
        sources = [hf_dataset]
    else:
        files = _files(inputs)
        docs = iter_documents(files, text_field=text_field, line_documents=line_documents)
        sources = [str(f) for f in files]
    writer = ShardWriter(out, vocab_size=vocab, eos_id=eos, shard_tokens=shard_tokens)
    batch: list[str] = []

    def flush() -> None:
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            writer.add(enc.ids)
        batch.clear()

    for doc in docs:
        batch.append(doc)
        if len(batch) >= batch_documents:
            flush()
    if batch:
        flush()
    if writer.documents == 0:
        raise PrepareError("no documents in the input")
    shutil.copyfile(tokenizer_path, out / "tokenizer.json")
    return writer.close(
        tokenizer={
            "file": "tokenizer.json",
            "sha256": sha256_file(out / "tokenizer.json"),
            "source": str(tokenizer_path),
        },
        sources=sources,
    )


def train_tokenizer(inputs: Sequence[str], *, vocab_size: int, output: str, text_field: str = "text") -> int:
    """A byte-level BPE ``tokenizer.json`` trained on the inputs (tests, examples, small data)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<|endoftext|>"], show_progress=False)
    tok.train_from_iterator(
        iter_documents(_files(inputs), text_field=text_field, line_documents=False), trainer=trainer
    )
    tok.save(output)
    return int(tok.get_vocab_size(with_added_tokens=True))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="railyard-train prepare",
        description="Tokenize text or JSONL into the shards the trainer reads (trainer.dataset.type: tokens).",
    )
    ap.add_argument("inputs", nargs="*", help=".txt / .jsonl files or folders of them")
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    ap.add_argument("--output", required=True, help="folder to write (index.json + token files)")
    ap.add_argument(
        "--text-field", default="text", help="the text field of JSONL objects / dataset rows (default: text)"
    )
    ap.add_argument("--line-documents", action="store_true", help="each non-empty line of a .txt file is a document")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard file (default 1e8)")
    ap.add_argument(
        "--eos-token", help="end-of-text token put after every document (default: the tokenizer's, if it has one)"
    )
    ap.add_argument("--hf-dataset", help="a Hugging Face datasets folder (save_to_disk) instead of files")
    ap.add_argument("--split", default="train", help="with --hf-dataset: the split to read (default: train)")
    ap.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    args = ap.parse_args(argv)
    if not args.inputs and not args.hf_dataset:
        ap.error("give input files or --hf-dataset")
    try:
        index = prepare(
            args.inputs, tokenizer_path=args.tokenizer, output=args.output, text_field=args.text_field,
            line_documents=args.line_documents, shard_tokens=args.shard_tokens, eos_token=args.eos_token,
            hf_dataset=args.hf_dataset, split=args.split, overwrite=args.overwrite,
        )
    except (PrepareError, OSError, ValueError) as exc:
        print(f"railyard-train prepare: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {
                "event": "prepared",
                "output": args.output,
                "tokens": index.tokens,
                "documents": index.documents,
                "shards": len(index.shards),
                "vocab_size": index.vocab_size,
                "dtype": index.dtype,
                "eos_id": index.eos_id,
                "index": str(Path(args.output) / INDEX_NAME),
            }
        )
    )
    return 0


def tokenizer_main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="railyard-train tokenizer", description="Train a small byte-level BPE tokenizer.json on text files."
    )
    ap.add_argument("inputs", nargs="+", help=".txt / .jsonl files or folders of them")
    ap.add_argument("--vocab-size", type=int, default=512)
    ap.add_argument("--output", required=True, help="the tokenizer.json to write")
    ap.add_argument("--text-field", default="text")
    args = ap.parse_args(argv)
    try:
        n = train_tokenizer(args.inputs, vocab_size=args.vocab_size, output=args.output, text_field=args.text_field)
    except (PrepareError, OSError) as exc:
        print(f"railyard-train tokenizer: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"event": "tokenizer", "output": args.output, "vocab_size": n}))
    return 0
