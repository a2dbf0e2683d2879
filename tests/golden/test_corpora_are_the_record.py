"""The corpora under tests/golden are copies of the record in ../shared/kube-golden (beside the
clone, read-only in CI): when the record is re-recorded, the copies must follow, or the replays
compare against an old answer. Skipped where no ../shared is beside the clone."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
SHARED = HERE.parents[1].parent / "shared" / "kube-golden"
COPIES = {"v1.36": "kube-v1.36", "v1.36-workload": "kube-v1.36-workload", "v1.36-dra": "kube-v1.36-dra",
          "v1.36-disruption": "kube-v1.36-disruption", "kueue-v0.13-workload": "kueue-v0.13-workload"}


@pytest.mark.parametrize("recorded", sorted(COPIES))
def test_the_copy_is_the_record(recorded: str) -> None:
    source = SHARED / recorded
    if not source.is_dir():
        pytest.skip(f"no {source} beside the clone")
    copy = HERE / COPIES[recorded]
    differ = [f.name for f in sorted(source.iterdir())
              if f.is_file() and (not (copy / f.name).is_file() or (copy / f.name).read_bytes() != f.read_bytes())]
    assert not differ, f"{copy} differs from {source} in {differ}: copy the record again"
