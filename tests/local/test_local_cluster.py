"""The local cluster end to end: nodes, scheduling, pods as processes, node failures, restarts.

Runs against the session's ``local_cluster`` (embedded by default; envtest or an existing
cluster when KUBEBUILDER_ASSETS / RAILYARD_TEST_KUBECONFIG are set).
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from tests.waiting import wait_until

from railyard.commands import local as local_cmd
from railyard.protocol.device import read_device
from railyard_local.agent import SIMULATE_ANNOTATION

from .builders import make_pod
from .conftest import wait_phase

pytestmark = pytest.mark.cluster
PY = sys.executable


def py(code: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(code)]


def cli(local_cluster: Any, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    local_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["local", "--state-dir", str(local_cluster.state_dir), *argv])
    return local_cmd.run(args)


def embedded_only(local_cluster: Any) -> None:
    if local_cluster.mode != "embedded":
        pytest.skip("needs the embedded server (pods/log from the agent's files, restarts)")


def test_nodes_are_ready_with_capacity_and_topology_labels(local_cluster: Any, core: k8s.CoreV1Api,
                                                           node_names: list[str]) -> None:
    ours = ",".join(f"{k}={v}" for k, v in {"local.railyard.dev/simulated": "true", **local_cluster.node_selector}.items())
    nodes = {n.metadata.name: n for n in core.list_node(label_selector=ours).items}
    assert sorted(nodes) == node_names
    first_ip = ipaddress.IPv4Address(local_cluster.node_specs[0].ip)
    for i, name in enumerate(node_names):
        node = nodes[name]
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True"
        assert node.status.allocatable["nvidia.com/gpu"] == "2"
        assert {"type": "InternalIP", "address": str(first_ip + i)} in [a.to_dict() for a in node.status.addresses]
        labels = node.metadata.labels
        assert labels["kubernetes.io/hostname"] == name
        assert labels["railyard.dev/spine"] == "spine-0"
        assert labels["network.topology.nvidia.com/leaf"] == labels["railyard.dev/leaf"]
    assert [nodes[name].metadata.labels["railyard.dev/leaf"] for name in node_names] == ["leaf-0", "leaf-0", "leaf-1"]
    if local_cluster.mode != "existing":  # on a given server the names and addresses are this run's (tests/clusters.py)
        assert node_names == ["node-0", "node-1", "node-2"] and str(first_ip) == "127.0.0.10"


def test_node_leases_are_renewed(local_cluster: Any, api_client: k8s.ApiClient, node_names: list[str]) -> None:
    coord = k8s.CoordinationV1Api(api_client)
    first = coord.read_namespaced_lease(node_names[0], "kube-node-lease").spec.renew_time
    wait_until(lambda: coord.read_namespaced_lease(node_names[0], "kube-node-lease").spec.renew_time > first, timeout=60, message="lease renewal")


def test_a_command_succeeds_and_a_failing_one_reports_its_exit_code(core: k8s.CoreV1Api, namespace: str,
                                                                    node_names: list[str]) -> None:
    core.create_namespaced_pod(namespace, make_pod("ok").command(*py("print('hello')")).obj())
    core.create_namespaced_pod(namespace, make_pod("bad").command(*py("import sys; sys.exit(3)")).obj())
    ok = wait_phase(core, namespace, "ok", ("Succeeded", "Failed"))
    bad = wait_phase(core, namespace, "bad", ("Succeeded", "Failed"))
    assert ok.status.phase == "Succeeded"
    assert ok.status.container_statuses[0].state.terminated.exit_code == 0
    assert ok.status.container_statuses[0].state.terminated.reason == "Completed"
    assert ok.spec.node_name in node_names
    assert ok.status.pod_ip == ok.status.host_ip and ok.status.pod_ip.startswith("127.")
    assert bad.status.phase == "Failed"
    assert bad.status.container_statuses[0].state.terminated.exit_code == 3
    conditions = {c.type: c.status for c in ok.status.conditions}
    assert conditions["PodScheduled"] == "True" and conditions["Initialized"] == "True"


def test_on_failure_restarts_until_success(core: k8s.CoreV1Api, namespace: str) -> None:
    pod = make_pod("flaky").command(*py("""
        import os, sys
        n = int(open('count').read()) if os.path.exists('count') else 0
        open('count', 'w').write(str(n + 1))
        sys.exit(0 if n >= 1 else 1)
    """)).obj()
    pod["spec"]["restartPolicy"] = "OnFailure"
    # count lives in an emptyDir-backed working dir shared across restarts
    pod["spec"]["volumes"] = [{"name": "work", "emptyDir": {}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "work", "mountPath": "/work"}]
    pod["spec"]["containers"][0]["workingDir"] = "/work"
    core.create_namespaced_pod(namespace, pod)
    done = wait_phase(core, namespace, "flaky", ("Succeeded", "Failed"), timeout=40)
    assert done.status.phase == "Succeeded"
    assert done.status.container_statuses[0].restart_count == 1
    assert done.status.container_statuses[0].last_state.terminated.exit_code == 1


def test_a_gated_pod_is_never_bound_until_ungated(core: k8s.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, make_pod("gated").gate().command(*py("pass")).obj())
    core.create_namespaced_pod(namespace, make_pod("canary").command(*py("pass")).obj())
    # the canary is scheduled after the gated pod was seen: a bound canary means the scheduler ran
    wait_until(lambda: core.read_namespaced_pod("canary", namespace).spec.node_name, timeout=60, message="canary bound")
    assert core.read_namespaced_pod("gated", namespace).spec.node_name is None
    core.patch_namespaced_pod("gated", namespace, {"spec": {"schedulingGates": None}})
    done = wait_phase(core, namespace, "gated", ("Succeeded",), timeout=30)
    assert done.spec.node_name


def test_gpu_capacity_is_respected_and_freed(core: k8s.CoreV1Api, namespace: str) -> None:
    # 3 nodes x 2 GPUs: six 1-GPU pods fit, the seventh waits until one goes away
    for i in range(7):
        core.create_namespaced_pod(namespace, make_pod(f"g{i}").gpus(1).command("sleep", "60").obj())
    wait_until(lambda: sum(1 for p in core.list_namespaced_pod(namespace).items if p.spec.node_name) == 6, timeout=30, message="six bound")

    def unschedulable() -> Any:
        pending = [p for p in core.list_namespaced_pod(namespace).items if not p.spec.node_name]
        if len(pending) != 1:
            return None
        conds = {c.type: c for c in pending[0].status.conditions or []}
        cond = conds.get("PodScheduled")
        return pending[0] if cond is not None and cond.reason == "Unschedulable" else None

    waiting = wait_until(unschedulable, timeout=60, message="an unschedulable pod")
    msg = next(c.message for c in waiting.status.conditions if c.type == "PodScheduled")
    assert "Insufficient nvidia.com/gpu" in msg
    wait_until(lambda: any(e.reason == "FailedScheduling" and e.involved_object.name == waiting.metadata.name
                    for e in core.list_namespaced_event(namespace).items),
               timeout=10,
               message="a FailedScheduling event")
    per_node: dict[str, int] = {}
    for p in core.list_namespaced_pod(namespace).items:
        if p.spec.node_name:
            per_node[p.spec.node_name] = per_node.get(p.spec.node_name, 0) + 1
    assert max(per_node.values()) == 2
    victim = next(p.metadata.name for p in core.list_namespaced_pod(namespace).items if p.spec.node_name)
    core.delete_namespaced_pod(victim, namespace, grace_period_seconds=1)
    wait_until(lambda: core.read_namespaced_pod(waiting.metadata.name, namespace).spec.node_name, timeout=30, message="the waiting pod bound")


def test_env_downward_api_value_from_and_volumes(local_cluster: Any, core: k8s.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "cfg"}, "data": {"mode": "fast", "conf.txt": "lr=0.1"}})
    core.create_namespaced_secret(namespace, {"metadata": {"name": "sec"}, "data": {"token": base64.b64encode(b"s3cret").decode()}})
    pod = make_pod("envy").command(*py("""
        import json, os
        keys = ['POD', 'NS', 'UID', 'NODE', 'IP', 'HOST', 'MODE', 'TOKEN', 'ROLE', 'CPU_M', 'CFG_PATH', 'KUBECONFIG']
        out = {k: os.environ.get(k) for k in keys}
        out['conf'] = open(os.environ['CFG_PATH'] + '/conf.txt').read()
        out['secret_file'] = open('/etc/sec/token'.replace('/etc/sec', os.environ['SEC_DIR'])).read()
        open(os.environ['SCRATCH'] + '/x', 'w').write('scratch ok')
        out['scratch'] = open(os.environ['SCRATCH'] + '/x').read()
        print(json.dumps(out))
    """)).env(
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
        {"name": "CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
        {"name": "CFG_PATH", "value": "/etc/cfg"},
        {"name": "SEC_DIR", "value": "/etc/sec"},
        {"name": "SCRATCH", "value": "/scratch"},
    ).requests(cpu="250m").obj()
    pod["metadata"]["labels"]["role"] = "worker"
    pod["spec"]["volumes"] = [
        {"name": "cfg", "configMap": {"name": "cfg"}},
        {"name": "sec", "secret": {"secretName": "sec"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "cfg", "mountPath": "/etc/cfg"},
        {"name": "sec", "mountPath": "/etc/sec"},
        {"name": "scratch", "mountPath": "/scratch"},
    ]
    created = core.create_namespaced_pod(namespace, pod)
    done = wait_phase(core, namespace, "envy", ("Succeeded", "Failed"))
    assert done.status.phase == "Succeeded", done.status
    log = _log(local_cluster, core, namespace, "envy", done)
    import json

    out = json.loads(log.strip().splitlines()[-1])
    assert out["POD"] == "envy" and out["NS"] == namespace and out["UID"] == created.metadata.uid
    assert out["NODE"] == done.spec.node_name and out["IP"] == done.status.pod_ip == out["HOST"]
    assert (out["MODE"], out["TOKEN"], out["ROLE"], out["CPU_M"]) == ("fast", "s3cret", "worker", "250")
    assert out["CFG_PATH"].startswith(str(local_cluster.state_dir))  # mount path rewritten
    assert out["KUBECONFIG"] == str(local_cluster.kubeconfig)
    assert (out["conf"], out["secret_file"], out["scratch"]) == ("lr=0.1", "s3cret", "scratch ok")


def _log(local_cluster: Any, core: k8s.CoreV1Api, ns: str, name: str, pod: Any) -> str:
    if local_cluster.mode == "embedded":
        return str(core.read_namespaced_pod_log(name, ns))
    # a real API server proxies logs to a kubelet we do not have: read the agent's file
    return (Path(local_cluster.log_dir) / ns / name / "main.log").read_text()


def test_kubectl_logs(local_cluster: Any, core: k8s.CoreV1Api, namespace: str) -> None:
    # embedded: the server reads the agent's files; envtest: kube-apiserver asks the node agent's
    # kubelet endpoint with the client certificate envtest mode gives it
    if local_cluster.mode == "existing":
        pytest.skip("an existing cluster's API server may not reach the node agent's loopback addresses")
    core.create_namespaced_pod(namespace, make_pod("talker").command(*py("print('line one'); print('line two')")).obj())
    wait_phase(core, namespace, "talker", ("Succeeded",))
    out = subprocess.run(
        [str(Path(PY).parent / "kubectl"), "--kubeconfig", str(local_cluster.kubeconfig), "-n", namespace, "logs", "talker"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["line one", "line two"]


def test_the_node_agent_serves_container_logs_where_an_api_server_reads_them(local_cluster: Any, core: k8s.CoreV1Api, namespace: str, tmp_path: Path) -> None:
    """kube-apiserver reads `kubectl logs` from https://<InternalIP>:<kubeletEndpoint.Port>/
    containerLogs/<ns>/<pod>/<container> of the pod's node, showing its kubelet client
    certificate and not checking the serving one (its defaults): the node agent answers there."""
    import ssl
    import urllib.error
    import urllib.request

    from railyard_local.apiserver.pki import issue_cert

    client_ca = local_cluster.kubelet_client_ca()
    if client_ca is None or not (client_ca.parent / "ca.key").exists():
        pytest.skip("the kubelet client CA is the existing cluster's: no certificate of it to test with")
    core.create_namespaced_pod(namespace, make_pod("kubelet-talker").command(*py("print('via the kubelet'); print('two')")).obj())
    done = wait_phase(core, namespace, "kubelet-talker", ("Succeeded",))
    node = core.read_node(done.spec.node_name)
    assert [a.type for a in node.status.addresses] == ["InternalIP"], "no Hostname: the API server would dial it first"
    ip, port = node.status.addresses[0].address, node.status.daemon_endpoints.kubelet_endpoint.port
    assert port > 0
    url = f"https://{ip}:{port}/containerLogs/{namespace}/kubelet-talker/main?tailLines=1"

    def context(with_cert: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # as kube-apiserver by default
        if with_cert:
            ctx.load_cert_chain(*issue_cert(client_ca.parent, "client", common_name="test", client=True, out_dir=tmp_path))
        return ctx

    with urllib.request.urlopen(url, context=context(True), timeout=30) as resp:
        assert resp.read() == b"two\n"
    with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
        urllib.request.urlopen(url, context=context(False), timeout=30).read()


def test_graceful_delete_sends_sigterm_and_keeps_host_path(local_cluster: Any, core: k8s.CoreV1Api, namespace: str) -> None:
    pod = make_pod("graceful").command(*py("""
        import os, signal, sys, time
        def stop(*_):
            open(os.path.join(os.environ['DATA'], 'stopped'), 'w').write('sigterm')
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        open(os.path.join(os.environ['DATA'], 'started'), 'w').write('yes')
        while True:
            time.sleep(0.05)
    """)).env({"name": "DATA", "value": "/dev/shm/railyard-test"}).obj()
    pod["spec"]["terminationGracePeriodSeconds"] = 10
    pod["spec"]["volumes"] = [{"name": "shm", "hostPath": {"path": f"/dev/shm/railyard-test/{namespace}", "type": "DirectoryOrCreate"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm/railyard-test"}]
    core.create_namespaced_pod(namespace, pod)
    running = wait_phase(core, namespace, "graceful", ("Running",))
    host_dir = Path(local_cluster.state_dir) / "nodes" / running.spec.node_name / "hostpath" / "dev/shm/railyard-test" / namespace
    wait_until(lambda: (host_dir / "started").exists(), timeout=60, message="the process to start")
    core.delete_namespaced_pod("graceful", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("graceful", namespace)
        except k8s.ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, timeout=60, message="the pod to be removed")
    assert (host_dir / "stopped").read_text() == "sigterm"


def test_sigkill_after_the_grace_period(local_cluster: Any, core: k8s.CoreV1Api, namespace: str) -> None:
    pod = make_pod("stubborn").command(*py("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('armed', flush=True)
        while True:
            time.sleep(0.05)
    """)).obj()
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    core.create_namespaced_pod(namespace, pod)
    wait_phase(core, namespace, "stubborn", ("Running",))
    log = Path(local_cluster.log_dir) / namespace / "stubborn" / "main.log"
    wait_until(lambda: log.exists() and "armed" in log.read_text(), timeout=60, message="the SIGTERM handler installed")
    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("stubborn", namespace)
        except k8s.ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, timeout=60, message="the pod to be removed")
    assert time.monotonic() - started >= 0.9  # it waited the grace period before SIGKILL


