"""``LocalCluster``: start and stop the single-machine cluster from Python (tests, demo, bench).

Three modes behind one API:

- ``embedded``: our API server (``python -m railyard_local.apiserver``) on 127.0.0.1 with a
  bearer token, its state under ``<state>/apiserver``; plus the runtime with the scheduler.
- ``envtest``: real ``kube-apiserver`` + ``etcd`` from ``$KUBEBUILDER_ASSETS``; plus the runtime
  with the scheduler (envtest runs no scheduler).
- ``existing``: any cluster named by a kubeconfig; only the runtime's simulated nodes and node
  agent are added (the cluster's own scheduler binds pods to them).

The runtime (``python -m railyard_local.runtime``) registers the nodes and runs pods. Both are
child processes in this process's group, with PR_SET_PDEATHSIG, so nothing outlives it.
Everything the cluster needs to come back after ``stop()`` is in ``<state>/cluster.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from railyard.operator_address import (
    LOOPBACK,
    publish_operator_address,
    unpublish_operator_address,
)
from railyard.protocol.ports import free_port as _free_port
from railyard_local.kubeconfig import kubeconfig_ca, write_kubeconfig
from railyard_local.nodes import CLUSTER_LABEL
from railyard_local.processes import set_parent_death_signal
from railyard_local.topology import (
    ClusterShape,
    NodeSpec,
    build_nodes,
    parse_topology_file,
    parse_topology_spec,
)

MODES = ("embedded", "envtest", "existing")
CONFIG_VERSION = 1
#: Twice the embedded API server's bookmark interval: a watch of it that delivers nothing for
#: this long is dead, and the runtime re-establishes it.
EMBEDDED_WATCH_INACTIVITY_S = 30.0


class LocalClusterError(RuntimeError):
    """The local cluster could not start or stop; the message says why and what to do."""


def default_state_dir() -> Path:
    return Path(os.environ.get("RAILYARD_STATE_DIR") or Path.cwd() / ".railyard" / "local").absolute()


def _stop_with_us() -> None:
    """Runs in the API server's and the runtime's process before exec: SIGTERM when we die."""
    set_parent_death_signal(signal.SIGTERM)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalCluster:
    """One local cluster rooted at a state directory. ``start()`` returns the kubeconfig path."""

    def __init__(
        self,
        state_dir: Path | str | None = None,
        *,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        topology: str | None = None,
        topology_file: Path | str | None = None,
        mode: str | None = None,
        kubeconfig: Path | str | None = None,
        kubelet_client_ca: Path | str | None = None,
        scheduler: bool | None = None,
        cpu_per_node: str | None = None,
        memory_per_node: str | None = None,
        node_prefix: str | None = None,
        node_ip_offset: int | None = None,
        shared_host_paths: list[str] | None = None,
        lease_interval: float = 10.0,
        node_monitor_grace_period: float | None = 50.0,
        with_operator: bool = False,
        python: str = sys.executable,
    ) -> None:
        self.state_dir = Path(state_dir).absolute() if state_dir else default_state_dir()
        self.python = python
        self.lease_interval = lease_interval
        self.node_monitor_grace_period = node_monitor_grace_period
        """embedded mode: kube-controller-manager's node lifecycle rule in the API server, a node
        NotReady after this many seconds without a Lease renewal or status (None: off)."""
        self.with_operator = with_operator
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._envtest: Any = None
        self.url = ""
        self.config = self._load_config()
        if kubeconfig is not None:
            mode = mode or "existing"
            self.config["externalKubeconfig"] = str(Path(kubeconfig).absolute())
        if mode is not None:
            if mode not in MODES:
                raise LocalClusterError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
            self.config["mode"] = mode
        self.config.setdefault("mode", "embedded")
        if self.config["mode"] == "existing" and not self.config.get("externalKubeconfig"):
            raise LocalClusterError("mode existing needs --kubeconfig pointing at the cluster to add nodes to")
        if kubelet_client_ca is not None:
            self.config["kubeletClientCA"] = str(Path(kubelet_client_ca).absolute())
        if scheduler is not None:
            self.config["scheduler"] = scheduler
        self.config.setdefault("scheduler", self.config["mode"] != "existing")
        self.config.setdefault("token", secrets.token_hex(24))
        if shared_host_paths is not None:
            self.config["sharedHostPaths"] = list(shared_host_paths)
        shape_args = (
            nodes,
            gpus_per_node,
            topology,
            topology_file,
            cpu_per_node,
            memory_per_node,
            node_prefix,
            node_ip_offset,
        )
        if "nodeSpecs" not in self.config or any(a is not None for a in shape_args):
            shape = self._shape(nodes, gpus_per_node, topology, topology_file, cpu_per_node, memory_per_node)
            if node_prefix is not None:
                shape = dataclasses.replace(shape, name_prefix=node_prefix)
            if node_ip_offset is not None:
                shape = dataclasses.replace(shape, ip_offset=node_ip_offset)
            self.config["shape"] = {
                "nodes": shape.nodes,
                "gpusPerNode": shape.gpus_per_node,
                "levels": ",".join(f"{lv.name}={lv.count}" for lv in shape.levels),
                "cpu": shape.cpu,
                "memory": shape.memory,
                "namePrefix": shape.name_prefix,
                "ipOffset": shape.ip_offset,
            }
            self.config.setdefault("clusterId", secrets.token_hex(4))
            specs = [n.to_dict() for n in build_nodes(shape)]
            for spec in specs:
                spec["labels"][CLUSTER_LABEL] = self.config["clusterId"]
            self.config["nodeSpecs"] = specs

    # --- configuration ---
    @property
    def config_path(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def mode(self) -> str:
        return str(self.config["mode"])

    @property
    def token(self) -> str:
        return str(self.config["token"])

    @property
    def node_specs(self) -> list[NodeSpec]:
        return [NodeSpec.from_dict(d) for d in self.config["nodeSpecs"]]

    @property
    def node_selector(self) -> dict[str, str]:
        """A ``nodeSelector`` for this cluster's nodes only: on a given API server (existing mode)
        others are beside them, and a pod on another local cluster's node is not this agent's
        (its volumes and the names it resolves differ)."""
        return {CLUSTER_LABEL: str(self.config.get("clusterId", ""))}

    @property
    def kubeconfig(self) -> Path:
        if self.mode == "existing":
            return Path(self.config["externalKubeconfig"])
        return self.state_dir / "kubeconfig"

    @property
    def log_dir(self) -> Path:
        """Where container logs go; in embedded mode the API server serves pods/log from here."""
        if self.mode == "embedded":
            return self.state_dir / "apiserver" / "pods"
        return self.state_dir / "pods"

    def _load_config(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.config_path.read_text())
        except FileNotFoundError:
            return {"version": CONFIG_VERSION}
        except ValueError as exc:
            raise LocalClusterError(f"{self.config_path}: unreadable ({exc}); delete it to start afresh") from exc
        return data

    def _save_config(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.config_path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(self.config, fh, indent=2)
        os.replace(tmp, self.config_path)

    def _shape(
        self,
        nodes: int | None,
        gpus: int | None,
        topology: str | None,
        topology_file: Path | str | None,
        cpu: str | None,
        memory: str | None,
    ) -> ClusterShape:
        import yaml

        base = ClusterShape()
        if topology_file is not None:
            doc = yaml.safe_load(Path(topology_file).read_text()) or {}
            if not isinstance(doc, dict):
                raise LocalClusterError(f"{topology_file}: a topology file must be a YAML mapping")
            base = parse_topology_file(doc)
        else:
            prev = self.config.get("shape") or {}
            if prev:
                base = parse_topology_file(prev)
        return ClusterShape(
            nodes=nodes if nodes is not None else base.nodes,
            gpus_per_node=gpus if gpus is not None else base.gpus_per_node,
            levels=parse_topology_spec(topology) if topology else base.levels,
            cpu=cpu or base.cpu,
            memory=memory or base.memory,
            max_pods=base.max_pods,
            name_prefix=base.name_prefix,
            ip_offset=base.ip_offset,
        )

    # --- lifecycle ---
    def start(self, timeout: float = 60.0) -> Path:
        """Start the control plane (per mode) and the runtime; returns the kubeconfig path."""
        if self._procs:
            return self.kubeconfig
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "run").mkdir(exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.mode == "embedded":
                self._start_embedded(timeout)
            elif self.mode == "envtest":
                self._start_envtest(timeout)
            else:
                self._refuse_foreign_nodes()
            if self.mode == "existing":
                unpublish_operator_address(self.state_dir)  # its kubeconfig is not ours to write beside
            else:
                publish_operator_address(self.state_dir, self._operator_port())
            self._save_config()
            self._start_runtime(timeout)
            if self.with_operator:
                self._start_operator()
        except BaseException:
            self.stop()
            raise
        return self.kubeconfig

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log_path = self.state_dir / "logs" / f"{name}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env or dict(os.environ),
                preexec_fn=_stop_with_us,
            )
        self._procs[name] = proc
        return proc

    def _wait_file(self, name: str, path: Path, timeout: float) -> dict[str, Any]:
        proc = self._procs[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists():
                try:
                    data: dict[str, Any] = json.loads(path.read_text())
                    return data
                except ValueError:
                    pass
            if proc.poll() is not None:
                log_file = self.state_dir / "logs" / f"{name}.log"
                raise LocalClusterError(
                    f"{name} exited with code {proc.returncode} while starting; log {log_file}:\n{_tail(log_file)}"
                )
            time.sleep(0.05)
        raise LocalClusterError(
            f"{name} not ready after {timeout:.0f}s; see {self.state_dir / 'logs' / (name + '.log')}"
        )

    def _start_embedded(self, timeout: float) -> None:
        port = int(self.config.get("port") or 0)
        if not port or not _port_free(port):
            port = _free_port()
        self.config["port"] = port
        ready = self.state_dir / "run" / "apiserver.json"
        ready.unlink(missing_ok=True)
        self._spawn(
            "apiserver",
            [
                self.python, "-m", "railyard_local.apiserver",
                "--state-dir", str(self.state_dir / "apiserver"),
                "--host", "127.0.0.1",
                "--port", str(port),
                "--token-file", str(self._write_token()),
                "--ready-file", str(ready),
                *(["--no-node-lifecycle"] if self.node_monitor_grace_period is None
                  else ["--node-monitor-grace-period", str(self.node_monitor_grace_period)]),
            ],
        )
        info = self._wait_file("apiserver", ready, timeout)
        self.url = str(info.get("url") or f"http://127.0.0.1:{port}")
        ca = info.get("caFile") or info.get("ca")
        write_kubeconfig(self.kubeconfig, self.url, self.token, ca_file=str(ca) if ca else None)

    def _write_token(self) -> Path:
        """The token in a 0600 file, so that it shows in no process listing."""
        path = self.state_dir / "run" / "token"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.token)
        return path

    def _start_envtest(self, timeout: float) -> None:
        try:
            envtest = importlib.import_module("railyard_local.apiserver.envtest")
        except ImportError as exc:
            raise LocalClusterError(f"envtest mode is not available in this build: {exc}") from exc
        assets = envtest.assets_dir()
        if assets is None:
            raise LocalClusterError(
                "envtest mode: KUBEBUILDER_ASSETS must name a folder with kube-apiserver and etcd "
                "(e.g. from `setup-envtest use -p path`)"
            )
        self._envtest = envtest.start_envtest(assets, self.state_dir / "envtest", timeout_s=timeout)
        self.url = str(self._envtest.url)
        write_kubeconfig(self.kubeconfig, self.url, str(self._envtest.token), ca_file=str(self._envtest.ca_file))

    def _start_runtime(self, timeout: float) -> None:
        ready = self.state_dir / "run" / "runtime.json"
        ready.unlink(missing_ok=True)
        argv = [
            self.python, "-m", "railyard_local.runtime",
            "--kubeconfig", str(self.kubeconfig),
            "--state-dir", str(self.state_dir),
            "--config", str(self.config_path),
            "--log-dir", str(self.log_dir),
            "--ready-file", str(ready),
            "--lease-interval", str(self.lease_interval),
        ]
        if self.mode == "embedded":
            # our server bookmarks every 15 s; other servers about every minute (the default)
            argv += ["--watch-inactivity", str(EMBEDDED_WATCH_INACTIVITY_S)]
        if self.config.get("scheduler"):
            argv.append("--scheduler")
        client_ca = self.kubelet_client_ca()
        if client_ca is not None:
            argv += ["--kubelet-client-ca", str(client_ca)]
        self._spawn("runtime", argv)
        self._wait_file("runtime", ready, timeout)

    def kubelet_client_ca(self) -> Path | None:
        """The CA whose client certificates may read container logs from the node agent's
        kubelet endpoint (local/kubelet.py): ``kubelet_client_ca`` if given; embedded and
        envtest: our CA (envtest's kube-apiserver gets a kubelet client certificate from it);
        existing: the kubeconfig's CA (kubeadm and kind sign the API server's kubelet client
        certificate with it). None: no CA known, logs are not served."""
        if self.config.get("kubeletClientCA"):
            return Path(self.config["kubeletClientCA"])
        if self.mode == "embedded":
            return self.state_dir / "apiserver" / "pki" / "ca.crt"
        if self.mode == "envtest":
            return Path(self._envtest.ca_file) if self._envtest is not None else None
        return kubeconfig_ca(self.kubeconfig, self.state_dir / "run" / "kubeconfig-ca.crt")

    def _operator_port(self) -> int:
        """The operator's port on loopback: the one this state dir used before while it is free
        (an operator restarted by hand finds the pods' address again), else a free one."""
        port = int(self.config.get("operatorPort") or 0)
        if not port or not _port_free(port):
            port = _free_port()
        self.config["operatorPort"] = port
        return port

    def _start_operator(self) -> None:
        """``railyard operator run`` with its heartbeat server on loopback, where pods reach it
        (the published address, local/operator_address.py; chosen here in existing mode)."""
        port = int(self.config.get("operatorPort") or 0) if self.mode != "existing" else self._operator_port()
        self._save_config()
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        args = [
            "operator", "run", "--standalone",
            "--metrics-host", LOOPBACK, "--metrics-port", str(port),
            "--heartbeat-advertise-url", f"http://{LOOPBACK}:{port}",
        ]
        code = f"import sys; from railyard.cli import main; sys.exit(main({args!r}))"
        self._spawn("operator", [self.python, "-c", code], env=env)

    def exited(self) -> str | None:
        """The name of a control-plane child that has exited (the cluster is broken), or None."""
        for name, proc in self._procs.items():
            if name != "operator" and proc.poll() is not None:
                return name
        return None

    def operator_exit_code(self) -> int | None:
        """The operator's exit code once it has exited (the cluster keeps running), else None."""
        proc = self._procs.get("operator")
        return None if proc is None else proc.poll()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the runtime first (it kills every pod process), then the operator and server."""
        for name in ("runtime", "operator", "apiserver"):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        if self._envtest is not None:
            with contextlib.suppress(Exception):
                self._envtest.stop()
            self._envtest = None

    def remove_nodes(self) -> None:
        """Delete this cluster's nodes from its API server: in existing mode, the given cluster is
        left with the nodes it had (tests and benchmarks on a real server). After ``stop()``: a
        running runtime registers them again."""
        import asyncio

        asyncio.run(self._remove_nodes())

    async def _remove_nodes(self) -> None:
        from railyard_local.kube import ApiError, KubeClient

        names = {spec.name for spec in self.node_specs}
        async with KubeClient.from_kubeconfig(str(self.kubeconfig)) as client:
            ours = await client.get("/api/v1/nodes", labelSelector=f"{CLUSTER_LABEL}={self.config.get('clusterId')}")
            for node in ours.get("items") or []:
                name = (node.get("metadata") or {}).get("name", "")
                if name not in names:
                    continue
                try:
                    await client.delete(f"/api/v1/nodes/{name}")
                except ApiError as exc:
                    if exc.status != 404:
                        raise

    def _refuse_foreign_nodes(self) -> None:
        """Existing mode: a node of one of our names that is not this cluster's (a real node, or
        another local cluster's) is never taken over: the runtime would relabel it and run pods
        bound to it, and ``remove_nodes`` would delete it."""
        import asyncio

        from railyard_local.kube import KubeClient

        async def foreign() -> list[str]:
            async with KubeClient.from_kubeconfig(str(self.kubeconfig)) as client:
                listing = await client.get("/api/v1/nodes")
            names = {spec.name for spec in self.node_specs}
            return sorted(
                str(n["metadata"]["name"]) for n in listing.get("items") or []
                if n["metadata"]["name"] in names
                and ((n["metadata"].get("labels") or {}).get(CLUSTER_LABEL) != self.config.get("clusterId"))
            )

        taken = asyncio.run(foreign())
        if taken:
            raise LocalClusterError(
                f"{self.kubeconfig}: the cluster already has nodes named {', '.join(taken[:5])}"
                f"{' ...' if len(taken) > 5 else ''} that are not this local cluster's; give ours other names "
                "(node_prefix, or namePrefix in a topology file) or delete those nodes"
            )

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
