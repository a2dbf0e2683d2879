"""Subcommands of the ``railyard`` CLI, one module each, imported only when used.

Each module exposes ``add_parser(subparsers) -> None`` and ``run(args) -> int``.
"""
