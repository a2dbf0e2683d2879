"""The two images, as ``deploy/images/build-local.sh`` builds them, run the way the chart (the
operator) and the operator (training pods) run them.

Needs a Docker engine and both images (``RAILYARD_OPERATOR_IMAGE``, default
``railyard-operator:local``; ``RAILYARD_TRAINER_IMAGE``, default ``railyard-trainer:local-cpu``).
Without them every test here is skipped with the reason, unless ``RAILYARD_REQUIRE_IMAGES=1``
(CI builds the images first and sets it): then a missing engine or image fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest

OPERATOR_IMAGE = os.environ.get("RAILYARD_OPERATOR_IMAGE", "railyard-operator:local")
TRAINER_IMAGE = os.environ.get("RAILYARD_TRAINER_IMAGE", "railyard-trainer:local-cpu")
BUILD = "deploy/images/build-local.sh (needs root, debootstrap and a running dockerd; docs/deploy.md)"


@dataclass(frozen=True)
class Images:
    docker: str
    operator: str
    trainer: str

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([self.docker, *args], capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return out


def _problem() -> tuple[str | None, str]:
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on PATH", ""
    try:
        info = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info failed: {exc}", docker
    if info.returncode != 0 or not info.stdout.strip():
        return "no Docker engine reachable (start dockerd)", docker
    for image in (OPERATOR_IMAGE, TRAINER_IMAGE):
        if subprocess.run([docker, "image", "inspect", image], capture_output=True, timeout=30).returncode != 0:
            return f"image {image} not built: run {BUILD}", docker
    return None, docker


@pytest.fixture(scope="session")
def images() -> Images:
    problem, docker = _problem()
    if problem:
        if os.environ.get("RAILYARD_REQUIRE_IMAGES") == "1":
            pytest.fail(f"RAILYARD_REQUIRE_IMAGES=1 but {problem}")
        pytest.skip(problem)
    return Images(docker, OPERATOR_IMAGE, TRAINER_IMAGE)
