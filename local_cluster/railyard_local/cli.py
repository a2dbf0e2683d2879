"""``railyard local``'s actions (up, down, status, node ...), run by railyard.commands.local.

The command line itself (its parser) is railyard's (railyard/commands/local.py), so that
``railyard --help`` lists it without this package; what it does lives here, next to the cluster
it drives.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from railyard.api.corev1 import node_is_ready
from railyard_local.cluster import LocalCluster, LocalClusterError, default_state_dir
from railyard_local.kube import MERGE, ApiError, KubeClient
from railyard_local.nodes import CLUSTER_LABEL, FAIL_ANNOTATION, SLOW_ANNOTATION
from railyard_local.topology import SIMULATED_LABEL, TopologyError

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def run(args: argparse.Namespace) -> int:
    state_dir = (args.state_dir or default_state_dir()).absolute()
    try:
        if args.local_command == "up":
            return _up(args, state_dir)
        if args.local_command == "down":
            return _down(state_dir)
        if args.local_command == "status":
            return asyncio.run(_status(args, state_dir))
        if args.local_command == "node":
            return asyncio.run(_node(args, state_dir))
    except (LocalClusterError, TopologyError) as exc:
        print(f"railyard local: {exc}", file=sys.stderr)
        return 1
    return 2


# --- up / down ---
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running_pid(state_dir: Path) -> int | None:
    try:
        pid = int((state_dir / "up.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def _up(args: argparse.Namespace, state_dir: Path) -> int:
    pid = _running_pid(state_dir)
    if pid is not None:
        print(f"railyard local: already running (pid {pid}) with state in {state_dir}; "
              "`railyard local down` first", file=sys.stderr)
        return 1
    if args.detach:
        return _up_detached(args, state_dir)
    cluster = LocalCluster(
        state_dir,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        topology=args.topology,
        topology_file=args.topology_file,
        cpu_per_node=args.cpu,
        memory_per_node=args.memory,
        mode=args.mode,
        kubeconfig=args.kubeconfig,
        kubelet_client_ca=args.kubelet_client_ca,
        scheduler=args.scheduler,
        with_operator=args.with_operator,
        shared_host_paths=args.shared_host_path,
    )
    stop = {"now": False}

    def on_signal(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "up.pid").write_text(str(os.getpid()))
    ready = state_dir / "run" / "up.json"
    try:
        kubeconfig = cluster.start(timeout=args.timeout)
        print(f"railyard local: {cluster.mode} cluster up with {len(cluster.node_specs)} nodes; state in {state_dir}")
        print(f"kubeconfig: {kubeconfig}")
        print(f"export KUBECONFIG={kubeconfig}", flush=True)
        tmp = ready.with_suffix(".tmp")  # `up --detach` polls for this file: never let it read half of it
        tmp.write_text(json.dumps({"pid": os.getpid(), "kubeconfig": str(kubeconfig)}))
        os.replace(tmp, ready)
        operator_reported = False
        while not stop["now"]:
            code = cluster.operator_exit_code()
            if code is not None and not operator_reported:
                operator_reported = True
                print(f"railyard local: the operator exited with code {code} (is `railyard operator run` "
                      f"available in this install?); see {state_dir / 'logs' / 'operator.log'}. "
                      "The cluster keeps running.", file=sys.stderr, flush=True)
            dead = cluster.exited()
            if dead is not None:
                print(f"railyard local: {dead} exited; see {state_dir / 'logs' / (dead + '.log')}", file=sys.stderr)
                return 1
            time.sleep(0.3)
        print("railyard local: stopping", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.stop()
        ready.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            if (state_dir / "up.pid").read_text().strip() == str(os.getpid()):
                (state_dir / "up.pid").unlink()


def _up_detached(args: argparse.Namespace, state_dir: Path) -> int:
    argv = [
        sys.executable,
        "-m",
        "railyard.cli",
        "local",
        "--state-dir",
        str(state_dir),
        "up",
        "--timeout",
        str(args.timeout),
    ]
    for flag, value in (
        ("--nodes", args.nodes),
        ("--gpus-per-node", args.gpus_per_node),
        ("--topology", args.topology),
        ("--topology-file", args.topology_file and args.topology_file.absolute()),
        ("--cpu", args.cpu),
        ("--memory", args.memory),
        ("--mode", args.mode),
        ("--kubeconfig", args.kubeconfig and args.kubeconfig.absolute()),
        ("--kubelet-client-ca", args.kubelet_client_ca and args.kubelet_client_ca.absolute()),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.scheduler is not None:
        argv.append("--scheduler" if args.scheduler else "--no-scheduler")
    if args.with_operator:
        argv.append("--with-operator")
    for path in args.shared_host_path or []:
        argv += ["--shared-host-path", path]
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    (state_dir / "run").mkdir(parents=True, exist_ok=True)
    ready = state_dir / "run" / "up.json"
    ready.unlink(missing_ok=True)
    log_path = state_dir / "logs" / "up.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + args.timeout + 10
    while time.monotonic() < deadline:
        if ready.exists():
            info = json.loads(ready.read_text())
            print(f"railyard local: up in the background (pid {proc.pid}); stop with `railyard local down`")
            print(f"kubeconfig: {info['kubeconfig']}")
            print(f"export KUBECONFIG={info['kubeconfig']}")
            return 0
        if proc.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            print(
                f"railyard local: background start failed (exit {proc.returncode}); {log_path}:\n{tail}",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.1)
    proc.terminate()
    print(f"railyard local: not up after {args.timeout:.0f}s; see {log_path}", file=sys.stderr)
    return 1


def _down(state_dir: Path) -> int:
    pid = _running_pid(state_dir)
    if pid is None:
        print(f"railyard local: no running cluster for {state_dir}")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and _pid_alive(pid):
        time.sleep(0.1)
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)
        print(f"railyard local: pid {pid} did not stop in 40s; killed", file=sys.stderr)
    (state_dir / "up.pid").unlink(missing_ok=True)
    print(f"railyard local: down (state kept in {state_dir}; `railyard local up` brings it back)")
    return 0


# --- status and node controls ---
def _kubeconfig(args: argparse.Namespace, state_dir: Path) -> Path:
    if getattr(args, "kubeconfig", None):
        return Path(args.kubeconfig)
    try:
        config = json.loads((state_dir / "cluster.json").read_text())
    except FileNotFoundError as exc:
        raise LocalClusterError(
            f"no local cluster in {state_dir}; start one with `railyard local up` or pass --kubeconfig"
        ) from exc
    if config.get("mode") == "existing":
        return Path(config["externalKubeconfig"])
    return state_dir / "kubeconfig"


def _own_nodes(state_dir: Path) -> str:
    """The label selector of this state dir's nodes: on a shared API server (existing mode) other
    local clusters' simulated nodes are beside them, and are not this cluster's to report."""
    with contextlib.suppress(OSError, ValueError):
        cluster_id = json.loads((state_dir / "cluster.json").read_text()).get("clusterId")
        if cluster_id:
            return f"{SIMULATED_LABEL}=true,{CLUSTER_LABEL}={cluster_id}"
    return f"{SIMULATED_LABEL}=true"


async def _status(args: argparse.Namespace, state_dir: Path) -> int:
    kubeconfig = _kubeconfig(args, state_dir)
    pid = _running_pid(state_dir)
    out: dict[str, Any] = {
        "stateDir": str(state_dir),
        "kubeconfig": str(kubeconfig),
        "running": pid is not None,
        "pid": pid,
        "nodes": [],
    }
    if pid is not None or getattr(args, "kubeconfig", None):
        async with KubeClient.from_kubeconfig(str(kubeconfig)) as client:
            try:
                nodes = (await client.get("/api/v1/nodes", labelSelector=_own_nodes(state_dir))).get("items") or []
                pods = (await client.get("/api/v1/pods")).get("items") or []
            except (ApiError, OSError) as exc:
                print(f"railyard local: API server not reachable: {exc}", file=sys.stderr)
                return 1
        per_node: dict[str, int] = {}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                per_node[node] = per_node.get(node, 0) + 1
        for n in nodes:
            meta = n.get("metadata") or {}
            ann = meta.get("annotations") or {}
            out["nodes"].append(
                {
                    "name": meta.get("name"),
                    "ready": node_is_ready(n),
                    "failed": ann.get(FAIL_ANNOTATION) == "true",
                    "slowFactor": float(ann.get(SLOW_ANNOTATION, 1) or 1),
                    "taints": [
                        f"{t.get('key')}{'=' + t['value'] if t.get('value') else ''}:{t.get('effect')}"
                        for t in (n.get("spec") or {}).get("taints") or []
                    ],
                    "ip": next(
                        (
                            a["address"]
                            for a in (n.get("status") or {}).get("addresses") or []
                            if a.get("type") == "InternalIP"
                        ),
                        "",
                    ),
                    "pods": per_node.get(str(meta.get("name")), 0),
                }
            )
    if args.output == "json":
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"state dir:  {out['stateDir']}\nkubeconfig: {out['kubeconfig']}\nrunning:    "
        f"{f'yes (pid {pid})' if pid else 'no'}"
    )
    if out["nodes"]:
        print(f"{'NODE':<16}{'STATUS':<10}{'IP':<16}{'PODS':>5}  NOTES")
        for n in out["nodes"]:
            notes = []
            if n["failed"]:
                notes.append("failed")
            if n["slowFactor"] > 1:
                notes.append(f"slow x{n['slowFactor']:g}")
            notes += n["taints"]
            print(
                f"{n['name']:<16}{'Ready' if n['ready'] else 'NotReady':<10}{n['ip']:<16}{n['pods']:>5}  "
                f"{', '.join(notes)}"
            )
    return 0


def parse_taint(text: str, *, need_effect: bool = True) -> dict[str, str]:
    """``key[=value]:Effect`` -> taint dict; raises ValueError naming the fix."""
    body, sep, effect = text.rpartition(":")
    if not sep:
        body, effect = text, ""
    if effect and effect not in EFFECTS:
        raise ValueError(f"taint {text!r}: effect must be one of {', '.join(EFFECTS)}")
    if need_effect and not effect:
        raise ValueError(f"taint {text!r}: write KEY[=VALUE]:EFFECT, e.g. gpu=broken:NoSchedule")
    key, _, value = body.partition("=")
    if not key:
        raise ValueError(f"taint {text!r}: the key is empty")
    taint = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return taint


async def _node(args: argparse.Namespace, state_dir: Path) -> int:
    kubeconfig = _kubeconfig(args, state_dir)
    path = f"/api/v1/nodes/{args.name}"
    async with KubeClient.from_kubeconfig(str(kubeconfig)) as client:
        try:
            node = await client.get(path)
        except ApiError as exc:
            if exc.status == 404:
                print(f"railyard local: no node {args.name!r}; `railyard local status` lists them", file=sys.stderr)
                return 1
            raise
        cmd = args.node_command
        if cmd in ("fail", "recover", "slow"):
            if cmd == "slow" and args.factor < 1:
                print("railyard local: --factor must be >= 1 (1 restores normal speed)", file=sys.stderr)
                return 1
            value: dict[str, str | None]
            if cmd == "fail":
                value = {FAIL_ANNOTATION: "true"}
            elif cmd == "recover":
                value = {FAIL_ANNOTATION: None}
            else:
                value = {SLOW_ANNOTATION: None if args.factor == 1 else f"{args.factor:g}"}
            await client.patch(path, {"metadata": {"annotations": value}}, MERGE)
            print(f"node/{args.name} {cmd}{' x' + format(args.factor, 'g') if cmd == 'slow' else ''}")
            return 0
        try:
            taint = parse_taint(args.taint, need_effect=cmd == "taint")
        except ValueError as exc:
            print(f"railyard local: {exc}", file=sys.stderr)
            return 1
        for _ in range(10):
            taints = list((node.get("spec") or {}).get("taints") or [])
            if cmd == "taint":
                taints = [t for t in taints if (t.get("key"), t.get("effect")) != (taint["key"], taint["effect"])] + [
                    taint
                ]
            else:
                taints = [
                    t for t in taints if not (t.get("key") == taint["key"] and taint["effect"] in ("", t.get("effect")))
                ]
            rv = (node.get("metadata") or {}).get("resourceVersion")
            try:
                await client.patch(path, {"metadata": {"resourceVersion": rv}, "spec": {"taints": taints}}, MERGE)
                print(f"node/{args.name} {'tainted' if cmd == 'taint' else 'untainted'}")
                return 0
            except ApiError as exc:
                if exc.status != 409:
                    raise
                node = await client.get(path)
        print("railyard local: the node kept changing; try again", file=sys.stderr)
        return 1