def test_pod_dns_names_resolve_through_the_hosts_file(local_cluster: Any, core: k8s.CoreV1Api, namespace: str) -> None:
    first, second = local_cluster.node_specs[:2]
    server = make_pod("srv-0").command(*py("""
        import os, socket
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((os.environ['POD_IP'], 45123)); s.listen(1)
        c, _ = s.accept(); c.sendall(b'hi from ' + os.environ['POD_IP'].encode()); c.close()
    """)).env({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}).node_selector(**{"kubernetes.io/hostname": first.name}).obj()
    server["spec"].update({"hostname": "srv-0", "subdomain": "srv"})
    client_pod = make_pod("cli").command(*py(f"""
        import socket, time
        for _ in range(100):
            try:
                c = socket.create_connection(('srv-0.srv.{namespace}.svc.cluster.local', 45123), timeout=2); break
            except OSError:
                time.sleep(0.1)
        print(c.recv(100).decode())
    """)).node_selector(**{"kubernetes.io/hostname": second.name}).obj()
    core.create_namespaced_pod(namespace, server)
    wait_phase(core, namespace, "srv-0", ("Running",))
    core.create_namespaced_pod(namespace, client_pod)
    done = wait_phase(core, namespace, "cli", ("Succeeded", "Failed"))
    assert done.status.phase == "Succeeded"
    assert wait_phase(core, namespace, "srv-0", ("Succeeded",)).status.pod_ip == first.ip


