"""Write deploy/images/operator-constraints.txt and trainer-constraints.txt: the installed
versions of each image's dependency closure, for reproducible image builds. The operator's is
pyproject's [project] dependencies; the trainer's is the [trainer] extra only (torch, numpy and
what they pull in; the trainer never imports the operator's kopf/pydantic stack, and the image
installs railyard itself with --no-deps).

And local-cluster-constraints.txt: the same for the local cluster's own dependencies
(local_cluster/pyproject.toml, railyard-local: cryptography, kubernetes). No image carries them;
the README's set-up command and CI install with all three files, so what is tested is pinned.

Run from the repository's virtualenv: ``python deploy/images/freeze.py``.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "operator-constraints.txt"
TRAINER_OUT = Path(__file__).resolve().parent / "trainer-constraints.txt"
LOCAL_OUT = Path(__file__).resolve().parent / "local-cluster-constraints.txt"
LOCAL_PYPROJECT = ROOT / "local_cluster" / "pyproject.toml"
HEADER = """\
# Exact versions of the operator image's Python dependencies (the closure of pyproject's
# [project] dependencies, as tested). The Dockerfile installs with -c this file so two
# builds of one commit get the same packages. Refresh: python deploy/images/freeze.py
"""


TRAINER_HEADER = """\
# Exact versions of the trainer image's Python dependencies (the closure of pyproject's
# [trainer] extra, as tested; local version labels such as +cpu dropped: the torch pin matches
# the +cu128 and +cpu builds, and trainer_image/Dockerfile names the build). The CUDA wheels of
# torch (nvidia-*, triton) are not listed: torch's own metadata pins them exactly.
# Refresh: python deploy/images/freeze.py
"""


LOCAL_HEADER = """\
# Exact versions of the local cluster's own Python dependencies (the closure of
# local_cluster/pyproject.toml's dependencies other than railyard, as tested). No image carries
# them (the operator image has no local cluster); the README's set-up command and CI install with
# -c this file too. Refresh: python deploy/images/freeze.py
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> dict[str, str]:
    seen: dict[str, str] = {}
    stack = [Requirement(r).name for r in roots]
    while stack:
        name = stack.pop()
        if _norm(name) in seen:
            continue
        dist = md.distribution(name)
        seen[_norm(name)] = dist.version
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is not None and not Marker(str(req.marker)).evaluate({"extra": ""}):
                continue
            stack.append(req.name)
    return seen


def trainer_closure(project: dict[str, Any]) -> dict[str, str]:
    """The [trainer] extra's closure, without local version labels (``2.13.0+cpu`` -> ``2.13.0``)."""
    pins = closure(project["optional-dependencies"]["trainer"])
    return {k: v.split("+", 1)[0] for k, v in pins.items()}


def local_cluster_closure(local_project: dict[str, Any]) -> dict[str, str]:
    """The closure of railyard-local's dependencies except railyard (pinned by the other files)."""
    return closure([r for r in local_project["dependencies"] if _norm(Requirement(r).name) != "railyard"])


def main() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = closure(project["dependencies"])
    OUT.write_text(HEADER + "".join(f"{k}=={v}\n" for k, v in sorted(pins.items())))
    print(f"wrote {OUT} ({len(pins)} packages)")
    trainer = trainer_closure(project)
    TRAINER_OUT.write_text(TRAINER_HEADER + "".join(f"{k}=={v}\n" for k, v in sorted(trainer.items())))
    print(f"wrote {TRAINER_OUT} ({len(trainer)} packages)")
    local = local_cluster_closure(tomllib.loads(LOCAL_PYPROJECT.read_text())["project"])
    LOCAL_OUT.write_text(LOCAL_HEADER + "".join(f"{k}=={v}\n" for k, v in sorted(local.items())))
    print(f"wrote {LOCAL_OUT} ({len(local)} packages)")


if __name__ == "__main__":
    main()
