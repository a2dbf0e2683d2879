"""Issue 35: an operator started (or restarted) by hand against the local cluster serves where
the cluster's pods look for it, not at the in-cluster Service name nothing resolves there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.clusters import own_namespace
from tests.operator.conftest import ROOT, Api, _die_with_parent
from tests.waiting import wait_until

from railyard.commands.operator import DEFAULT_HOST, DEFAULT_PORT, ServeAddress, choose_address
from railyard.operator_address import (
    LocalOperatorAddress,
    find_operator_address,
    publish_operator_address,
    read_operator_address,
)

LOCAL = LocalOperatorAddress("127.0.0.1", 41234, Path("/state"))


@pytest.mark.parametrize(("host", "port", "advertise", "local", "want"), [
    # not a local cluster: as before (the chart's Service; each job keeps what its pods carry)
    (None, None, None, None, ServeAddress(DEFAULT_HOST, DEFAULT_PORT, "")),
    ("127.0.0.1", 9000, "http://10.0.0.5:9000", None, ServeAddress("127.0.0.1", 9000, "http://10.0.0.5:9000")),
    # the local cluster's kubeconfig, nothing given: where its pods look
    (None, None, None, LOCAL, ServeAddress("127.0.0.1", 41234, "http://127.0.0.1:41234")),
    # a port given: that port, on the loopback the pods reach
    (None, 9000, None, LOCAL, ServeAddress("127.0.0.1", 9000, "http://127.0.0.1:9000")),
    ("0.0.0.0", None, None, LOCAL, ServeAddress("0.0.0.0", 41234, "http://127.0.0.1:41234")),
    # an address given wins; no server (port 0) has nothing to advertise
    (None, None, "http://10.0.0.5:9000", LOCAL, ServeAddress(DEFAULT_HOST, DEFAULT_PORT, "http://10.0.0.5:9000")),
    (None, 0, None, LOCAL, ServeAddress(DEFAULT_HOST, 0, "")),
])
def test_choose_address(host: str | None, port: int | None, advertise: str | None, local: LocalOperatorAddress | None, want: ServeAddress) -> None:
    got = choose_address(host=host, port=port, advertise=advertise, local=local)
    assert (got.host, got.port, got.advertise) == (want.host, want.port, want.advertise)
    assert bool(got.note) == (local is not None and advertise is None and port != 0), "the log says why"


def test_the_address_is_found_beside_the_kubeconfig_the_operator_uses(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "kubeconfig").write_text("apiVersion: v1\n")
    published = publish_operator_address(state, 41234)
    assert read_operator_address(state / "kubeconfig") == published and published.url == "http://127.0.0.1:41234"
    assert find_operator_address(str(state / "kubeconfig"), {}) == published
    assert find_operator_address(None, {"KUBECONFIG": f"{state / 'kubeconfig'}{os.pathsep}/elsewhere/config"}) == published
    assert find_operator_address(None, {"KUBECONFIG": str(tmp_path / "other" / "config")}) is None
    (state / "operator.json").write_text("{not json")
    assert read_operator_address(state / "kubeconfig") is None, "unreadable: as if not a local cluster"


# --------------------------------------------------------------------------- on the local cluster

NS = own_namespace("railyard-optest-address")

#: Posts a heartbeat with a growing step every half second to the URL the pod was given.
BEATING = r"""
import os, sys, time, urllib.request
sys.path.insert(0, sys.argv[1])
from railyard.protocol.heartbeat import HeartbeatBatch, RankBeat
url, token = os.environ["RAILYARD_HEARTBEAT_URL"], os.environ["RAILYARD_HEARTBEAT_TOKEN"]
idx, att = int(os.environ["RAILYARD_POD_INDEX"]), int(os.environ["RAILYARD_ATTEMPT"])
step = 0
while True:
    step += 1
    batch = HeartbeatBatch(job=os.environ["RAILYARD_JOB"], attempt=att, pod_index=idx, node=os.environ.get("RAILYARD_NODE_NAME", ""),
                           sent_at=time.time(), ranks=(RankBeat(rank=idx, step=step, step_time_s=0.5),))
    req = urllib.request.Request(url, data=batch.to_json().encode(), headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5).read()
    except OSError:
        pass
    time.sleep(0.5)
"""


class HandRunOperator:
    """``railyard operator run`` as a person types it: the kubeconfig and a namespace, no address."""

    def __init__(self, kubeconfig: Path, log_path: Path, url: str) -> None:
        self.log_path, self.url = log_path, url
        argv = [sys.executable, "-m", "railyard", "operator", "run", "--standalone", "--namespace", NS, "--not-ready-grace", "0.5"]
        env = dict(os.environ, KUBECONFIG=str(kubeconfig))
        self.proc = subprocess.Popen(argv, stdout=log_path.open("ab"), stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                     preexec_fn=_die_with_parent)
        wait_until(self.healthy, timeout=90, message="the hand-run operator's /healthz on the local cluster's address", retry_on=(Exception,))

    def healthy(self) -> bool:
        import urllib.request

        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.mark.cluster
def test_an_operator_restarted_by_hand_keeps_hearing_the_running_pods(local_cluster: Any, api: Api, job_name: str, tmp_path: Path) -> None:
    if local_cluster.mode == "existing":
        pytest.skip("existing mode publishes no address (its kubeconfig is not the local cluster's to write beside)")
    published = read_operator_address(Path(local_cluster.kubeconfig))
    assert published is not None, "railyard local up publishes where its pods reach the operator"
    api.ensure_namespace(NS)
    spec = {"nodes": 2, "procsPerNode": 1, "command": [sys.executable, "-c", BEATING, str(ROOT / "operator")],
            "trainer": {"batchSize": 8}, "gang": {"scheduleTimeoutSeconds": 60}}
    op = HandRunOperator(Path(local_cluster.kubeconfig), tmp_path / "op1.log", published.url)
    try:
        api.create_job(NS, job_name, spec)
        wait_until(lambda: (api.status(NS, job_name).get("step") or 0) >= 2, timeout=120, message="heartbeats moving the step", retry_on=(Exception,))
        pods = {p.metadata.name: p for p in api.pods(NS, job_name)}
        urls = {e.value for p in pods.values() for c in p.spec.containers for e in c.env or () if e.name == "RAILYARD_HEARTBEAT_URL"}
        assert urls == {f"{published.url}/v1/heartbeats/{NS}/{job_name}"}, urls
        op.kill()
        stopped_at = int(api.status(NS, job_name).get("step") or 0)
        op = HandRunOperator(Path(local_cluster.kubeconfig), tmp_path / "op2.log", published.url)
        wait_until(lambda: (api.status(NS, job_name).get("step") or 0) > stopped_at + 2, timeout=120, message="heartbeats reaching the restarted operator", retry_on=(Exception,))
        st = api.status(NS, job_name)
        assert st["phase"] == "Running" and st["attempt"] == 0, st
        assert {p.metadata.uid for p in api.pods(NS, job_name)} == {p.metadata.uid for p in pods.values()}, "the same pods"
        assert not any(c["type"] == "Blind" and c["status"] == "True" for c in st.get("conditions") or ()), st
    finally:
        op.kill()
        api.delete_job(NS, job_name)
