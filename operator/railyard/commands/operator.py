"""``railyard operator run``: the operator (kopf under the hood) against the current kubeconfig."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import os
import secrets
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from railyard.logic.jitsave import DEFAULT_TIMEOUT_S as SAVE_BEFORE_STOP_S
from railyard.observe.probes import DEFAULT_STUCK_AFTER_S
from railyard.operator_address import FILE, LocalOperatorAddress, find_operator_address


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("operator", help="run the operator against the current kubeconfig")
    osub = p.add_subparsers(dest="operator_command", metavar="ACTION")
    r = osub.add_parser("run", help="run the operator until interrupted")
    scope = r.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces (default)")
    r.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)"
    )
    r.add_argument("--context", default=None, help="kubeconfig context")
    # None: not given (the local cluster's published address may fill them in: choose_address)
    r.add_argument(
        "--metrics-host",
        default=None,
        help=f"address of the /metrics, /healthz and heartbeat server (default {DEFAULT_HOST})",
    )
    r.add_argument(
        "--metrics-port", type=int, default=None, help=f"port of that server (0: none; default {DEFAULT_PORT})"
    )
    r.add_argument(
        "--heartbeat-advertise-url",
        default=None,
        help="base URL pods post heartbeats to (default: against a local cluster's kubeconfig, the address its pods "
             "use; "
        "else the base their running pods already use; else "
        "http://railyard-operator.railyard-system.svc:<metrics-port>)",
    )
    peer = r.add_mutually_exclusive_group()
    peer.add_argument("--standalone", action="store_true", help="no peering with other operator instances")
    peer.add_argument("--peering", default=None, metavar="NAME", help="kopf peering object name (leader election)")
    r.add_argument(
        "--not-ready-grace",
        type=float,
        default=2.0,
        help="seconds a node may be NotReady before its pods count as failed",
    )
    r.add_argument(
        "--pod-annotation",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra annotation on every gang pod (repeatable)",
    )
    r.add_argument(
        "--maintenance-signal",
        action="append",
        default=[],
        metavar="KEY",
        help="a node label or annotation that announces the node's maintenance: the gangs on it move ahead of time "
        "(repeatable; added to cloud.google.com/scheduled-maintenance-time and railyard.dev/maintenance)",
    )
    r.add_argument("--planned-moves", action=argparse.BooleanOptionalAction, default=True,
                   help="move a gang's pods off a node announced to go ahead of time, and hold drains with a "
                   "PodDisruptionBudget meanwhile (default on; off: a drain is handled as a failure)")
    r.add_argument("--save-before-stop-seconds", type=float, default=SAVE_BEFORE_STOP_S, metavar="S",
                   help="how long a planned move, spec.suspend or a Kueue eviction waits for the gang's just-in-time "
                   "save (with ReplicaGroups before a move: the moved groups' leave) before it deletes the pods anyway "
                   "(0: never wait; the job's Event says which)")
    r.add_argument("--stuck-reconcile-seconds", type=float, default=DEFAULT_STUCK_AFTER_S,
                   help="a job's reconcile cycle running longer than this fails /healthz (liveness)")
    r.add_argument("-v", "--verbose", action="store_true", help="debug logging")


DEFAULT_HOST = "0.0.0.0"
DEFAULT_PORT = 8080
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True, slots=True)
class ServeAddress:
    """Where the operator's HTTP server listens and the base URL it gives new pods ("": none
    advertised: each job keeps the base its pods carry, else the chart's Service;
    logic/health/address.py)."""

    host: str
    port: int
    advertise: str
    #: Why, for the start-up log ("" when as given).
    note: str = ""


def choose_address(
    *, host: str | None, port: int | None, advertise: str | None, local: LocalOperatorAddress | None
) -> ServeAddress:
    """Flags as given win. Without ``--heartbeat-advertise-url``, against a local cluster's
    kubeconfig (``local``: its published address), serve where its pods look: its port unless
    ``--metrics-port`` says otherwise, and advertise this machine's loopback at that port."""
    if advertise is not None or local is None or port == 0:
        return ServeAddress(
            DEFAULT_HOST if host is None else host, DEFAULT_PORT if port is None else port, advertise or ""
        )
    port = local.port if port is None else port
    host = local.host if host is None else host
    reach = local.host if host in _WILDCARDS else host
    url = f"http://{reach}:{port}"
    return ServeAddress(
        host, port, url, note=f"the local cluster of {local.where} (its {FILE}): its pods reach this operator at {url}"
    )


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


