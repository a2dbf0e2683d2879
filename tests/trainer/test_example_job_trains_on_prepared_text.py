"""examples/tiny-text.yaml, as its comments say to run it: a tokenizer trained on the shipped
text, shards made by `railyard-train prepare`, and the job's own config.json (what the operator
writes for that spec) run by `railyard-train` on this machine. The loss falls below the value
the example states; `railyard-train export` then round-trips the trained model: transformers
loads it and computes the logits our model does."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from railyard.api.trainingjob import TrainingJob
from railyard.logic.manifests import build_trainer_config

from .launch import Run, launcher_env, parse_events

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-text.yaml"
TEXT = ROOT / "examples" / "data" / "apache-2.0.txt"
#: The example's promise (its header): ln(256) = 5.55 at the start, below this after 40 steps.
LOSS_BELOW = 3.5


def _cli(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "railyard_trainer.launcher", *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path, Path]:
    root = tmp_path_factory.mktemp("example")
    tok = root / "tokenizer.json"
    assert _cli("tokenizer", "--vocab-size", "256", "--output", str(tok), str(TEXT))["vocab_size"] == 256
    prepared = _cli("prepare", "--tokenizer", str(tok), "--line-documents", "--output", str(root / "shards"), str(TEXT))
    assert prepared["tokens"] > 3000 and prepared["dtype"] == "uint16"
    job = TrainingJob.model_validate(yaml.safe_load(EXAMPLE.read_text()))
    trainer = job.spec.trainer
    spec = job.spec.model_copy(update={"trainer": replace(trainer, dataset=replace(trainer.dataset, path=str(root / "shards")))})
    config = build_trainer_config(spec, job="tiny-text", namespace="default", attempt=0)
    config["checkpoint"]["memory"]["dir"] = str(root / "memory")
    config["checkpoint"]["shared"]["dir"] = str(root / "shared")
    (root / "config.json").write_text(json.dumps(config))
    env = launcher_env(RAILYARD_PLAIN_CHECKPOINT="0", RAILYARD_DISABLE_HEALTH="0")
    nproc = spec.nodes * spec.procs_per_node  # both of the example's nodes on this machine
    proc = subprocess.run([sys.executable, "-m", "railyard_trainer.launcher", "--config", str(root / "config.json"), "--nproc-per-node", str(nproc)],
                          env=env, capture_output=True, text=True, timeout=400)
    run = Run(proc.returncode, parse_events(proc.stdout), proc.stderr, root)
    assert run.code == 0, run.explain()
    return run, root, tok


def test_the_example_learns_the_text_below_its_stated_loss(trained: tuple[Run, Path, Path]) -> None:
    run, _, _ = trained
    losses = run.losses()
    assert sorted(losses) == list(range(1, 41))
    assert abs(losses[1] - 5.545) < 0.6, "starts near uniform over 256 tokens"
    print(f"example loss: step 1 {losses[1]:.3f}, step 20 {losses[20]:.3f}, step 40 {losses[40]:.3f}")
    assert min(losses[s] for s in range(36, 41)) < LOSS_BELOW, losses


def test_export_round_trips_the_trained_model(trained: tuple[Run, Path, Path], tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from railyard_trainer.export import from_hf, load_model_state, resolve_step_dir
    from railyard_trainer.model import Transformer
    from railyard_trainer.model_args import PRESETS

    _, root, tok = trained
    info = _cli("export", "--checkpoint", str(root / "shared" / "tiny-text"), "--output", str(tmp_path / "hf"), "--tokenizer", str(tok))
    assert info["preset"] == "tiny" and info["checkpoint"].endswith("step-00000040")
    args = PRESETS["tiny"]
    ours = load_model_state(resolve_step_dir(root / "shared" / "tiny-text", None))
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert len(exported) == 3 + 9 * args.n_layers  # embedding, final norm, head; 9 per layer
    assert exported["model.layers.0.self_attn.k_proj.weight"].shape == (args.n_kv_heads * args.head_dim, args.dim)
    back = from_hf(exported, args)
    assert set(back) == set(ours) and all(torch.equal(back[k], ours[k]) for k in ours), "names and layout round-trip exactly"
    # the node tier's per-rank shards (2 x 2 ranks) consolidate to the same model
    mem = load_model_state(resolve_step_dir(root / "memory" / "tiny-text", 40))
    assert all(torch.equal(mem[k], ours[k]) for k in ours)

    model = Transformer(args)
    model.load_state_dict(ours)
    tokens = torch.randint(0, args.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(tokens)
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "hf"))
    hf.eval()
    with torch.no_grad():
        got = hf(tokens).logits
    assert (got - expected).abs().max().item() < 1e-4
    assert got.argmax(-1).eq(expected.argmax(-1)).float().mean().item() > 0.99
