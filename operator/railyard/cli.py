"""The ``railyard`` command: one entry point, one module per subcommand (railyard/commands/)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (module under railyard.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "crd": ("crd", "print the TrainingJob CustomResourceDefinition generated from the API models"),
    "validate": ("validate", "validate TrainingJob manifests offline; every problem with its field"),
    "plan": ("plan", "show where a TrainingJob would be placed, its rank table and network cost"),
    "local": ("local", "the embedded single-machine cluster: up, down, status, node ..."),
    "operator": ("operator", "run the operator against the current kubeconfig"),
    "logs": ("logs", "print a TrainingJob's logs, every line prefixed with its pod and ranks"),
    "demo": ("demo", "run the main job with faults on the local cluster and summarise it"),
    "simulate": ("simulate", "simulate goodput of a long run on a large cluster"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="railyard",
        description="Rail-aware, failure-tolerant distributed PyTorch training on Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(f"railyard.commands.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"railyard.commands.{module_name}":
                raise
            continue  # not built in this version
        before = set(sub.choices)
        module.add_parser(sub)
        for added in set(sub.choices) - before:
            sub.choices[added].set_defaults(_run=module.run)
        if name in sub.choices and not sub.choices[name].description:
            sub.choices[name].description = help_text
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    result: int = args._run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
