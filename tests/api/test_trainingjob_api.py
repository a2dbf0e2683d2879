"""The TrainingJob API: defaults, every cross-field rule, the generated CRD, `railyard validate`."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from railyard.api.crd import build_crd, render_crd_yaml
from railyard.api.trainingjob import SPEC_RULES, TrainingJob, TrainingJobSpec
from railyard.api.validation import validate_manifest

from .openapi_check import check as openapi_check

ROOT = Path(__file__).resolve().parents[2]


def make_job(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "t"}, "spec": spec}


def test_crds_folder_is_what_railyard_crd_prints() -> None:
    on_disk = (ROOT / "crds" / "trainingjob.yaml").read_text()
    assert on_disk == render_crd_yaml(), "crds/ is out of date: run `railyard crd > crds/trainingjob.yaml`"
    chart = (ROOT / "helm" / "railyard" / "crds" / "trainingjob.yaml").read_text()
    assert chart == on_disk, "the chart's CRD differs: cp crds/trainingjob.yaml helm/railyard/crds/trainingjob.yaml"


def test_every_schema_field_has_a_description() -> None:
    missing: list[str] = []

    def walk(node: dict[str, Any], path: str, item: bool = False) -> None:
        if not item and path.count(".") > 1 and "description" not in node:
            missing.append(path)
        for key, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{key}")
        if "items" in node:
            walk(node["items"], f"{path}[]", item=True)

    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    walk(schema["properties"]["spec"], ".spec")
    walk(schema["properties"]["status"], ".status")
    assert missing == []


def test_defaults_make_a_runnable_single_process_job() -> None:
    spec = TrainingJobSpec()
    assert (spec.nodes, spec.procs_per_node, spec.world_size, spec.data_parallel) == (1, 1, 1, 1)
    assert spec.gpus == 1 and spec.microbatches == 1
    assert spec.restart_policy.application.limit < spec.restart_policy.infrastructure.limit
    assert validate_manifest(make_job()) == []


def test_data_parallel_is_derived_from_the_world_size() -> None:
    spec = TrainingJobSpec.model_validate({"nodes": 4, "procsPerNode": 8, "parallelism": {"tensor": 8, "pipeline": 2}})
    assert spec.data_parallel == 2
    assert spec.microbatches == 2


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"nodes": 2, "procsPerNode": 8, "parallelism": {"tensor": 3}}, "spec.parallelism.tensor"),
        ({"nodes": 3, "procsPerNode": 2, "parallelism": {"tensor": 1, "pipeline": 4}}, "spec.parallelism.pipeline"),
        ({"nodes": 2, "procsPerNode": 2, "parallelism": {"data": 3}}, "spec.parallelism.data"),
        ({"nodes": 2, "procsPerNode": 2, "trainer": {"batchSize": 6}}, "spec.trainer.batchSize"),
        ({"nodes": 2, "procsPerNode": 2, "trainer": {"batchSize": 4}, "parallelism": {"pipeline": 4, "microbatches": 2}}, "spec.parallelism.microbatches"),
        ({"parallelism": {"pipelineSchedule": "Interleaved1F1B"}}, "spec.parallelism.pipelineSchedule"),
        ({"trainer": {"watchdogSeconds": 120}}, "spec.trainer.watchdogSeconds"),
        ({"topology": {"mode": "Required"}}, "spec.topology.requiredLevel"),
        ({"topology": {"levels": ["a", "kubernetes.io/hostname"], "requiredLevel": "b"}}, "spec.topology.requiredLevel"),
        ({"trainer": {"dataset": {"type": "files"}}}, "spec.trainer.dataset.path"),
        ({"trainer": {"dataset": {"type": "tokens"}}}, "spec.trainer.dataset.path"),
        ({"nodes": 2, "procsPerNode": 2, "parallelism": {"dataReplicas": 3}}, "spec.parallelism.dataReplicas"),
        ({"procsPerNode": 4, "gpusPerPod": 2}, "spec.gpusPerPod"),
        ({"nodes": 2, "faultTolerance": {"mode": "ReplicaGroups"}}, "spec.faultTolerance.mode"),
        ({"nodes": 2, "parallelism": {"dataReplicas": 0}}, "spec.parallelism.dataReplicas"),
        ({"nodes": 2, "trainer": {"batchSize": 2}, "parallelism": {"dataReplicas": 2}, "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": 3}}, "spec.faultTolerance.minReplicas"),
        ({"nodes": 3, "procsPerNode": 2, "trainer": {"batchSize": 6}, "parallelism": {"dataReplicas": 2}, "faultTolerance": {"mode": "ReplicaGroups"}}, "spec.nodes"),
        ({"trainer": {"program": {"script": "t.py", "module": "pkg.t"}}}, "spec.trainer.program"),
        ({"trainer": {"program": {"args": ["--steps", "5"]}}}, "spec.trainer.program"),
        ({"gang": {"scheduler": "kubernetes", "queueName": "team-a"}}, "spec.gang.scheduler"),
        ({"gang": {"scheduler": "kubernetes", "schedulerName": "volcano"}}, "spec.gang.scheduler"),
        ({"gpusPerPod": 0, "gpuClaim": {}}, "spec.gpuClaim"),
        ({"gpuClaim": {"deviceClassName": "gpu.nvidia.com"}, "resources": {"limits": {"nvidia.com/gpu": "1"}}}, "spec.gpuClaim"),
    ],
)
def test_each_cross_field_rule_names_its_field(spec: dict[str, Any], field: str) -> None:
    problems = validate_manifest(make_job(**spec))
    assert [p.path for p in problems] == [field], problems


def test_every_rule_is_exercised_above() -> None:
    # Keeps the table above honest when a rule is added.
    assert len(SPEC_RULES) == 20


def test_a_gpu_claim_names_a_device_class() -> None:
    problems = validate_manifest(make_job(gpuClaim={"deviceClassName": "GPU_Nvidia", "computeDomain": "maybe"}))
    assert sorted(p.path for p in problems) == ["spec.gpuClaim.computeDomain", "spec.gpuClaim.deviceClassName"], problems
    assert validate_manifest(make_job(gpuClaim={"deviceClass": "gpu.nvidia.com"}))[0].message.startswith("unknown field; did you mean spec.gpuClaim.deviceClassName?")


def test_a_program_is_not_held_to_the_bundled_trainers_batch_rule() -> None:
    # batchSize is the bundled trainer's; a program of one's own chooses its own batches
    assert validate_manifest(make_job(nodes=2, procsPerNode=2, trainer={"batchSize": 6, "program": {"script": "t.py"}})) == []


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        # the trainer's sections are dataclasses holding tuples; the user wrote objects and lists
        ({"faults": 5}, "spec.trainer.faults: Input should be a valid list; fix the value"),
        ({"dataset": "tokens"}, "spec.trainer.dataset: Input should be a valid dictionary or instance of Dataset; fix the value"),
        ({"program": {"command": []}}, "spec.trainer.program.command: List should have at least 1 item after validation, not 0; fix the value"),
        # an invalid item is one problem (a tuple counts only its valid items: not also too short)
        ({"program": {"command": [""]}}, "spec.trainer.program.command[0]: String should have at least 1 character; give a non-empty value"),
    ],
)
def test_a_trainer_setting_problem_is_worded_as_the_user_wrote_it(trainer: dict[str, Any], expected: str) -> None:
    assert [str(p) for p in validate_manifest(make_job(trainer=trainer))] == [expected]


@pytest.mark.parametrize(
    "spec",
    [
        {"nodes": 2, "procsPerNode": 8, "parallelism": {"tensor": 8}, "trainer": {"batchSize": 2}},
        {"nodes": 4, "procsPerNode": 2, "parallelism": {"tensor": 2, "pipeline": 2, "data": 2, "microbatches": 4}, "trainer": {"batchSize": 8}},
        {"topology": {"mode": "Required", "requiredLevel": "railyard.dev/spine"}},
        {"procsPerNode": 4, "gpusPerPod": 0, "trainer": {"batchSize": 4}},
        {"trainer": {"dataset": {"type": "files", "path": "/data"}}},
        {"nodes": 4, "trainer": {"batchSize": 4}, "parallelism": {"dataReplicas": 4}, "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": 2}},
        {"nodes": 4, "trainer": {"batchSize": 4}, "parallelism": {"dataReplicas": 4}, "faultTolerance": {"mode": "ReplicaGroups"}},
        # the operator chooses the number of groups (logic/groups.py); minReplicas is checked against its choice
        {"nodes": 4, "trainer": {"batchSize": 4}, "parallelism": {"dataReplicas": 0}, "faultTolerance": {"mode": "ReplicaGroups", "minReplicas": 2}},
        {"nodes": 2, "procsPerNode": 4, "trainer": {"batchSize": 8}, "gpuClaim": {"deviceClassName": "gpu.nvidia.com", "computeDomain": True}},
        {"gpuClaim": {}, "resources": {"limits": {"cpu": "2"}}},
    ],
)
def test_valid_shapes_pass(spec: dict[str, Any]) -> None:
    assert validate_manifest(make_job(**spec)) == []


def test_three_problems_reported_at_once_by_the_cli(tmp_path: Path) -> None:
    bad = make_job(nodes=2, procsPerNode=8, parallelism={"tensor": 3}, trainer={"steps": -5}, unknownField=True)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    out = subprocess.run([sys.executable, "-m", "railyard", "validate", str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 1
    lines = [line for line in out.stdout.splitlines() if line.startswith("  - ")]
    assert len(lines) == 3, out.stdout
    text = "\n".join(lines)
    assert "spec.parallelism.tensor" in text and "divide procsPerNode" in text
    assert "spec.trainer.steps" in text and "greater than or equal to 1" in text
    assert "spec.unknownField: unknown field" in text


def test_examples_validate() -> None:
    files = sorted(str(p) for p in (ROOT / "examples").glob("*.yaml"))
    assert files
    out = subprocess.run([sys.executable, "-m", "railyard", "validate", *files], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_status_round_trips_and_ignores_unknown_status_fields() -> None:
    job = TrainingJob.model_validate({**make_job(), "status": {"phase": "Running", "step": 12, "restarts": {"total": 1, "sdc": 1}, "future": 1}})
    assert job.status is not None and job.status.restarts.sdc == 1
    dumped = job.model_dump(by_alias=True, exclude_none=True)
    assert dumped["status"]["restarts"]["total"] == 1 and "future" not in dumped["status"]


# ---------------------------------------------------------------- API server vs railyard validate

CASES: list[dict[str, Any]] = [
    {},
    {"nodes": 2, "procsPerNode": 8, "parallelism": {"tensor": 3}},
    {"trainer": {"steps": 0}},
    {"trainer": {"preset": "huge"}},
    {"bogus": 1},
    {"checkpoint": {"memory": {"intervalSteps": 0}}},
    {"health": {"straggler": {"threshold": 1.5}}},
    {"topology": {"mode": "Required", "requiredLevel": "railyard.dev/leaf"}},
    {"restartPolicy": {"application": {"limit": 0}}},
    {"restartPolicy": {"application": {}}},
    {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]},
    {"env": [{"name": "A", "value": "b"}, {"value": "c"}]},
]


@pytest.mark.parametrize("spec", CASES)
def test_generic_openapi_validator_agrees_with_the_models(spec: dict[str, Any]) -> None:
    manifest = make_job(**spec)
    assert bool(openapi_check(manifest, build_crd())) == bool(validate_manifest(manifest))


@settings(max_examples=60, deadline=None)
@given(
    nodes=st.integers(min_value=0, max_value=9),
    procs=st.integers(min_value=0, max_value=9),
    tensor=st.integers(min_value=0, max_value=9),
    pipeline=st.integers(min_value=1, max_value=5),
    data=st.one_of(st.none(), st.integers(min_value=1, max_value=9)),
    batch=st.integers(min_value=1, max_value=24),
    micro=st.one_of(st.none(), st.integers(min_value=1, max_value=6)),
)
def test_random_shapes_get_the_same_verdict(nodes: int, procs: int, tensor: int, pipeline: int, data: int | None, batch: int, micro: int | None) -> None:
    par: dict[str, Any] = {"tensor": tensor, "pipeline": pipeline}
    if data is not None:
        par["data"] = data
    if micro is not None:
        par["microbatches"] = micro
    manifest = make_job(nodes=nodes, procsPerNode=procs, parallelism=par, trainer={"batchSize": batch})
    assert bool(openapi_check(copy.deepcopy(manifest), build_crd())) == bool(validate_manifest(manifest))


def test_stdlib_operator_module_is_not_shadowed() -> None:
    out = subprocess.run([sys.executable, "-c", "import operator; operator.itemgetter; print(operator.__file__)"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert "railyard" not in out.stdout and "/operator/" not in out.stdout.replace("/lib/python", "")


def test_fault_tolerance_defaults_to_none_and_min_replicas_is_bounded() -> None:
    spec = TrainingJobSpec.model_validate({})
    assert (spec.fault_tolerance.mode, spec.fault_tolerance.min_replicas) == ("None", 1)
    problems = validate_manifest(make_job(faultTolerance={"mode": "Replicas", "minReplicas": 0}))
    assert {p.path for p in problems} == {"spec.faultTolerance.minReplicas", "spec.faultTolerance.mode"}, problems