def test_node_fail_and_recover(local_cluster: Any, core: k8s.CoreV1Api, namespace: str, node_names: list[str]) -> None:
    healthy, failing = node_names[1], node_names[2]
    pod = make_pod("victim").command("sleep", "300").node_selector(**{"kubernetes.io/hostname": failing}).obj()
    core.create_namespaced_pod(namespace, pod)
    wait_phase(core, namespace, "victim", ("Running",))
    try:
        assert cli(local_cluster, "node", "fail", failing) == 0

        def not_ready() -> bool:
            node = core.read_node(failing)
            return any(c.type == "Ready" and c.status != "True" for c in node.status.conditions)

        wait_until(not_ready, timeout=60, message=f"{failing} NotReady")
        failed = wait_phase(core, namespace, "victim", ("Failed",), timeout=60)
        assert failed.status.container_statuses[0].state.terminated.exit_code == 137
        pid = int(failed.status.container_statuses[0].container_id.rsplit("/", 1)[1])
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert failed.status.reason == "NodeFailed"
        # A new pod pinned there is not started while the node is down. The agent handles pod
        # events in the order of its one watch: once a pod created after "later" on a healthy
        # node has been started, the agent has seen "later" too, and left it alone.
        core.create_namespaced_pod(namespace, make_pod("later").command(*py("pass")).on_node(failing).obj())
        core.create_namespaced_pod(namespace, make_pod("witness").command(*py("pass")).on_node(healthy).obj())
        wait_phase(core, namespace, "witness", ("Succeeded",))
        later = core.read_namespaced_pod("later", namespace)
        assert later.status.phase == "Pending" and not later.status.container_statuses, later.status
    finally:
        assert cli(local_cluster, "node", "recover", failing) == 0
    wait_until(lambda: not any(c.type == "Ready" and c.status != "True" for c in core.read_node(failing).status.conditions), timeout=60, message=f"{failing} Ready")
    assert wait_phase(core, namespace, "later", ("Succeeded",), timeout=60)


