"""End-to-end tests on a real cluster (marked ``e2e``).

Two ways to get a cluster:

* **kind** (default): pytest-kind creates a cluster (1 control plane + 2 workers), the two
  images are built with Docker (or taken from ``RAILYARD_E2E_OPERATOR_IMAGE`` and
  ``RAILYARD_E2E_TRAINER_IMAGE``, e.g. ``deploy/images/build-local.sh``'s) and loaded with
  ``kind load docker-image``. Needs a running Docker engine, a kind binary (``--kind-bin`` or
  the PATH) and a ``kindest/node`` image in Docker (``--kind-image``, or any one found). What is
  missing is downloaded only with ``RAILYARD_E2E_DOWNLOAD=1`` (pytest-kind fetches kind and
  kubectl, kind pulls its node image, the builds pull their base images); otherwise the tests
  skip and say what to provide, so a machine without the internet skips instead of failing.
* **any cluster**: ``--kubeconfig PATH`` (pytest-kind's option) or ``RAILYARD_TEST_KUBECONFIG``.
  Images are not built; name ones the cluster can pull with ``RAILYARD_E2E_OPERATOR_IMAGE`` and
  ``RAILYARD_E2E_TRAINER_IMAGE`` (default: the chart's and the API's defaults).

Without either, every test here is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_IMAGE = "railyard-operator:e2e"
TRAINER_IMAGE = "railyard-trainer:e2e"
KIND_CONFIG = textwrap.dedent("""\
    kind: Cluster
    apiVersion: kind.x-k8s.io/v1alpha4
    nodes:
      - role: control-plane
      - role: worker
      - role: worker
