"""Two pods on two simulated nodes run a gloo all-reduce over the nodes' own addresses.

The master is found by its pod DNS name (``<hostname>.<subdomain>.<ns>.svc``) through the
agent's resolver (sitecustomize on PYTHONPATH), the way our launcher resolves MASTER_ADDR.
"""

from __future__ import annotations

import sys
import textwrap
from typing import Any

import pytest
from kubernetes import client as k8s

from railyard.protocol.ports import free_port

from .builders import make_pod
from .conftest import wait_phase

pytestmark = [pytest.mark.cluster, pytest.mark.torch]

SCRIPT = textwrap.dedent("""
    import datetime, os, socket
    import torch
    import torch.distributed as dist
    rank = int(os.environ['RANK'])
    master = socket.gethostbyname(os.environ['MASTER_NAME'])
    me = os.environ['POD_IP']
    timeout = datetime.timedelta(seconds=60)
    store = dist.TCPStore(master, int(os.environ['MASTER_PORT']), 2, rank == 0, timeout=timeout)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=me)]
    opts._timeout = timeout
    pg = dist.ProcessGroupGloo(store, rank, 2, opts)
    t = torch.tensor([float(rank + 1)])
    pg.allreduce([t]).wait()
    print(f'rank {rank} on {me} (master {master}): {t.item()}', flush=True)
    # gloo's background threads abort the interpreter at exit if left running: leave promptly
    os._exit(0 if t.item() == 3.0 else 1)
""")


def test_gloo_all_reduce_between_two_nodes(local_cluster: Any, core: k8s.CoreV1Api, namespace: str) -> None:
    port = free_port()
    core.create_namespaced_service(namespace, {"metadata": {"name": "ring"}, "spec": {"clusterIP": "None", "selector": {"app": "ring"}, "ports": [{"port": port}]}})
    first, second = local_cluster.node_specs[:2]
    for rank, node in ((0, first.name), (1, second.name)):
        pod = make_pod(f"ring-{rank}").command(sys.executable, "-c", SCRIPT).env(
            {"name": "RANK", "value": str(rank)},
            {"name": "MASTER_NAME", "value": f"ring-0.ring.{namespace}.svc"},
            {"name": "MASTER_PORT", "value": str(port)},
            {"name": "OMP_NUM_THREADS", "value": "1"},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ).node_selector(**{"kubernetes.io/hostname": node}).obj()
        pod["metadata"]["labels"]["app"] = "ring"
        pod["spec"].update({"hostname": f"ring-{rank}", "subdomain": "ring"})
        core.create_namespaced_pod(namespace, pod)
    done = [wait_phase(core, namespace, f"ring-{r}", ("Succeeded", "Failed"), timeout=120) for r in (0, 1)]
    logs = [core.read_namespaced_pod_log(f"ring-{r}", namespace) if local_cluster.mode == "embedded" else "" for r in (0, 1)]
    assert [p.status.phase for p in done] == ["Succeeded", "Succeeded"], logs
    assert [p.status.pod_ip for p in done] == [first.ip, second.ip]
    if local_cluster.mode == "embedded":
        assert f"rank 1 on {second.ip} (master {first.ip}): 3.0" in logs[1]