def test_taints_via_the_cli_keep_pods_off(local_cluster: Any, core: k8s.CoreV1Api, namespace: str,
                                          node_names: list[str]) -> None:
    if local_cluster.mode == "existing":
        pytest.skip("binding is the real scheduler's business in existing mode")
    for n in node_names[:2]:
        assert cli(local_cluster, "node", "taint", n, "railyard.dev/test=yes:NoSchedule") == 0
    try:
        assert core.read_node(node_names[0]).spec.taints[0].key == "railyard.dev/test"
        core.create_namespaced_pod(namespace, make_pod("t").command(*py("pass")).obj())
        assert wait_phase(core, namespace, "t", ("Succeeded",)).spec.node_name == node_names[2]
    finally:
        for n in node_names[:2]:
            assert cli(local_cluster, "node", "untaint", n, "railyard.dev/test") == 0
    assert not core.read_node(node_names[0]).spec.taints


def test_slow_node_exports_its_factor(local_cluster: Any, core: k8s.CoreV1Api, namespace: str,
                                      node_names: list[str]) -> None:
    slow = node_names[1]
    assert cli(local_cluster, "node", "slow", slow, "--factor", "1.5") == 0
    try:
        wait_until(lambda: (core.read_node(slow).metadata.annotations or {}).get("local.railyard.dev/slow-factor") == "1.5", timeout=60, message="condition")
        # the static factor, and the simulated device the trainer's speed probe reads each step
        pod = make_pod("slowpoke").command(*py("""
            import os
            from railyard.protocol.device import SIMULATED_DEVICE_ENV, read_device
            print(os.environ['RAILYARD_NODE_SLOW_FACTOR'], read_device(os.environ[SIMULATED_DEVICE_ENV]).slow_factor)
        """)).on_node(slow).obj()
        core.create_namespaced_pod(namespace, pod)
        done = wait_phase(core, namespace, "slowpoke", ("Succeeded",))
        assert _log(local_cluster, core, namespace, "slowpoke", done).split() == ["1.5", "1.5"]
    finally:
        assert cli(local_cluster, "node", "slow", slow, "--factor", "1") == 0
    device = Path(local_cluster.state_dir) / "nodes" / slow / "device.json"
    wait_until(lambda: read_device(device).slow_factor == 1.0, timeout=60, message="the device back at full speed")