""")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


def _given_kubeconfig(config: pytest.Config) -> str | None:
    opt = None
    with contextlib.suppress(ValueError):  # pytest-kind not installed: no --kubeconfig option
        opt = config.getoption("kubeconfig")
    return opt or os.environ.get("RAILYARD_TEST_KUBECONFIG") or None


def docker_engine_problem() -> str | None:
    """Why Docker cannot build images here (None: it can)."""
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on PATH"
    try:
        out = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker info failed: {exc}"
    if out.returncode != 0 or not out.stdout.strip():
        return f"no Docker engine reachable ({(out.stderr or out.stdout).strip().splitlines()[-1] if (out.stderr or out.stdout).strip() else 'docker info failed'})"
    return None


def _download_allowed() -> bool:
    return os.environ.get("RAILYARD_E2E_DOWNLOAD") == "1"


def _has_image(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True, timeout=30).returncode == 0


@dataclass
class KindPlan:
    """What kind needs here, or why it cannot run (``problem``)."""

    problem: str | None = None
    kind_bin: str | None = None
    node_image: str | None = None
    given_images: tuple[str, str] | None = None


def kind_plan(config: pytest.Config) -> KindPlan:
    """Whether kind can make a cluster and load our images without downloading anything."""
    kind_bin = config.getoption("kind_bin") or shutil.which("kind")
    if not kind_bin and not _download_allowed():
        return KindPlan("no kind binary: pass --kind-bin or put kind on PATH (RAILYARD_E2E_DOWNLOAD=1 lets "
                        "pytest-kind download it)")
    node_image = config.getoption("kind_image")
    if node_image and not _has_image(node_image) and not _download_allowed():
        return KindPlan(f"kind node image {node_image} is not in Docker: docker pull it, or set RAILYARD_E2E_DOWNLOAD=1")
    if not node_image:
        listed = subprocess.run(["docker", "images", "kindest/node", "--format", "{{.Repository}}:{{.Tag}}"],
                                capture_output=True, text=True, timeout=30).stdout.split()
        node_image = next((ref for ref in listed if not ref.endswith(":<none>")), None)
        if node_image is None and not _download_allowed():
            return KindPlan("no kindest/node image in Docker: docker pull kindest/node:<version> (or pass --kind-image), "
                            "or set RAILYARD_E2E_DOWNLOAD=1 to let kind pull its default")
    op, tr = os.environ.get("RAILYARD_E2E_OPERATOR_IMAGE"), os.environ.get("RAILYARD_E2E_TRAINER_IMAGE")
    given = (op, tr) if op and tr else None
    if given is None and not _download_allowed():
        bases = [ref for ref in (_base_image(ROOT / "Dockerfile", "PYTHON_IMAGE"), _base_image(ROOT / "trainer_image" / "Dockerfile", "BASE_IMAGE"))
                 if ref and not _has_image(ref)]
        if bases:
            return KindPlan(f"the images' base {', '.join(bases)} is not in Docker: build both with "
                            "deploy/images/build-local.sh and set RAILYARD_E2E_OPERATOR_IMAGE and "
                            "RAILYARD_E2E_TRAINER_IMAGE, or set RAILYARD_E2E_DOWNLOAD=1")
    return KindPlan(None, kind_bin, node_image, given)


def _base_image(dockerfile: Path, arg: str) -> str | None:
    for line in dockerfile.read_text().splitlines():
        if line.startswith(f"ARG {arg}="):
            return line.split("=", 1)[1].strip()
    return None


@dataclass
class E2ECluster:
    kubeconfig: Path
    mode: str  # "kind" or "existing"
    operator_image: str
    trainer_image: str
    kind: Any = None
    namespaces: list[str] = field(default_factory=list)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        kubectl = shutil.which("kubectl") or str(ROOT / ".venv" / "bin" / "kubectl")
        out = subprocess.run([kubectl, "--kubeconfig", str(self.kubeconfig), *args],
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout


def _build(tag: str, dockerfile: str, *build_args: str) -> None:
    epoch = subprocess.run(["git", "log", "-1", "--format=%ct"], capture_output=True, text=True, cwd=ROOT).stdout.strip() or "0"
    subprocess.run(
        ["docker", "build", "-f", dockerfile, "-t", tag, "--build-arg", f"SOURCE_DATE_EPOCH={epoch}",
         *(a for arg in build_args for a in ("--build-arg", arg)), "."],
        cwd=ROOT, check=True, timeout=3600,
    )


@pytest.fixture(scope="session")
def e2e_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2ECluster]:
    given = _given_kubeconfig(request.config)
    if given:
        yield E2ECluster(
            Path(given), "existing",
            os.environ.get("RAILYARD_E2E_OPERATOR_IMAGE", "ghcr.io/railyard-dev/railyard-operator:0.1.0"),
            os.environ.get("RAILYARD_E2E_TRAINER_IMAGE", "ghcr.io/railyard-dev/railyard-trainer:0.1.0"),
        )
        return
    problem = docker_engine_problem()
    if problem:
        pytest.skip(f"e2e needs a Docker engine for kind ({problem}) or a cluster: pass --kubeconfig PATH "
                    "or set RAILYARD_TEST_KUBECONFIG")
    try:
        from pytest_kind.cluster import KindCluster
    except ImportError:
        pytest.skip("e2e on kind needs pytest-kind (pip install pytest-kind), or pass --kubeconfig")
    plan = kind_plan(request.config)
    if plan.problem:
        pytest.skip(f"e2e on kind: {plan.problem}; or run on a cluster with --kubeconfig PATH / RAILYARD_TEST_KUBECONFIG")
    kubectl = shutil.which("kubectl") or str(ROOT / ".venv" / "bin" / "kubectl")
    cluster = KindCluster(
        request.config.getoption("cluster_name") or "railyard-e2e",
        kind_path=Path(plan.kind_bin) if plan.kind_bin else None,
        kubectl_path=Path(kubectl) if Path(kubectl).exists() else None,
        image=plan.node_image,
    )
    config_file = tmp_path_factory.mktemp("kind") / "kind.yaml"
    config_file.write_text(KIND_CONFIG)
    cluster.create(config_file=config_file)
    try:
        operator_image, trainer_image = plan.given_images or (OPERATOR_IMAGE, TRAINER_IMAGE)
        if plan.given_images is None:
            _build(OPERATOR_IMAGE, "Dockerfile")
            # kind has no GPUs: the CPU variant (docs/deploy.md)
            _build(TRAINER_IMAGE, "trainer_image/Dockerfile", "TORCH_VARIANT=cpu")
        for image in (operator_image, trainer_image):
            cluster.load_docker_image(image)
        yield E2ECluster(Path(cluster.kubeconfig_path), "kind", operator_image, trainer_image, kind=cluster)
    finally:
        if not request.config.getoption("keep_cluster"):
            cluster.delete()
