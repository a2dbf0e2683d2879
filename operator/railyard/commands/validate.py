"""``railyard validate FILE...``: check TrainingJob manifests offline, all problems at once."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import yaml


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("validate", help="validate TrainingJob manifests offline")
    p.add_argument("files", nargs="+", help="YAML files (several documents each allowed); - for stdin")


def run(args: argparse.Namespace) -> int:
    from railyard.api.trainingjob import KIND
    from railyard.api.validation import validate_manifest

    failed = False
    checked = 0
    for path in args.files:
        try:
            if path == "-":
                text = sys.stdin.read()
            else:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except (OSError, yaml.YAMLError) as exc:
            print(f"{path}: cannot read: {exc}", file=sys.stderr)
            failed = True
            continue
        for index, doc in enumerate(docs):
            if isinstance(doc, dict) and doc.get("kind") not in (None, KIND):
                continue  # other kinds in the same file (Namespace, PVC, ...) are not ours to check
            checked += 1
            name = (
                (doc.get("metadata") or {}).get("name", f"document {index}")
                if isinstance(doc, dict)
                else f"document {index}"
            )
            problems = validate_manifest(doc)
            if problems:
                failed = True
                print(f"{path}: TrainingJob {name}: {len(problems)} problem(s)")
                for problem in problems:
                    print(f"  - {problem}")
            else:
                print(f"{path}: TrainingJob {name}: valid")
    if checked == 0 and not failed:
        print("no TrainingJob found in the given files", file=sys.stderr)
        return 1
    return 1 if failed else 0