def test_a_simulated_pod_runs_its_init_containers_and_stays_running(core: k8s.CoreV1Api, namespace: str) -> None:
    # The operator's gang pods have an init container; simulated (kwok-style) pods must get past
    # it, or every pod of bench/operator.py waits in PodInitializing forever.
    pod = make_pod("sim").command("/nonexistent/never-started").obj()
    pod["metadata"]["annotations"] = {SIMULATE_ANNOTATION: "true"}
    pod["spec"]["initContainers"] = [{"name": "prepare", "image": "none", "command": ["/nonexistent/either"]}]
    core.create_namespaced_pod(namespace, pod)
    running = wait_phase(core, namespace, "sim", ("Running",))
    (init,) = running.status.init_container_statuses
    assert init.state.terminated is not None and init.state.terminated.exit_code == 0, init.state
    assert running.status.container_statuses[0].state.running is not None
    assert any(c.type == "Initialized" and c.status == "True" for c in running.status.conditions)


def test_status_command_lists_nodes(local_cluster: Any, capsys: pytest.CaptureFixture[str], node_names: list[str]) -> None:
    parser = argparse.ArgumentParser()
    local_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(["local", "--state-dir", str(local_cluster.state_dir), "status", "-o", "json",
                              "--kubeconfig", str(local_cluster.kubeconfig)])
    assert local_cmd.run(args) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in out["nodes"]] == node_names
    assert all(n["ready"] for n in out["nodes"])


