"""Start a real kube-apiserver and etcd on loopback (controller-runtime's envtest convention).

``KUBEBUILDER_ASSETS`` names a folder holding ``kube-apiserver`` and ``etcd``. The API server
gets a serving certificate from our own CA (pki.py), a dedicated RSA key pair for
service-account tokens, a static bearer token for a user in ``system:masters``, and no
controller manager: garbage collection and namespace cleanup do not
run there (as in envtest), which callers must expect.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from railyard.protocol.ports import free_port as _free_port

from .kubeconfig import write_kubeconfig
from .pki import (
    ServiceAccountKeys,
    ServingCerts,
    ensure_certs,
    ensure_service_account_keys,
    issue_cert,
)


def assets_dir() -> Path | None:
    """The envtest assets folder from ``KUBEBUILDER_ASSETS``, when it holds both binaries."""
    value = os.environ.get("KUBEBUILDER_ASSETS")
    if not value:
        return None
    p = Path(value)
    if (p / "kube-apiserver").exists() and (p / "etcd").exists():
        return p
    return None


@dataclass
class EnvtestCluster:
    url: str
    token: str
    ca_file: Path
    kubeconfig: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for p in reversed(self.processes):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.processes):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def apiserver_args(*, etcd_url: str, port: int, cert_dir: Path, certs: ServingCerts, tokens: Path,
                   sa_keys: ServiceAccountKeys, kubelet_client: tuple[Path, Path] | None = None) -> list[str]:
    """kube-apiserver's command line, as controller-runtime's envtest starts it: loopback only,
    our serving certificate, a static admin token, RBAC, service-account tokens signed with a
    dedicated RSA key. The ServiceAccount admission plugin is off: without a controller manager
    no namespace gets its ``default`` ServiceAccount, and every pod would be refused.
    ``kubelet_client`` (certificate, key): what it shows the node agent's kubelet endpoint when
    it reads container logs (local/kubelet.py requires a certificate of our CA)."""
    kubelet = (
        [f"--kubelet-client-certificate={kubelet_client[0]}", f"--kubelet-client-key={kubelet_client[1]}"]
        if kubelet_client
        else []
    )
    return [*kubelet,
        f"--etcd-servers={etcd_url}", "--advertise-address=127.0.0.1", "--bind-address=127.0.0.1",
        f"--secure-port={port}", f"--cert-dir={cert_dir}",
        f"--tls-cert-file={certs.cert}", f"--tls-private-key-file={certs.key}",
        f"--token-auth-file={tokens}", "--authorization-mode=RBAC", "--anonymous-auth=false",
        "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
        f"--service-account-issuer=https://127.0.0.1:{port}",
        f"--service-account-key-file={sa_keys.public_key}",
        f"--service-account-signing-key-file={sa_keys.private_key}",
        "--disable-admission-plugins=ServiceAccount",
    ]


def start_envtest(assets: Path, work_dir: Path, *, timeout_s: float = 90.0) -> EnvtestCluster:
    """Start etcd and kube-apiserver from ``assets`` with state in ``work_dir``; wait until ready."""
    work_dir.mkdir(parents=True, exist_ok=True)
    certs = ensure_certs(work_dir / "pki")
    token = secrets.token_hex(16)
    tokens = work_dir / "tokens.csv"
    tokens.write_text(f'{token},railyard-admin,railyard-admin,"system:masters"\n')
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    logs = work_dir / "logs"
    logs.mkdir(exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    etcd = subprocess.Popen(
        [str(assets / "etcd"), "--data-dir", str(work_dir / "etcd"),
         "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-cluster", f"default=http://127.0.0.1:{peer_port}", "--unsafe-no-fsync"],
        stdout=(logs / "etcd.log").open("wb"), stderr=subprocess.STDOUT,
    )
    procs.append(etcd)
    sa_keys = ensure_service_account_keys(work_dir / "pki")
    kubelet_client = issue_cert(
        work_dir / "pki", "apiserver-kubelet-client", common_name="kube-apiserver-kubelet-client", client=True
    )
    apiserver = subprocess.Popen(
        [str(assets / "kube-apiserver"), *apiserver_args(
            etcd_url=f"http://127.0.0.1:{etcd_port}", port=api_port, cert_dir=work_dir / "certs", certs=certs,
            tokens=tokens, sa_keys=sa_keys, kubelet_client=kubelet_client)],
        stdout=(logs / "kube-apiserver.log").open("wb"), stderr=subprocess.STDOUT,
    )
    procs.append(apiserver)
    url = f"https://127.0.0.1:{api_port}"
    cluster = EnvtestCluster(url, token, certs.ca_cert, work_dir / "kubeconfig", procs)
    ctx = ssl.create_default_context(cafile=str(certs.ca_cert))
    deadline = time.monotonic() + timeout_s
    while True:
        if any(p.poll() is not None for p in procs):
            cluster.stop()
            raise RuntimeError(f"envtest binaries exited early; see logs in {logs}")
        req = urllib.request.Request(f"{url}/readyz", headers={"Authorization": f"Bearer {token}"})
        with contextlib.suppress(OSError), urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
            if resp.status == 200:
                break
        if time.monotonic() > deadline:
            cluster.stop()
            raise TimeoutError(f"kube-apiserver not ready after {timeout_s} s; see logs in {logs}")
        time.sleep(0.5)
    write_kubeconfig(cluster.kubeconfig, url, token, ca_file=certs.ca_cert, name="railyard-envtest")
    return cluster
