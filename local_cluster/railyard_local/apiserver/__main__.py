"""``python -m railyard_local.apiserver``: run the embedded API server until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from railyard.gcpolicy import settle_after_start

from .nodelifecycle import NodeLifecycleSettings
from .server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m railyard_local.apiserver",
                                     description="Embedded Kubernetes-compatible API server (loopback only).")
    parser.add_argument("--state-dir", required=True, type=Path, help="folder for objects.sqlite and pod logs")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (see --ready-file)")
    auth = parser.add_mutually_exclusive_group(required=True)
    auth.add_argument("--token", help="bearer token clients must send (visible in ps; prefer --token-file)")
    auth.add_argument("--token-file", type=Path, help="file holding the bearer token clients must send")
    parser.add_argument("--event-window", type=int, default=20_000,
                        help="watch events kept for resuming watches (older resourceVersions get 410 Gone)")
    parser.add_argument("--no-workload-api", action="store_true",
                        help="do not serve scheduling.k8s.io/v1alpha2 workloads and podgroups (served by default, "
                             "as kube-apiserver v1.36 with the GenericWorkload and GangScheduling feature gates)")
    parser.add_argument("--node-monitor-grace-period", type=float, default=NodeLifecycleSettings.grace_period_s,
                        metavar="SECONDS",
                        help="a node whose Lease and status go unrenewed this long turns Ready=Unknown with the "
                             "node.kubernetes.io/unreachable taints, as kube-controller-manager's flag (default 50)")
    parser.add_argument("--node-monitor-period", type=float, default=NodeLifecycleSettings.monitor_period_s,
                        metavar="SECONDS", help="how often nodes are checked (default 5)")
    parser.add_argument("--no-node-lifecycle", action="store_true",
                        help="never mark nodes NotReady (the rule above is on by default, as on a real control plane)")
    parser.add_argument("--ready-file", type=Path, help='written as {"url": ..., "pid": ...} once serving')
    parser.add_argument("--insecure-http", action="store_true",
                        help="serve plain HTTP (kubectl then sends no token, so only for Python clients)")
    args = parser.parse_args(argv)
    if not args.host.startswith("127.") and args.host not in ("localhost", "::1"):
        parser.error(f"--host {args.host}: the embedded server listens on loopback only; use 127.0.0.1")
    token = args.token if args.token else args.token_file.read_text().strip()
    if not token:
        parser.error("the token is empty; give --token or a non-empty --token-file")
    try:
        lifecycle = None if args.no_node_lifecycle else NodeLifecycleSettings(args.node_monitor_grace_period,
                                                                               args.node_monitor_period)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(args.state_dir, token=token, event_window=args.event_window, host=args.host, port=args.port,
                    ready_file=args.ready_file, stop=stop, tls=not args.insecure_http,
                    workload_api=not args.no_workload_api, node_lifecycle=lifecycle)

    settle_after_start()
    try:
        asyncio.run(run())
    except (RuntimeError, OSError) as exc:
        print(f"railyard apiserver: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