def test_readiness_probe_gates_ready(core: k8s.CoreV1Api, namespace: str, tmp_path: Path) -> None:
    go = tmp_path / "go"  # the test decides when the program becomes ready, not a timer
    pod = make_pod("probed").command(*py(f"""
        import os, time
        while not os.path.exists({str(go)!r}):
            time.sleep(0.05)
        open('ready', 'w').close()
        time.sleep(600)
    """)).obj()
    pod["spec"]["containers"][0]["readinessProbe"] = {"exec": {"command": ["test", "-f", "ready"]}, "periodSeconds": 1, "failureThreshold": 1}
    core.create_namespaced_pod(namespace, pod)
    running = wait_phase(core, namespace, "probed", ("Running",))
    assert not running.status.container_statuses[0].ready  # the file cannot exist yet
    go.touch()

    def ready() -> bool:
        p = core.read_namespaced_pod("probed", namespace)
        return bool(p.status.container_statuses[0].ready) and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions)

    wait_until(ready, timeout=60, message="the probe to pass")


# ---- Kubernetes' own gang scheduling: PodGroups (scheduling.k8s.io/v1alpha2) ---------------------

GANG_API = ("scheduling.k8s.io", "v1alpha2")


@pytest.fixture
def podgroups(api_client: k8s.ApiClient) -> k8s.CustomObjectsApi:
    """PodGroups, where the API server serves them (a real one only with the GenericWorkload gate)."""
    try:
        found = k8s.ApisApi(api_client).get_api_versions()
    except k8s.ApiException:
        pytest.skip("no API group discovery")
    versions = {v.version for g in found.groups if g.name == GANG_API[0] for v in g.versions}
    if GANG_API[1] not in versions:
        pytest.skip("the API server does not serve scheduling.k8s.io/v1alpha2 (GenericWorkload gate off)")
    return k8s.CustomObjectsApi(api_client)