def peering_identity(env: Mapping[str, str] | None = None) -> str:
    """Who this operator is in kopf's peering records: the pod's name where the chart gives it
    (``POD_NAME``, from the downward API; kopf's own ``POD_ID`` too), else user@host/time/random.

    Never from the passwd database: kopf's default asks ``getpass.getuser()``, which raises for a
    UID without a passwd entry -- the chart's 65532 in a distroless-style image, OpenShift's
    random UIDs -- and the operator died at start-up.
    """
    env = os.environ if env is None else env
    pod = env.get("POD_NAME") or env.get("POD_ID")
    if pod:
        return pod
    user = env.get("USER") or env.get("LOGNAME") or f"uid{os.getuid()}"
    now = dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S")
    return f"{user}@{socket.gethostname()}/{now}/{secrets.token_hex(2)}"


def run(args: argparse.Namespace) -> int:
    if getattr(args, "operator_command", None) != "run":
        print(
            "usage: railyard operator run [--namespace NS | --all-namespaces] [--metrics-port 8080] ...",
            file=sys.stderr,
        )
        return 2
    if args.kubeconfig:
        # before kopf (and with it the kubernetes package) is imported: both read it at import
        os.environ["KUBECONFIG"] = args.kubeconfig
    from railyard.kubecreds import KubeConfigError, load_connection

    try:  # a clear message now, not a login handler retrying inside kopf
        load_connection(args.kubeconfig, args.context)
    except KubeConfigError as exc:
        print(f"railyard operator run: {exc}", file=sys.stderr)
        return 2
    local = find_operator_address(args.kubeconfig) if args.heartbeat_advertise_url is None else None
    address = choose_address(
        host=args.metrics_host, port=args.metrics_port, advertise=args.heartbeat_advertise_url, local=local
    )
    if local is not None and args.metrics_port is None and _port_in_use(address.host, address.port):
        print(
            f"railyard operator run: {address.host}:{address.port}, where the pods of the local cluster of "
            f"{local.where} "
            f"reach the operator ({FILE}), is in use: is another operator (`railyard local up --with-operator`) "
            "running? "
            "Stop it first, or pass --metrics-port and --heartbeat-advertise-url to run a second one (the pods will "
            "not reach it)",
            file=sys.stderr,
        )
        return 2
    import kopf

    from railyard.gcpolicy import settle_after_start
    from railyard.handlers import kopf_handlers
    from railyard.handlers.runtime import OperatorSettings
    from railyard.logic.planned import MAINTENANCE_SIGNALS

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("kopf.objects", "kopf._core.engines.peering", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    annotations: dict[str, str] = {}
    for item in args.pod_annotation:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"--pod-annotation: {item!r} must look like KEY=VALUE", file=sys.stderr)
            return 2
        annotations[key] = value
    if address.note:
        logging.getLogger("railyard.operator").info(
            "heartbeats and control on %s:%d: %s", address.host, address.port, address.note
        )
    memo = kopf_handlers.build_memo(
        OperatorSettings(
            heartbeat_url=address.advertise,
            metrics_host=address.host,
            metrics_port=address.port,
            kubeconfig=args.kubeconfig,
            context=args.context,
            not_ready_grace_s=args.not_ready_grace,
            pod_annotations=annotations,
            stuck_reconcile_s=args.stuck_reconcile_seconds,
            maintenance_signals=(*MAINTENANCE_SIGNALS, *args.maintenance_signal),
            save_before_stop_s=args.save_before_stop_seconds,
            planned_moves=args.planned_moves,
        )
    )
    namespaces = list(args.namespace)
    settle_after_start()
    try:
        asyncio.run(
            kopf.operator(
                standalone=args.standalone or not args.peering,
                peering_name=args.peering,
                clusterwide=not namespaces,
                namespaces=namespaces,
                identity=cast(Any, peering_identity()),  # kopf's Identity: a NewType of str, not exported
                memo=memo,
            )
        )
    except KeyboardInterrupt:
        return 130
    return 0
