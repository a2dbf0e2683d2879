"""examples/tiny-text.yaml through ``kubectl apply`` on the local cluster: shards made by
``railyard-train prepare`` from the shipped text, the operator runs the real trainer in 2 pods
x 2 ranks (tensor parallel inside a pod, FSDP across), the job succeeds and its status shows
the loss below the value the example states."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.system.conftest import SYSTEM_NS, Api, OperatorProcess, unique, wait_status

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tiny-text.yaml"
TEXT = ROOT / "examples" / "data" / "apache-2.0.txt"
LOSS_BELOW = 3.5  # examples/tiny-text.yaml's header


def _train_cli(*args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "railyard_trainer.launcher", *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_example_trains_through_kubectl_apply(api: Api, operator: OperatorProcess, local_cluster: Any, tmp_path: Path) -> None:
    tok = tmp_path / "tokenizer.json"
    _train_cli("tokenizer", "--vocab-size", "256", "--output", str(tok), str(TEXT))
    _train_cli("prepare", "--tokenizer", str(tok), "--line-documents", "--output", str(tmp_path / "shards"), str(TEXT))
    job = yaml.safe_load(EXAMPLE.read_text())
    name = unique("tiny-text")
    job["metadata"] = {"name": name, "namespace": SYSTEM_NS}
    # the pods are processes on this machine: the shards' folder is the path they read
    job["spec"]["trainer"]["dataset"]["path"] = str(tmp_path / "shards")
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    kubectl = Path(sys.executable).parent / "kubectl"
    out = subprocess.run([str(kubectl), "--kubeconfig", str(local_cluster.kubeconfig), "apply", "-f", str(manifest)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"trainingjob.railyard.dev/{name} created" in out.stdout
    try:
        status = wait_status(api, name, "the example job to finish", lambda s: s if s.get("phase") in ("Succeeded", "Failed") else None,
                             timeout=780, op=operator)
        assert status["phase"] == "Succeeded", status
        assert status["step"] == job["spec"]["trainer"]["steps"]
        assert status["loss"] is not None and status["loss"] < LOSS_BELOW, status
        assert status["restarts"]["total"] == 0, status
        print(f"example on the local cluster: loss {status['loss']:.3f} at step {status['step']}")
    finally:
        subprocess.run([str(kubectl), "--kubeconfig", str(local_cluster.kubeconfig), "delete", "-f", str(manifest), "--wait=false"],
                       capture_output=True, text=True, timeout=60)
