"""Subcommands of the ``railyard`` CLI, one module each, imported only when used.

Each module exposes ``add_parser(subparsers) -> None`` and ``run(args) -> int``.
"""

from __future__ import annotations

import importlib.util

#: How to get the local cluster, which is its own distribution (railyard-local, local_cluster/).
INSTALL_LOCAL_CLUSTER = "pip install -e ./local_cluster"


def missing_local_cluster(command: str) -> str | None:
    """None when the local cluster (package railyard_local) is importable; else the error
    ``railyard <command>`` prints. ``railyard demo`` and ``railyard local`` need it; the operator
    never does, and its image does not carry it."""
    if importlib.util.find_spec("railyard_local") is not None:
        return None
    return (f"railyard {command}: needs the local cluster (package railyard_local, distribution railyard-local), "
            f"which is not installed: from the repository's root run `{INSTALL_LOCAL_CLUSTER}` "
            "(the README's set-up command installs it beside railyard)")
