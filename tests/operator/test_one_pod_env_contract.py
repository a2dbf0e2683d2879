"""The pod environment is one typed contract (railyard.protocol.podenv): what the operator
writes is declared there, and each value reads back with the type the trainer reads it as."""

from __future__ import annotations

import pytest

from railyard.api.trainingjob import TrainingJobSpec
from railyard.logic.manifests import build_gang_pods, build_trainer_config
from railyard.protocol import podenv
from railyard.protocol.trainerconfig import RESTART_WAIT_FLOOR_SECONDS
from railyard_trainer.config import ConfigError, TrainerConfig

DECLARED = {v.name: v for v in vars(podenv).values() if isinstance(v, podenv.EnvVar)}


def _env(spec: dict[str, object], pod: int = 1) -> list[dict[str, object]]:
    pods = build_gang_pods(
        TrainingJobSpec.model_validate({"nodes": 2, "procsPerNode": 2, **spec}), job="llm", namespace="ml",
        owner={"apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob", "name": "llm", "uid": "u-1", "controller": True},
        attempt=3, nodes=["n-a", "n-b"], heartbeat_url="http://op:8080/v1/heartbeats/ml/llm",
    )
    env: list[dict[str, object]] = pods[pod]["spec"]["containers"][0]["env"]
    return env


@pytest.mark.parametrize("spec", [{}, {"parallelism": {"dataReplicas": 2}, "faultTolerance": {"mode": "ReplicaGroups"}}], ids=["gang", "replica-groups"])
def test_every_railyard_variable_the_operator_writes_is_declared_and_reads_back(spec: dict[str, object]) -> None:
    written = [e for e in _env(spec) if str(e["name"]).startswith(("RAILYARD_", "TORCHFT_")) or e["name"] in ("MASTER_ADDR", "MASTER_PORT")]
    assert written
    values = {str(e["name"]): str(e["value"]) for e in written if "value" in e}
    for e in written:
        assert e["name"] in DECLARED, f"{e['name']}: declare it in railyard.protocol.podenv"
    # each literal value parses as the type the trainer reads it with
    read = {name: DECLARED[name].get(values) for name in values}  # type: ignore[attr-defined]
    assert read["RAILYARD_POD_INDEX"] == 1 and read["RAILYARD_ATTEMPT"] == 3
    assert isinstance(read["MASTER_PORT"], int)
    if spec:
        assert read["RAILYARD_REPLICA_GROUP"] == 1 and str(read["TORCHFT_LIGHTHOUSE"]).startswith("http://")


def test_the_launchers_restart_wait_travels_in_config_json_not_the_environment() -> None:
    def wait(timeout: float) -> float:
        spec = TrainingJobSpec.model_validate({"restartPolicy": {"inPlaceTimeoutSeconds": timeout}})
        return TrainerConfig.from_dict(build_trainer_config(spec, job="j", namespace="n", attempt=0)).restart_wait_seconds

    assert wait(10) == RESTART_WAIT_FLOOR_SECONDS == TrainerConfig.from_dict({}).restart_wait_seconds
    assert wait(120) == 240.0
    assert not any("RESTART_WAIT" in str(e["name"]) for e in _env({}))
    with pytest.raises(ConfigError, match=r"restartWaitSeconds: -1\.0 is below the minimum 0"):
        TrainerConfig.from_dict({"restartWaitSeconds": -1})


@pytest.mark.parametrize(
    ("var", "raw", "want"),
    [
        (podenv.POD_INDEX, "", None),
        (podenv.POD_INDEX, " 4 ", 4),
        (podenv.FAIL_GRACE_S, "", 5.0),
        (podenv.FAIL_GRACE_S, "0.5", 0.5),
        (podenv.WORKER_ZYGOTE, "", True),
        (podenv.WORKER_ZYGOTE, "0", False),
        (podenv.WORKER_ZYGOTE, "yes", True),
        (podenv.PLAIN_CHECKPOINT, "", False),
        (podenv.PLAIN_CHECKPOINT, "1", True),
        (podenv.PLAIN_CHECKPOINT, "true", False),
        (podenv.MESH_SHAPE, "2,4,1", (2, 4, 1)),
        (podenv.MESH_SHAPE, "", None),
        (podenv.CHECKPOINT_CPU, "", "auto"),
    ],
)
def test_parsing(var: podenv.EnvVar, raw: str, want: object) -> None:
    assert var.get({var.name: raw}) == want  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("var", "raw", "expected"),
    [
        (podenv.POD_INDEX, "one", "a whole number >= 0"),
        (podenv.POD_INDEX, "-1", "a whole number >= 0"),
        (podenv.RENDEZVOUS_WAIT_S, "soon", "a number of seconds >= 0"),
        (podenv.RENDEZVOUS_WAIT_S, "nan", "a number of seconds >= 0"),
        (podenv.MESH_COORDS, "1,2", "'pp,dp,tp'"),
    ],
)
def test_a_value_that_does_not_parse_names_the_variable_and_what_it_expects(var: podenv.EnvVar, raw: str, expected: str) -> None:
    with pytest.raises(podenv.PodEnvError, match=f"^{var.name}: expected {expected}"):
        var.get({var.name: raw})  # type: ignore[attr-defined]


def test_names_are_declared_once() -> None:
    names = [v.name for v in vars(podenv).values() if isinstance(v, podenv.EnvVar)]
    assert len(names) == len(set(names))
