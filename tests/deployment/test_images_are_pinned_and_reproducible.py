"""Static checks of the two Dockerfiles (this machine has no Docker engine to build them)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from .chart import ROOT, find, render_objects

OPERATOR = ROOT / "Dockerfile"
TRAINER = ROOT / "trainer_image" / "Dockerfile"


def _arg_defaults(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, flags=re.M))


def base_images(path: Path) -> list[str]:
    text = path.read_text()
    args = _arg_defaults(text)
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\w+)", text, flags=re.M | re.I))
    out = []
    for ref in re.findall(r"^FROM\s+(\S+)", text, flags=re.M):
        ref = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), ref)
        if ref not in stages:
            out.append(ref)
    return out


def is_pinned(ref: str) -> bool:
    if "@sha256:" in ref:
        return True
    name, _, tag = ref.rpartition(":")
    # a full x.y.z version: "3.11" or "24.04" would move with every patch release
    return bool(name) and "/" not in tag and bool(re.search(r"\d+\.\d+\.\d+", tag))


@pytest.mark.parametrize("dockerfile", [OPERATOR, TRAINER], ids=["operator", "trainer"])
def test_base_images_are_pinned_by_version_or_digest(dockerfile: Path) -> None:
    refs = base_images(dockerfile)
    assert refs, "no FROM found"
    assert [r for r in refs if not is_pinned(r)] == []


def test_pin_check_rejects_floating_tags() -> None:
    assert not is_pinned("python:3.11-slim")
    assert is_pinned("python:3.11.11-slim-bookworm")
    assert not is_pinned("python:latest") and not is_pinned("python") and not is_pinned("ubuntu:noble")
    assert is_pinned("python@sha256:" + "0" * 64)


def test_operator_image_runs_as_the_user_the_chart_expects() -> None:
    user = re.findall(r"^USER\s+(\d+)(?::(\d+))?", OPERATOR.read_text(), flags=re.M)[-1]
    pod = find(render_objects({}), "Deployment")["spec"]["template"]["spec"]
    assert int(user[0]) != 0
    assert pod["securityContext"]["runAsUser"] == int(user[0])
    assert pod["securityContext"]["runAsGroup"] == int(user[1])


def test_operator_build_is_reproducible_by_construction() -> None:
    text = OPERATOR.read_text()
    assert "SOURCE_DATE_EPOCH" in text
    assert "--invalidation-mode unchecked-hash" in text  # no mtimes inside .pyc files
    assert "-c /src/constraints.txt" in text and "-r /src/constraints.txt" in text
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "**/__pycache__"} <= set(ignore)


def _assert_tested(pins: dict[str, str], installed: dict[str, str]) -> None:
    """The images pin what this virtualenv tests: the same packages at the same versions."""
    differ = sorted(f"{k}: pinned {pins.get(k)}, installed {installed.get(k)}" for k in pins.keys() | installed.keys()
                    if pins.get(k) != installed.get(k))
    assert not differ, ("the images' pins and this virtualenv differ: " + "; ".join(differ) + ". Install as the README's "
                        "set-up command does (with -c deploy/images/*-constraints.txt), or, to move the pins to what "
                        "is installed, run python deploy/images/freeze.py")


def test_the_readme_sets_up_with_the_constraints_ci_installs_with() -> None:
    """The pins are judged against the installed versions: the README's set-up command installs
    what CI installs, one requirements file that takes every constraint file, or a venv made by
    it fails the checks above (pip takes the newest releases) and runs other versions than CI
    tested."""
    ci = (ROOT / ".ci" / "run").read_text()
    ci_installs = [line.split("-q ", 1)[1] for line in ci.splitlines() if line.removeprefix("PIP_COMPILE=0 ").startswith("python -m pip install -q ")]
    assert ci_installs == ["-r requirements/dev.txt"], ci_installs
    setup = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("python3 -m venv .venv"))
    readme_installs = [cmd.strip().removeprefix("pip install ") for cmd in setup.split("&&") if cmd.strip().startswith("pip install ")]
    assert readme_installs == ci_installs, setup
    requirements = (ROOT / "requirements" / "dev.txt").read_text().splitlines()
    constraints = {line.removeprefix("-c ../") for line in requirements if line.startswith("-c ")}
    assert constraints == {str(p.relative_to(ROOT)) for p in (ROOT / "deploy" / "images").glob("*-constraints.txt")}
    assert {"torch==2.13.0", "-e .[dev]", "-e ./local_cluster"} <= set(requirements)


def test_operator_constraints_pin_the_tested_dependency_closure_without_torch() -> None:
    sys.path.insert(0, str(ROOT / "deploy" / "images"))
    try:
        import freeze  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = dict(line.split("==") for line in (ROOT / "deploy" / "images" / "operator-constraints.txt").read_text().split()
                if "==" in line)
    _assert_tested(pins, freeze.closure(deps))
    assert "torch" not in pins and "numpy" not in pins
    # the image installs every pin (-r): the local cluster's dependencies are not among them
    assert not {"cryptography", "kubernetes", "jsonschema"} & set(pins)


def test_the_local_cluster_constraints_pin_its_own_tested_closure() -> None:
    """railyard-local (local_cluster/) is installed beside railyard by the README's set-up
    command, with its own pins; its dependencies are the ones the operator no longer carries."""
    sys.path.insert(0, str(ROOT / "deploy" / "images"))
    try:
        import freeze
    finally:
        sys.path.pop(0)
    import tomllib

    local = tomllib.loads((ROOT / "local_cluster" / "pyproject.toml").read_text())["project"]
    pins = dict(line.split("==") for line in (ROOT / "deploy" / "images" / "local-cluster-constraints.txt").read_text().split()
                if "==" in line)
    _assert_tested(pins, freeze.local_cluster_closure(local))
    assert {"cryptography", "kubernetes"} <= set(pins) and "railyard" not in pins
    operator = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [r for r in operator if r.startswith(("cryptography", "kubernetes"))], operator


def test_the_operator_image_is_built_without_the_local_cluster() -> None:
    """The operator image installs railyard only: the local cluster's folder is not in the build
    context and no COPY names it (tests/images checks the built image)."""
    text = OPERATOR.read_text()
    assert "local_cluster" not in text
    assert "local_cluster" in (ROOT / ".dockerignore").read_text().split()
    assert "COPY operator/ operator/" in text
    assert not (ROOT / "operator" / "railyard" / "local").exists()


def test_trainer_build_is_reproducible_by_construction() -> None:
    text = TRAINER.read_text()
    assert "SOURCE_DATE_EPOCH" in text
    assert "--invalidation-mode unchecked-hash" in text
    assert "-r /src/constraints.txt" in text and "--no-deps -c /src/constraints.txt" in text
    assert "COPY deploy/images/trainer-constraints.txt /src/constraints.txt" in text
    # nothing unpinned from Debian mirrors, and no CUDA base duplicating what the torch wheel bundles
    instructions = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert "apt-get" not in instructions and "useradd" not in instructions
    assert not [r for r in base_images(TRAINER) if r.startswith("nvidia/")]
    assert _arg_defaults(text)["TORCH_VERSION"] == "2.13.0"


def test_trainer_constraints_pin_the_trainer_closure_without_the_operator_stack() -> None:
    sys.path.insert(0, str(ROOT / "deploy" / "images"))
    try:
        import freeze
    finally:
        sys.path.pop(0)
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = dict(line.split("==") for line in (ROOT / "deploy" / "images" / "trainer-constraints.txt").read_text().split()
                if "==" in line)
    _assert_tested(pins, freeze.trainer_closure(project))
    assert pins["torch"] == _arg_defaults(TRAINER.read_text())["TORCH_VERSION"]
    assert not {"kopf", "kubernetes", "pydantic", "aiohttp", "prometheus-client"} & set(pins)
    assert all("+" not in v for v in pins.values()), "local labels (+cpu) would not match the CUDA build"


def test_trainer_image_user_matches_the_uid_the_operator_runs_it_as() -> None:
    """The operator sets runAsUser on pods using the default trainer image; the image's own user
    must be that UID or its home directory is not writable."""
    from railyard.api.trainingjob import TrainingJobSpec
    from railyard.logic.manifests import build_pod

    text = TRAINER.read_text()
    uid = _arg_defaults(text).get("UID") or re.findall(r"^USER\s+(\d+)", text, flags=re.M)[-1]
    pod = build_pod(TrainingJobSpec.model_validate({"nodes": 1}), job="j", namespace="n", owner={}, attempt=0,
                    pod_index=0, node="n0", heartbeat_url="http://x")
    sc = pod["spec"]["securityContext"]
    assert int(uid) != 0 and sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == sc["runAsGroup"] == sc["fsGroup"] == int(uid)
    # the kubelet creates hostPath folders as root: the init container hands them to that UID
    [init] = pod["spec"]["initContainers"]
    assert init["command"][:2] == ["chown", f"{uid}:{uid}"]
    assert set(init["command"][2:]) == {m["mountPath"] for m in init["volumeMounts"]}
    assert {m["name"] for m in init["volumeMounts"]} == {"ckpt-memory", "ckpt-local", "ckpt-shared"}
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


def test_trainer_torch_comes_from_the_cuda_index_unless_a_wheel_file_is_given() -> None:
    """Real builds get torch from the CUDA index; deploy/images/build-local.sh hands a wheel
    file in by build argument, and the file stays in the build stage."""
    text = TRAINER.read_text()
    args = _arg_defaults(text)
    assert args["TORCH_VARIANT"] == "cu128"
    assert args["TORCH_INDEX"] == "https://download.pytorch.org/whl/${TORCH_VARIANT}"
    assert re.search(r"^ARG TORCH_WHEEL=$", text, flags=re.M), "TORCH_WHEEL must default to empty (the index)"
    image_stage = text.split("\nFROM ")[-1]
    assert "/src/wheels" not in image_stage and "COPY --from=build /opt/railyard /opt/railyard" in image_stage
    script = (ROOT / "deploy" / "images" / "build-local.sh").read_text()
    assert '--build-arg "TORCH_WHEEL=$TORCH_WHEEL"' in script and "pip download" in script


def test_the_local_build_script_parses() -> None:
    import subprocess

    script = ROOT / "deploy" / "images" / "build-local.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    assert script.stat().st_mode & 0o111, "build-local.sh must be executable"
