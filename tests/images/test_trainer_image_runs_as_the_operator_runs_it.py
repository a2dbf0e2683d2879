"""The trainer image, run as the operator runs it: the pod and ConfigMap come from the operator's
own builders (placement, rank table, config.json, env, user, capabilities, checkpoint mounts),
the init container hands the kubelet-made (root-owned) checkpoint folders to the trainer's user
with CAP_CHOWN only, then ``railyard-train`` trains a 2-rank tiny job (FSDP over gloo) and writes
checkpoints into those folders."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from tests.operator.builders import make_node

from .conftest import Images
from .podspec import Given, docker_run_args

STEPS = 4


def build_gang() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(pod, configmap, job) exactly as the operator's reconcile builds them for one node, for a
    job of the default trainer image (the build under test runs in its place, as it would once
    tagged with that name: docs/deploy.md)."""
    from railyard.api.trainingjob import TrainingJob
    from railyard.logic.manifests import (
        build_configmap,
        build_gang_pods,
        build_trainer_config,
        owner_reference,
        with_addresses,
    )
    from railyard.logic.placement import Placement, build_placement_input, plan_placement

    body = {
        "apiVersion": "railyard.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "tiny", "namespace": "ml", "uid": str(uuid.uuid4())},
        "spec": {
            "nodes": 1, "procsPerNode": 2, "gpusPerPod": 0,
            "parallelism": {"tensor": 1},  # data (FSDP) = 2
            "trainer": {"preset": "tiny", "steps": STEPS, "batchSize": 4, "seqLen": 32},
            "checkpoint": {"memory": {"intervalSteps": 2}, "local": {"intervalSteps": 2}, "shared": {"intervalSteps": 4}},
            "health": {"heartbeatIntervalSeconds": 1},
        },
    }
    job = TrainingJob.model_validate(body)
    node = make_node("node-0", gpus=0)
    result = plan_placement(build_placement_input(job, nodes=[node], attempt=0))
    assert isinstance(result, Placement), result
    table = with_addresses(result.rank_table, "ml")
    config = build_trainer_config(job.spec, job="tiny", namespace="ml", attempt=0)
    owner = owner_reference(body)
    cm = build_configmap("tiny", "ml", owner, attempt=0, rank_table=table, config=config)
    [pod] = build_gang_pods(job.spec, job="tiny", namespace="ml", owner=owner, attempt=0, nodes=result.nodes,
                            heartbeat_url="http://127.0.0.1:9/v1/heartbeats/ml/tiny")
    return pod, cm, body


def test_trainer_image_trains_a_2_rank_job_as_the_operator_runs_it(images: Images, tmp_path: Path) -> None:
    from railyard.api.trainingjob import DEFAULT_IMAGE

    pod, cm, _ = build_gang()
    spec = pod["spec"]
    [init] = spec["initContainers"]
    [trainer] = spec["containers"]
    assert trainer["image"] == init["image"] == DEFAULT_IMAGE

    config_dir = tmp_path / "railyard-config"  # the ConfigMap volume
    config_dir.mkdir()
    for key, value in cm["data"].items():
        (config_dir / key).write_text(value)
    volumes: dict[str, Path] = {}
    for v in spec["volumes"]:
        if "configMap" in v:
            volumes[v["name"]] = config_dir
        elif "hostPath" in v:
            folder = tmp_path / "host" / v["name"]
            folder.mkdir(parents=True)  # DirectoryOrCreate: the kubelet makes it, root-owned, 0755
            folder.chmod(0o755)
            volumes[v["name"]] = folder
    termination_log = tmp_path / "termination-log"  # the kubelet's file: empty, writable by the container
    termination_log.touch(mode=0o666)
    termination_log.chmod(0o666)
    given = Given(termination_log=termination_log, pod_name=pod["metadata"]["name"], node_name="node-0", namespace="ml",
                  secrets={("tiny-heartbeat", "token"): "hb-token"}, volumes=volumes,
                  # no cluster DNS and no pod network here: one pod, its ranks on loopback
                  extra_env={"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"})

    images.run("run", "--rm", "--network", "none", *docker_run_args(spec, init, images.trainer, given))
    for folder in volumes.values():
        if folder != config_dir:
            assert folder.stat().st_uid == 10001, f"{folder} not handed to the trainer's user"

    name = f"railyard-trainer-{uuid.uuid4().hex[:6]}"
    out = images.run("run", "--name", name, "--network", "none", *docker_run_args(spec, trainer, images.trainer, given),
                     timeout=600, check=False)
    logs = out.stdout + out.stderr
    try:
        assert out.returncode == 0, f"railyard-train exited {out.returncode}:\n{logs[-6000:]}"
        state = json.loads(images.run("inspect", name).stdout)[0]["State"]
        assert state["OOMKilled"] is False
    finally:
        images.run("rm", "-f", name, check=False)

    # both ranks trained to the last step, with nothing degraded (JSON event lines on stdout)
    events = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    done = {e["rank"]: e["step"] for e in events if e.get("event") == "done"}
    assert done == {0: STEPS, 1: STEPS}, logs[-4000:]
    assert [e for e in events if e.get("event") == "fallback"] == [], logs[-4000:]
    # checkpoints landed in the mounted folders, owned by the trainer's user
    shared = volumes["ckpt-shared"]
    written = [p for p in shared.rglob("*") if p.is_file()]
    assert written, f"nothing written to the shared checkpoint folder:\n{logs[-4000:]}"
    assert {p.stat().st_uid for p in written} == {10001}
    # a clean exit leaves no termination message (the launcher writes one only when it fails)
    assert termination_log.read_text() == ""


def test_the_trainer_image_has_what_the_operators_pods_run(images: Images) -> None:
    """Every command the operator puts in pods of the default image exists in it; the user is
    the one the operator runs it as; its home is that user's; torch is the pinned build; none of
    the operator's stack came along."""
    from railyard.logic.manifests import CLEANUP_COMMAND, DEFAULT_COMMAND, TRAINER_UID

    pod, _, _ = build_gang()
    commands = {c["command"][0] for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]}
    commands |= {DEFAULT_COMMAND[0], CLEANUP_COMMAND[0]}
    config = json.loads(images.run("image", "inspect", images.trainer).stdout)[0]["Config"]
    assert config["User"] == f"{TRAINER_UID}:{TRAINER_UID}"
    assert config["Entrypoint"] == ["railyard-train"]
    probe = (
        "import importlib.util as u, json, os, shutil, sys, torch\n"
        "home = os.path.expanduser('~')\n"
        "print(json.dumps({'missing': [c for c in sys.argv[1:] if not shutil.which(c)],\n"
        "  'home': home, 'home_owner': os.stat(home).st_uid, 'cwd_writable': os.access(os.getcwd(), os.W_OK),\n"
        "  'torch': torch.__version__, 'cuda': torch.version.cuda,\n"
        "  'operator_stack': [m for m in ('kopf', 'kubernetes', 'pydantic', 'aiohttp') if u.find_spec(m)]}))"
    )
    out = images.run("run", "--rm", "--entrypoint", "python", images.trainer, "-c", probe, *sorted(commands))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["missing"] == [], f"commands the operator's pods run are not in the image: {got['missing']}"
    assert got["home"] == "/home/railyard" and got["home_owner"] == TRAINER_UID and got["cwd_writable"]
    assert got["torch"].startswith("2.13.0") and got["operator_stack"] == []