def _make_group(api: k8s.CustomObjectsApi, ns: str, name: str, min_count: int) -> None:
    api.create_namespaced_custom_object(*GANG_API, ns, "podgroups", {
        "apiVersion": "/".join(GANG_API), "kind": "PodGroup", "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}},
                 "schedulingConstraints": {"topology": [{"key": "railyard.dev/leaf"}]}}})


def _group_condition(api: k8s.CustomObjectsApi, ns: str, name: str) -> dict[str, Any] | None:
    group = api.get_namespaced_custom_object(*GANG_API, ns, "podgroups", name)
    return next((c for c in (group.get("status") or {}).get("conditions") or []
                 if c.get("type") == "PodGroupScheduled"), None)


def test_a_podgroup_is_bound_whole_inside_one_leaf(core: k8s.CoreV1Api, podgroups: k8s.CustomObjectsApi,
                                                     namespace: str, node_names: list[str]) -> None:
    # 3 nodes x 2 GPUs, leaf-0 = node-0 + node-1, leaf-1 = node-2: a gang of 2 x 2 GPUs fits only leaf-0
    _make_group(podgroups, namespace, "gang", 2)
    core.create_namespaced_pod(namespace, make_pod("g-0").gpus(2).group("gang").command("sleep", "60").obj())
    # the canary is scheduled after g-0 was seen: a bound canary means the scheduler looked at g-0
    core.create_namespaced_pod(namespace, make_pod("canary").command(*py("pass")).obj())
    wait_until(lambda: core.read_namespaced_pod("canary", namespace).spec.node_name, timeout=60, message="canary bound")
    assert core.read_namespaced_pod("g-0", namespace).spec.node_name is None
    core.create_namespaced_pod(namespace, make_pod("g-1").gpus(2).group("gang").command("sleep", "60").obj())
    nodes = {n: wait_until(lambda n=n: core.read_namespaced_pod(n, namespace).spec.node_name, timeout=60, message=f"{n} bound")
             for n in ("g-0", "g-1")}
    assert sorted(nodes.values()) == node_names[:2]
    cond = wait_until(lambda: _group_condition(podgroups, namespace, "gang"), timeout=30, message="PodGroupScheduled")
    assert (cond["status"], cond["reason"]) == ("True", "Scheduled")


def test_a_gang_of_gated_pinned_pods_goes_exactly_where_it_was_pinned(
        core: k8s.CoreV1Api, podgroups: k8s.CustomObjectsApi, namespace: str, node_names: list[str]) -> None:
    """The operator's flow: pods created gated, each pinned by required node affinity to the
    node placement chose, then ungated; with a PodGroup the gang still lands on those nodes."""
    _make_group(podgroups, namespace, "pinned", 2)
    for name, node in (("p-0", node_names[1]), ("p-1", node_names[0])):
        core.create_namespaced_pod(namespace, make_pod(name).gate().pin(node).group("pinned")
                                   .command(*py("pass")).obj())
    for name in ("p-0", "p-1"):
        core.patch_namespaced_pod(name, namespace, {"spec": {"schedulingGates": None}})
    placed = {n: wait_until(lambda n=n: core.read_namespaced_pod(n, namespace).spec.node_name, timeout=60, message=f"{n} bound")
              for n in ("p-0", "p-1")}
    assert placed == {"p-0": node_names[1], "p-1": node_names[0]}
    # pinned into different leaves, a gang that must share one leaf never starts
    _make_group(podgroups, namespace, "split", 2)
    for name, node in (("s-0", node_names[0]), ("s-1", node_names[2])):
        core.create_namespaced_pod(namespace, make_pod(name).pin(node).group("split").command(*py("pass")).obj())
    cond = wait_until(lambda: _group_condition(podgroups, namespace, "split"), timeout=60, message="PodGroupScheduled False")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert all(core.read_namespaced_pod(n, namespace).spec.node_name is None for n in ("s-0", "s-1"))
