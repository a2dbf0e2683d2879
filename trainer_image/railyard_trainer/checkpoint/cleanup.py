"""``python -m railyard_trainer.checkpoint.cleanup --job NAME``: delete a job's checkpoints.

Run by the operator when a TrainingJob with ``checkpoint.cleanupOnDelete: true`` is deleted:
once with the shared volume mounted (shared tier), and once per node that ran the job with the
node's memory and local host paths mounted (a Job per node, or a DaemonSet pod). Tier roots come
from the same RAILYARD_CHECKPOINT_*_DIR variables as the trainer's. torch-free.
"""

from __future__ import annotations

import argparse
import os
import sys

from railyard_trainer.checkpoint.settings import ENV_DIRS
from railyard_trainer.checkpoint.storage import delete_job_checkpoints


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--job", required=True, help="TrainingJob name (the directory under each tier root)")
    args = p.parse_args(argv)
    roots = {tier: var.get(os.environ) for tier, var in ENV_DIRS.items()}
    for path in delete_job_checkpoints(roots, args.job):
        print(f"removed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
