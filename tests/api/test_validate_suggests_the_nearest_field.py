"""`railyard validate` names the field most likely meant for an unknown one (the CRD's strict
decoding stays as it is): a misspelling, a snake_case spelling, or another tool's name for it
(`gpus:` for `gpusPerPod`), at the path where it was written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from railyard.api.validation import FIELD_ALIASES, known_fields, nearest_field, validate_manifest

from .test_trainingjob_api import make_job


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"gpus": 2}, "spec.gpus: unknown field; did you mean spec.gpusPerPod?"),
        ({"nproc_per_node": 2}, "spec.nproc_per_node: unknown field; did you mean spec.procsPerNode?"),
        ({"gpus_per_pod": 1}, "spec.gpus_per_pod: unknown field; did you mean spec.gpusPerPod?"),
        ({"procsPerNOde": 2}, "spec.procsPerNOde: unknown field; did you mean spec.procsPerNode?"),
        ({"trainer": {"stpes": 3}}, "spec.trainer.stpes: unknown field; did you mean spec.trainer.steps?"),
        ({"trainer": {"dataset": {"paht": "/d"}}}, "spec.trainer.dataset.paht: unknown field; did you mean spec.trainer.dataset.path?"),
        ({"tolerations": [{"key": "a", "efect": "NoSchedule"}]}, "spec.tolerations[0].efect: unknown field; did you mean spec.tolerations[0].effect?"),
        # nothing near: where to look the fields up, at that path
        ({"trainer": {"zzz": 1}}, "spec.trainer.zzz: unknown field; remove it, or check its spelling against `kubectl explain trainingjob.spec.trainer`"),
        ({"tolerations": [{"key": "a", "qqqq": 1}]}, "spec.tolerations[0].qqqq: unknown field; remove it, or check its spelling against `kubectl explain trainingjob.spec.tolerations`"),
    ],
)
def test_an_unknown_field_names_the_nearest_known_one(spec: dict[str, Any], expected: str) -> None:
    assert [str(p) for p in validate_manifest(make_job(**spec))] == [expected]


def test_an_alias_is_used_only_where_its_target_exists() -> None:
    assert nearest_field("gpus", known_fields(("spec",))) == "gpusPerPod"
    assert nearest_field("gpus", known_fields(("spec", "trainer"))) is None  # no gpusPerPod there
    assert known_fields(("spec", "nodeSelector")) == []  # a free-form map: nothing to suggest


def test_every_alias_points_at_a_spec_field() -> None:
    spec = set(known_fields(("spec",)))
    assert {target for target in FIELD_ALIASES.values()} <= spec
    assert not set(FIELD_ALIASES) & spec, "an alias may not shadow a real field"


def test_the_cli_prints_the_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(make_job(gpus=1)))
    out = subprocess.run([sys.executable, "-m", "railyard", "validate", str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 1
    assert "  - spec.gpus: unknown field; did you mean spec.gpusPerPod?" in out.stdout.splitlines(), out.stdout
