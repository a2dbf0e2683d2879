"""examples/tiny-text.yaml through ``kubectl apply`` on the local cluster: shards made by
``railyard-train prepare`` from the shipped text, the operator runs the real trainer in 2 pods
x 2 ranks (tensor parallel inside a pod, FSDP across), the job succeeds and its status shows
the loss falling. The run is cut to its first ``STEPS`` steps (``trainer.steps``, as a user would
shorten it): that the example's 40 steps reach the loss its header states is checked with the
same config by tests/trainer/test_example_job_trains_on_prepared_text.py, without a cluster."""

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
STEPS = 25
#: Uniform over the example's 256 tokens is ln(256) = 5.55 (its first steps log ~6); after 25
#: steps this config is at ~4.3 (4.6 at step 20).
LOSS_BELOW = 5.0


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
    assert job["spec"]["trainer"]["steps"] > STEPS
    job["spec"]["trainer"]["steps"] = STEPS
    job["spec"]["nodeSelector"] = local_cluster.node_selector  # on a given API server, not another's nodes
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
        assert status["step"] == STEPS
        assert status["loss"] is not None and status["loss"] < LOSS_BELOW, status
        assert status["restarts"]["total"] == 0, status
        print(f"example on the local cluster: loss {status['loss']:.3f} at step {status['step']}")
    finally:
        subprocess.run([str(kubectl), "--kubeconfig", str(local_cluster.kubeconfig), "delete", "-f", str(manifest), "--wait=false"],
                       capture_output=True, text=True, timeout=60)
