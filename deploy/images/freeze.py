"""Write deploy/images/operator-constraints.txt: the installed versions of the operator's
dependency closure (pyproject's [project] dependencies), for reproducible image builds.

Run from the repository's virtualenv: ``python deploy/images/freeze.py``.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "operator-constraints.txt"
HEADER = """\
# Exact versions of the operator image's Python dependencies (the closure of pyproject's
# [project] dependencies, as tested). The Dockerfile installs with -c this file so two
# builds of one commit get the same packages. Refresh: python deploy/images/freeze.py
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


def main() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = closure(project["dependencies"])
    OUT.write_text(HEADER + "".join(f"{k}=={v}\n" for k, v in sorted(pins.items())))
    print(f"wrote {OUT} ({len(pins)} packages)")


if __name__ == "__main__":
    main()
