"""``railyard-train export``: a checkpoint as one safetensors file Hugging Face transformers loads.

    railyard-train export --checkpoint /ckpt/shared/myjob --output /models/myjob-hf
    railyard-train export --checkpoint /dev/shm/railyard/myjob/step-00000120 --output out --tokenizer tok.json

``--checkpoint`` is a job folder of any tier (the newest committed, SDC-clean step is taken,
or ``--step``), a folder above one (``--checkpoint-dir ck`` of the launcher writes ``ck/<job>/``;
a tier's root holds ``<job>/``), or one step folder: a shared-tier or plain DCP checkpoint (one ``.metadata``),
or a node-tier step (``rank-*/`` per-rank checkpoints, read together, so every rank's folder
must be there, e.g. a single node's memory tier). The model's shards are consolidated on CPU
(DCP reshards them into whole tensors; no process group, no GPU), renamed to the LLaMA names of
``transformers`` (``LlamaForCausalLM``), and written as ``model.safetensors`` with a
``config.json``; ``--tokenizer`` copies a ``tokenizer.json`` next to them.

Our attention rotates interleaved pairs (Meta's original LLaMA layout); transformers rotates
the two halves of each head, so the rows of ``wq`` and ``wk`` are permuted per head (the same
permutation transformers' own LLaMA conversion script applies). The preset is found from the
tensor shapes (or named with ``--preset``), the vocabulary from the embedding's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from railyard.protocol.manifest import MANIFEST_NAME
from railyard_trainer.model_args import PRESETS, ModelArgs

MODEL_PREFIX = "model."


class ExportError(RuntimeError):
    pass


# ---------------------------------------------------------------------------- names and layout


def _permute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Interleaved-pair rotary layout -> half-split layout, per head (rows of wq / wk)."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    rows, cols = w.shape
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


_BLOCK = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def to_hf(state: Mapping[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Our parameter names (as in the unsplit model) -> transformers' LLaMA names."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name in _TOP:
            out[_TOP[name]] = t
            continue
        parts = name.split(".", 2)
        if len(parts) != 3 or parts[0] != "layers" or parts[2] not in _BLOCK:
            raise ExportError(f"{name}: not a parameter of the LLaMA model")
        if parts[2] == "attention.wq.weight":
            t = _permute_rows(t, args.n_heads)
        elif parts[2] == "attention.wk.weight":
            t = _permute_rows(t, args.n_kv_heads)
        out[f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}"] = t
    return out


def from_hf(state: Mapping[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_hf` (transformers' LLaMA names -> ours)."""
    top = {v: k for k, v in _TOP.items()}
    block = {v: k for k, v in _BLOCK.items()}
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if name in top:
            out[top[name]] = t
            continue
        rest = name.removeprefix("model.layers.")
        layer, _, key = rest.partition(".")
        ours = block[key]
        if ours == "attention.wq.weight":
            t = _unpermute_rows(t, args.n_heads)
        elif ours == "attention.wk.weight":
            t = _unpermute_rows(t, args.n_kv_heads)
        out[f"layers.{layer}.{ours}"] = t
    return out


