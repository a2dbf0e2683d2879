"""``railyard local``: the embedded single-machine cluster.

``up`` starts it (foreground until Ctrl-C, or ``--detach`` as a daemon that ``down`` stops),
``status`` shows it, ``node fail|recover|slow|taint|untaint`` changes a simulated node while
``up`` runs in another process: every control goes through the API server (node annotations
the node agent watches, or the node's taints).

The cluster is its own distribution (railyard-local, local_cluster/ in the repository; the
operator image does not carry it): this module is the command line only, and imports
railyard_local when the command runs (railyard_local/cli.py does the work).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from railyard.commands import missing_local_cluster


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "local", help="the embedded single-machine cluster: up, down, status, node ..."
    )
    p.add_argument(
        "--state-dir", type=Path, default=None, help="cluster state (default $RAILYARD_STATE_DIR or ./.railyard/local)"
    )
    lsub = p.add_subparsers(dest="local_command", metavar="ACTION", required=True)

    up = lsub.add_parser("up", help="start the local cluster (foreground; --detach for background)")
    up.add_argument("--nodes", type=int, help="number of simulated nodes (default 4, or as before)")
    up.add_argument("--gpus-per-node", type=int, help="nvidia.com/gpu capacity of each node (default 0)")
    group = up.add_mutually_exclusive_group()
    group.add_argument("--topology", help="switch levels top-down, e.g. spine=2,leaf=2")
    group.add_argument("--topology-file", type=Path, help="YAML: nodes, gpusPerNode, levels, cpu, memory")
    up.add_argument("--cpu", help="cpu capacity per node (default 16)")
    up.add_argument("--memory", help="memory capacity per node (default 64Gi)")
    up.add_argument(
        "--shared-host-path",
        action="append",
        default=None,
        metavar="PATH",
        help="hostPaths under PATH are one folder for all nodes, like a network filesystem (default /mnt; repeatable)",
    )
    up.add_argument("--mode", help="embedded (default), envtest ($KUBEBUILDER_ASSETS) or existing")
    up.add_argument("--kubeconfig", type=Path, help="existing mode: add nodes and the agent to this cluster")
    up.add_argument("--kubelet-client-ca", type=Path,
                    help="existing mode: the CA of the API server's kubelet client certificate, for `kubectl logs` "
                         "(default: the kubeconfig's CA, which kubeadm and kind use)")
    up.add_argument("--scheduler", action=argparse.BooleanOptionalAction, default=None,
                    help="run the local scheduler (default: on unless the cluster is an existing one)")
    up.add_argument("--with-operator", action="store_true", help="also run `railyard operator run` against it")
    up.add_argument("--detach", action="store_true", help="run in the background; stop with `railyard local down`")
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for start-up")

    lsub.add_parser("down", help="stop a cluster started with `up --detach` (state is kept)")
    status = lsub.add_parser("status", help="show the cluster, its nodes and their pods")
    status.add_argument("-o", "--output", choices=("text", "json"), default="text")

    node = lsub.add_parser("node", help="fail, recover, slow, taint or untaint a simulated node")
    nsub = node.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    for name, text in (
        ("fail", "make the node NotReady and kill its pods' processes"),
        ("recover", "make a failed node Ready again"),
    ):
        q = nsub.add_parser(name, help=text)
        q.add_argument("name")
    slow = nsub.add_parser("slow", help="slow the node's processes by a factor (1 = normal speed)")
    slow.add_argument("name")
    slow.add_argument("--factor", type=float, required=True)
    taint = nsub.add_parser("taint", help="add a taint KEY[=VALUE]:EFFECT")
    taint.add_argument("name")
    taint.add_argument("taint")
    untaint = nsub.add_parser("untaint", help="remove taints with KEY (or KEY:EFFECT)")
    untaint.add_argument("name")
    untaint.add_argument("taint")
    for q in (*nsub.choices.values(), status):
        q.add_argument("--kubeconfig", type=Path, help="the cluster (default: the local cluster's kubeconfig)")


def run(args: argparse.Namespace) -> int:
    missing = missing_local_cluster("local")
    if missing:
        print(missing, file=sys.stderr)
        return 1
    from railyard_local.cli import run as run_local

    return run_local(args)


if __name__ == "__main__":
    from railyard.cli import main

    sys.exit(main(["local", *sys.argv[1:]]))
