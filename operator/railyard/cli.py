"""The ``railyard`` command."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("railyard: skeleton", file=sys.stderr)
    return 0