def hf_config(args: ModelArgs, *, dtype: torch.dtype, eos_token_id: int | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.dim,
        "intermediate_size": args.ffn_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim,
        "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps,
        "rope_theta": args.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if eos_token_id is not None:
        cfg["eos_token_id"] = eos_token_id
    return cfg


def infer_preset(shapes: Mapping[str, Sequence[int]]) -> str:
    """The preset whose shapes these are (width, layer count, MLP, key/value width; the
    vocabulary is the tokenizer's, not the preset's: :func:`model_args`)."""
    vocab, dim = _embedding_shape(shapes)
    try:
        ffn = shapes["layers.0.feed_forward.w1.weight"][0]
        kv = shapes["layers.0.attention.wk.weight"][0]
    except KeyError as exc:
        raise ExportError(
            f"the checkpoint has no {exc.args[0]}: not a checkpoint of the bundled trainer's model"
        ) from exc
    layers = len({k.split(".")[1] for k in shapes if k.startswith("layers.")})
    for name, a in PRESETS.items():
        if (a.dim, a.ffn_dim, a.n_kv_heads * a.head_dim, a.n_layers) == (dim, ffn, kv, layers):
            return name
    raise ExportError(
        f"no preset has these shapes (vocab {vocab}, dim {dim}, {layers} layers, ffn {ffn}); name it with --preset"
    )


def model_args(shapes: Mapping[str, Sequence[int]], preset: str) -> ModelArgs:
    """The preset's shapes with the checkpoint's vocabulary (the trainer's follows the tokenizer)."""
    return replace(PRESETS[preset], vocab_size=_embedding_shape(shapes)[0])


def _embedding_shape(shapes: Mapping[str, Sequence[int]]) -> tuple[int, int]:
    try:
        vocab, dim = shapes["tok_embeddings.weight"]
    except KeyError as exc:
        raise ExportError(
            f"the checkpoint has no {exc.args[0]}: not a checkpoint of the bundled trainer's model"
        ) from exc
    return int(vocab), int(dim)


# ---------------------------------------------------------------------------- reading checkpoints


def _committed_steps(job_dir: Path) -> list[int]:
    steps = []
    for d in sorted(job_dir.glob("step-*")):
        if not d.name[5:].isdigit():
            continue
        manifest = d / MANIFEST_NAME
        if manifest.exists():
            try:
                if json.loads(manifest.read_text()).get("sdc_passed", False):
                    steps.append(int(d.name[5:]))
            except ValueError:
                continue
        elif (d / "COMPLETE").exists():  # the plain DCP checkpointer's marker
            steps.append(int(d.name[5:]))
    return steps


def resolve_step_dir(path: Path, step: int | None) -> Path:
    """The step folder ``--checkpoint`` names: a step folder itself, the newest committed clean
    step (or ``step``) of a job folder, or of the one job folder found below ``path`` (what
    ``--checkpoint-dir ck`` or a tier root holds: ``ck/<job>/``, ``root/<tier>/<job>/``)."""
    if (path / ".metadata").exists() or any(path.glob("rank-*/.metadata")):
        return path
    if not path.is_dir():
        raise ExportError(
            f"{path}: no such folder; give a job's checkpoint folder (holding step-* folders) or one step folder"
        )
    if not any(path.glob("step-*")):
        path = _job_dir_below(path, step)
    steps = _committed_steps(path)
    if step is not None:
        if step not in steps:
            raise ExportError(f"{path}: no committed, SDC-clean step {step} (have {steps or 'none'})")
        return path / f"step-{step:08d}"
    if not steps:
        raise ExportError(
            f"{path}: no committed, SDC-clean checkpoint (a step-* folder with manifest.json or COMPLETE)"
        )
    return path / f"step-{steps[-1]:08d}"


def _job_dir_below(root: Path, step: int | None) -> Path:
    """The folder below ``root`` (one or two levels) whose committed steps export takes: the
    only one, or, when the tiers of one job hold it several times, the one with the newest step
    (``step``: one that has it). Checkpoints of several jobs are named, to pick one."""
    found = {d: steps for d in sorted({p.parent for p in [*root.glob("*/step-*"), *root.glob("*/*/step-*")]})
             if (steps := _committed_steps(d))}
    if step is not None:
        found = {d: s for d, s in found.items() if step in s}
    if not found:
        want = f"committed, SDC-clean step {step}" if step is not None else "committed, SDC-clean checkpoint"
        raise ExportError(
            f"{root}: no {want} here or in its subfolders (a step-* folder with manifest.json or COMPLETE)"
        )
    jobs = {d.name for d in found}
    if len(jobs) > 1:
        listed = ", ".join(f"{d} (newest step {s[-1]})" for d, s in found.items())
        raise ExportError(
            f"{root}: holds checkpoints of several jobs: {listed}; give one of these folders as --checkpoint"
        )
    return max(found, key=lambda d: found[d][-1])


def _reader(step_dir: Path) -> Any:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    if (step_dir / ".metadata").exists():
        return FileSystemReader(step_dir)
    import pickle

    from railyard_trainer.checkpoint.statedict import _MergedReader, merge_rank_metadata

    metas = {}
    for meta in sorted(step_dir.glob("rank-*/.metadata")):
        with open(meta, "rb") as f:
            metas[meta.parent.name] = pickle.load(f)
    if not metas:
        raise ExportError(f"{step_dir}: neither a DCP checkpoint (.metadata) nor per-rank ones (rank-*/.metadata)")
    return _MergedReader(step_dir, merge_rank_metadata(metas))


def load_model_state(step_dir: Path) -> dict[str, torch.Tensor]:
    """The model's parameters of a checkpoint as whole CPU tensors, by our names."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    reader = _reader(step_dir)
    meta = reader.read_metadata()
    template: dict[str, torch.Tensor] = {}
    for key, md in meta.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata):
            template[key.removeprefix(MODEL_PREFIX)] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
    if not template:
        raise ExportError(f"{step_dir}: the checkpoint holds no model state")
    state = {"model": template}
    dcp_load(state, storage_reader=reader, no_dist=True)
    return template


# ---------------------------------------------------------------------------- export


def export(checkpoint: Path, output: Path, *, step: int | None = None, preset: str | None = None,
           dtype: torch.dtype = torch.float32, tokenizer: Path | None = None) -> dict[str, Any]:
    from safetensors.torch import save_file

    step_dir = resolve_step_dir(checkpoint, step)
    state = load_model_state(step_dir)
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    name = preset or infer_preset(shapes)
    args = model_args(shapes, name)
    hf = {k: v.to(dtype).contiguous() for k, v in to_hf(state, args).items()}
    output.mkdir(parents=True, exist_ok=True)
    save_file(hf, str(output / "model.safetensors"), metadata={"format": "pt", "source": str(step_dir), "preset": name})
    eos = None
    if tokenizer is not None:
        shutil.copyfile(tokenizer, output / "tokenizer.json")
        eos = _eos_id(tokenizer)
        (output / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": args.max_seq_len}, indent=1)
            + "\n"
        )
    (output / "config.json").write_text(json.dumps(hf_config(args, dtype=dtype, eos_token_id=eos), indent=1) + "\n")
    return {"event": "exported", "output": str(output), "checkpoint": str(step_dir), "preset": name, "tensors": len(hf),
            "parameters": sum(v.numel() for v in hf.values()), "dtype": str(dtype).removeprefix("torch.")}


def _eos_id(tokenizer: Path) -> int | None:
    from railyard_trainer.prepare import find_eos, load_tokenizer

    return find_eos(load_tokenizer(str(tokenizer)), None)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="railyard-train export",
        description="Write a checkpoint as safetensors + config.json that Hugging Face transformers loads "
                    "(LlamaForCausalLM).",
    )
    ap.add_argument(
        "--checkpoint",
        required=True,
        type=Path,
        help="a job's checkpoint folder (newest clean step), the folder given as --checkpoint-dir, or one step folder",
    )
    ap.add_argument("--output", required=True, type=Path, help="folder to write model.safetensors and config.json into")
    ap.add_argument("--step", type=int, help="which step (default: the newest committed, SDC-clean one)")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="the model preset (default: found from the shapes)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer.json to copy alongside")
    args = ap.parse_args(argv)
    try:
        info = export(
            args.checkpoint,
            args.output,
            step=args.step,
            preset=args.preset,
            dtype=getattr(torch, args.dtype),
            tokenizer=args.tokenizer,
        )
    except (ExportError, OSError) as exc:
        print(f"railyard-train export: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info))
    return 0
