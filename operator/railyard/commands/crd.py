"""``railyard crd``: print the CRD generated from the API models (crds/ is this output)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("crd", help="print the TrainingJob CRD (YAML)")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")


def run(args: argparse.Namespace) -> int:
    from railyard.api.crd import render_crd_yaml

    text = render_crd_yaml()
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    return 0
