"""Where the API server is and who we are to it, kept valid for the life of the process.

Credentials expire. A kubeconfig exec plugin (``aws eks get-token``, ``gke-gcloud-auth-plugin``,
``kubelogin``) hands out tokens that live about 15 minutes, with an ``expirationTimestamp``; a
pod's projected service-account token is rotated on disk by the kubelet. Reading the token once
at start-up, as the operator used to, fails an hour later while kopf's own client goes on. So,
as client-go does:

* an exec plugin is run again once its credential has expired, and after the server answers
  401 to it (:class:`ExecPlugin`);
* a token file (``tokenFile`` in a kubeconfig, the in-cluster service-account token) is re-read
  every minute and after a 401 (:class:`TokenFile`);
* a token or certificate written into the kubeconfig never changes (:class:`Static`).

The callers (``railyard.kubeclient.BaseClient``, and the operator's kopf login handler) ask
:meth:`Credentials.current` before a request and call :meth:`Credentials.invalidate` with what
the server refused; they retry a refused request once.

:func:`load_connection` reads kubeconfigs itself (``$KUBECONFIG`` lists merged the way kubectl
merges them: the first file to name an entry wins) so that it knows which kind of credential a
user has. Like the other clients here, this module imports no other ``railyard`` module.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import contextlib
import datetime as dt
import json
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "EXEC_API_VERSIONS",
    "SERVICE_ACCOUNT_DIR",
    "Connection",
    "Credential",
    "Credentials",
    "ExecPlugin",
    "KubeAuthError",
    "KubeConfigError",
    "Static",
    "TokenFile",
    "load_connection",
]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: client-go re-reads a token file this often (and after a 401).
TOKEN_FILE_PERIOD_S = 60.0
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_TIMEOUT_S = 120.0
Obj = dict[str, Any]


class KubeConfigError(ValueError):
    """The kubeconfig (or the in-cluster environment) cannot be used; the message says why."""


class KubeAuthError(RuntimeError):
    """A credential could not be obtained now (an exec plugin failed, a token file is empty)."""


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Credential:
    """What goes on a request, valid until ``expires`` (aware UTC; None: until refused)."""

    token: str | None = None
    username: str | None = None
    password: str | None = None
    #: A client certificate and key (PEM files), from the kubeconfig or an exec plugin.
    cert_file: str | None = None
    key_file: str | None = None
    expires: dt.datetime | None = None

    @property
    def authorization(self) -> str | None:
        """The ``Authorization`` header value, or None (a client certificate, or nothing)."""
        if self.token:
            return self.token if self.token.lower().startswith("bearer ") else f"Bearer {self.token}"
        if self.username is not None and self.password is not None:
            raw = f"{self.username}:{self.password}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return None


class Credentials:
    """A source of :class:`Credential`; subclasses decide when a new one is needed."""

    async def current(self) -> Credential:
        raise NotImplementedError

    def invalidate(self, used: Credential) -> bool:
        """The server refused ``used`` (401). True when asking :meth:`current` again may give a
        different credential (worth one retry); False when it would give the same."""
        return False

    @property
    def refreshes(self) -> bool:
        """Whether credentials change over time (clients then set them per request)."""
        return False


class Static(Credentials):
    """A token, basic auth or client certificate written into the kubeconfig."""

    def __init__(self, credential: Credential | None = None) -> None:
        self.credential = credential or Credential()

    async def current(self) -> Credential:
        return self.credential


class TokenFile(Credentials):
    """A bearer token in a file that something else rotates (the kubelet, for a pod's projected
    service-account token): re-read every ``period_s`` and after a 401."""

    def __init__(self, path: str | Path, *, period_s: float = TOKEN_FILE_PERIOD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.period_s = period_s
        self._clock = clock
        self._cached: Credential | None = None
        self._read_at = 0.0

    @property
    def refreshes(self) -> bool:
        return True

    async def current(self) -> Credential:
        now = self._clock()
        if self._cached is None or now - self._read_at >= self.period_s:
            try:
                token = self.path.read_text().strip()
            except OSError as exc:
                raise KubeAuthError(f"cannot read the token file {self.path}: {exc}") from exc
            if not token:
                raise KubeAuthError(f"the token file {self.path} is empty")
            # kopf re-asks at `expires`, so its client re-reads the file as often as ours.
            self._cached = Credential(token=token, expires=_utcnow() + dt.timedelta(seconds=self.period_s))
            self._read_at = now
        return self._cached

    def invalidate(self, used: Credential) -> bool:
        if self._cached is not None and self._cached.token == used.token:
            self._cached = None
        return True


class ExecPlugin(Credentials):
    """A kubeconfig ``exec`` credential plugin (client.authentication.k8s.io v1 or v1beta1).

    The plugin runs without a terminal (the operator is a service), with ``KUBERNETES_EXEC_INFO``
    set as client-go sets it. Its credential is kept until its ``expirationTimestamp`` (none:
    until the server refuses it); then, or after a 401, the plugin runs again. Concurrent callers
    wait for one run.
    """

    def __init__(self, config: Mapping[str, Any], *, base_dir: Path | None = None,
                 cluster: Mapping[str, Any] | None = None,
                 clock: Callable[[], dt.datetime] = _utcnow) -> None:
        api_version = str(config.get("apiVersion") or "")
        if api_version not in EXEC_API_VERSIONS:
            raise KubeConfigError(
                f"users[].user.exec.apiVersion {api_version!r} is not supported; use one of "
                f"{', '.join(EXEC_API_VERSIONS)} (v1alpha1 was removed in Kubernetes 1.24)")
        command = str(config.get("command") or "")
        if not command:
            raise KubeConfigError("users[].user.exec.command is missing: name the credential plugin to run")
        if os.sep in command and not os.path.isabs(command) and base_dir is not None:
            command = str(base_dir / command)  # as client-go: relative to the kubeconfig's folder
        mode = config.get("interactiveMode") or ("IfAvailable" if api_version.endswith("v1beta1") else None)
        if mode == "Always":
            raise KubeConfigError(
                f"users[].user.exec: the plugin {command!r} needs a terminal (interactiveMode: Always), "
                "and the operator has none; use a non-interactive plugin or a service-account token")
        self.api_version = api_version
        self.argv = [command, *(str(a) for a in config.get("args") or ())]
        self.env = {str(e["name"]): str(e["value"]) for e in config.get("env") or ()}
        self.install_hint = str(config.get("installHint") or "")
        self.cluster = dict(cluster) if config.get("provideClusterInfo") and cluster is not None else None
        self._clock = clock
        self._cached: Credential | None = None
        self._lock = asyncio.Lock()
        self._certs: tempfile.TemporaryDirectory[str] | None = None
        #: how many times the plugin ran (tests and logs)
        self.runs = 0

    @property
    def refreshes(self) -> bool:
        return True

    def _fresh(self, cred: Credential | None) -> bool:
        return cred is not None and (cred.expires is None or self._clock() < cred.expires)

    async def current(self) -> Credential:
        if self._fresh(self._cached):
            assert self._cached is not None
            return self._cached
        async with self._lock:
            if not self._fresh(self._cached):  # another caller may have run it meanwhile
                self._cached = await self._run()
            assert self._cached is not None
            return self._cached

    def invalidate(self, used: Credential) -> bool:
        if self._cached == used:
            self._cached = None
        return True

    async def _run(self) -> Credential:
        info: Obj = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": {"interactive": False}}
        if self.cluster is not None:
            info["spec"]["cluster"] = self.cluster
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        self.runs += 1
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            hint = f" ({self.install_hint.strip()})" if self.install_hint.strip() else ""
            raise KubeAuthError(f"exec credential plugin {self.argv[0]!r} cannot run: {exc}{hint}") from exc
        try:
            async with asyncio.timeout(EXEC_TIMEOUT_S):
                out, err = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise KubeAuthError(
                f"exec credential plugin {self.argv[0]!r} did not answer in {EXEC_TIMEOUT_S:.0f} s"
            ) from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-500:]
            raise KubeAuthError(f"exec credential plugin {self.argv[0]!r} exited {proc.returncode}: {tail}")
        return self._parse(out.decode(errors="replace"))

    def _parse(self, text: str) -> Credential:
        what = f"exec credential plugin {self.argv[0]!r}"
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise KubeAuthError(f"{what} printed no ExecCredential JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
            raise KubeAuthError(
                f"{what} printed no ExecCredential (kind {doc.get('kind') if isinstance(doc, dict) else None!r})"
            )
        if doc.get("apiVersion") != self.api_version:
            raise KubeAuthError(
                f"{what} answered apiVersion {doc.get('apiVersion')!r}, the kubeconfig asks for {self.api_version!r}"
            )
        status = doc.get("status") or {}
        expires = None
        if status.get("expirationTimestamp"):
            try:
                expires = dt.datetime.fromisoformat(str(status["expirationTimestamp"]).replace("Z", "+00:00"))
            except ValueError as exc:
                raise KubeAuthError(f"{what}: status.expirationTimestamp is not RFC 3339: {exc}") from exc
            if expires.tzinfo is None:
                expires = expires.replace(tzinfo=dt.UTC)
        if status.get("token"):
            return Credential(token=str(status["token"]), expires=expires)
        if status.get("clientCertificateData") and status.get("clientKeyData"):
            cert, key = self._write_pair(str(status["clientCertificateData"]), str(status["clientKeyData"]))
            return Credential(cert_file=cert, key_file=key, expires=expires)
        raise KubeAuthError(f"{what}: status has neither token nor clientCertificateData with clientKeyData")

    def _write_pair(self, cert: str, key: str) -> tuple[str, str]:
        if self._certs is None:
            self._certs = tempfile.TemporaryDirectory(prefix="railyard-exec-")
        for old in os.listdir(self._certs.name):  # sessions load the pair when made: only the newest is needed
            os.unlink(os.path.join(self._certs.name, old))
        n = self.runs
        paths = (os.path.join(self._certs.name, f"cert-{n}.pem"), os.path.join(self._certs.name, f"key-{n}.pem"))
        for path, data in zip(paths, (cert, key), strict=True):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(data)
        return paths


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to authenticate to it."""

    server: str
    credentials: Credentials = field(default_factory=Static)
    #: The CA to trust (a file; kubeconfig ``certificate-authority-data`` is written to one).
    ca_file: str | None = None
    insecure: bool = False
    #: The context's namespace, when it names one.
    namespace: str | None = None

    @property
    def token(self) -> str | None:
        """The token of a kubeconfig that writes one in (None where tokens refresh)."""
        if isinstance(self.credentials, Static):
            return self.credentials.credential.token
        return None

    def ssl_context_for(self, credential: Credential | None) -> ssl.SSLContext | bool | None:
        """TLS settings for a session presenting ``credential``'s client certificate, if any."""
        if not self.server.startswith("https"):
            return None
        if self.insecure:
            return False
        ctx = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()
        if credential is not None and credential.cert_file:
            ctx.load_cert_chain(credential.cert_file, credential.key_file)
        return ctx

    @property
    def ssl_context(self) -> ssl.SSLContext | bool | None:
        """TLS settings with the kubeconfig's own client certificate (if it has one)."""
        static = self.credentials.credential if isinstance(self.credentials, Static) else None
        return self.ssl_context_for(static)


# --- loading -----------------------------------------------------------------------------------


def _kubeconfig_paths(kubeconfig: str | None) -> tuple[list[Path], bool]:
    """The files to merge, and whether the caller named them (then they must exist)."""
    if kubeconfig:
        return [Path(p).expanduser() for p in kubeconfig.split(os.pathsep) if p], True
    env = os.environ.get("KUBECONFIG", "")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p], False
    return [Path("~/.kube/config").expanduser()], False


@dataclass
class _Merged:
    current_context: str | None = None
    entries: dict[str, dict[str, tuple[Obj, Path]]] = field(
        default_factory=lambda: {"clusters": {}, "contexts": {}, "users": {}})


def _merge(paths: Sequence[Path]) -> _Merged:
    import yaml

    merged = _Merged()
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise KubeConfigError(f"kubeconfig {path} is not YAML: {exc}") from exc
        if not isinstance(doc, dict):
            raise KubeConfigError(f"kubeconfig {path} is not a mapping")
        merged.current_context = merged.current_context or doc.get("current-context") or None
        for kind, inner in (("clusters", "cluster"), ("contexts", "context"), ("users", "user")):
            for item in doc.get(kind) or ():
                if isinstance(item, dict) and item.get("name") is not None:
                    merged.entries[kind].setdefault(str(item["name"]), (dict(item.get(inner) or {}), path.parent))
    return merged


_TEMP_FILES: list[str] = []


@atexit.register
def _remove_temp_files() -> None:
    for name in _TEMP_FILES:
        with contextlib.suppress(OSError):
            os.unlink(name)


def _file_or_data(entry: Obj, file_key: str, data_key: str, base: Path, *, decode: bool = True) -> str | None:
    """A path to the entry's file, or to a private temp file (removed at exit) holding its
    (base64) data: ssl and kopf take certificates as files."""
    data = entry.get(data_key)
    if data:
        raw = base64.b64decode(data) if decode else str(data).encode()
        fd, name = tempfile.mkstemp(prefix="railyard-kube-", suffix=".pem")
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        _TEMP_FILES.append(name)
        return name
    if entry.get(file_key):
        p = Path(str(entry[file_key])).expanduser()
        return str(p if p.is_absolute() else base / p)
    return None


def _from_kubeconfig(paths: Sequence[Path], context: str | None) -> Connection:
    merged = _merge(paths)
    where = ", ".join(str(p) for p in paths)
    name = context or merged.current_context
    if not name:
        raise KubeConfigError(f"kubeconfig {where}: no current-context; pass --context")
    if name not in merged.entries["contexts"]:
        known = ", ".join(sorted(merged.entries["contexts"])) or "none"
        raise KubeConfigError(f"kubeconfig {where}: context {name!r} not found (contexts: {known})")
    ctx, _ = merged.entries["contexts"][name]
    cluster_name, user_name = ctx.get("cluster"), ctx.get("user")
    if cluster_name not in merged.entries["clusters"]:
        raise KubeConfigError(
            f"kubeconfig {where}: context {name!r} names cluster {cluster_name!r}, which is not defined"
        )
    cluster, cbase = merged.entries["clusters"][str(cluster_name)]
    user, ubase = merged.entries["users"].get(str(user_name), ({}, cbase))
    server = str(cluster.get("server") or "").rstrip("/")
    if not server:
        raise KubeConfigError(f"kubeconfig {where}: cluster {cluster_name!r} has no server")
    ca_file = _file_or_data(cluster, "certificate-authority", "certificate-authority-data", cbase)
    cert = _file_or_data(user, "client-certificate", "client-certificate-data", ubase)
    key = _file_or_data(user, "client-key", "client-key-data", ubase)
    creds: Credentials
    if user.get("exec"):
        info = {k: v for k, v in cluster.items() if k not in ("certificate-authority", "extensions")}
        if ca_file and "certificate-authority-data" not in info:
            info["certificate-authority-data"] = base64.b64encode(Path(ca_file).read_bytes()).decode()
        for ext in cluster.get("extensions") or ():
            if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
                info["config"] = ext.get("extension")
        creds = ExecPlugin(user["exec"], base_dir=ubase, cluster=info)
    elif user.get("tokenFile"):
        p = Path(str(user["tokenFile"])).expanduser()
        creds = TokenFile(p if p.is_absolute() else ubase / p)
    elif user.get("auth-provider"):
        provider = (user["auth-provider"] or {}).get("name", "?")
        raise KubeConfigError(
            f"kubeconfig {where}: user {user_name!r} uses the removed auth-provider {provider!r}; "
            "switch it to its exec plugin (e.g. gke-gcloud-auth-plugin, kubelogin)")
    else:
        creds = Static(Credential(
            token=str(user["token"]) if user.get("token") else None,
            username=user.get("username"), password=user.get("password"),
            cert_file=cert, key_file=key,
        ))
    return Connection(server, creds, ca_file=ca_file, insecure=bool(cluster.get("insecure-skip-tls-verify")),
                      namespace=ctx.get("namespace") or None)


def _in_cluster(sa_dir: Path = SERVICE_ACCOUNT_DIR) -> Connection:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError("no kubeconfig found and not in a pod (KUBERNETES_SERVICE_HOST/PORT unset): "
                              "pass --kubeconfig or set $KUBECONFIG")
    token = sa_dir / "token"
    if not token.exists():
        raise KubeConfigError(f"in a pod, but {token} is missing: is automountServiceAccountToken false?")
    host = f"[{host}]" if ":" in host else host
    ca = sa_dir / "ca.crt"
    ns_file = sa_dir / "namespace"
    return Connection(f"https://{host}:{port}", TokenFile(token), ca_file=str(ca) if ca.exists() else None,
                      namespace=ns_file.read_text().strip() if ns_file.exists() else None)


def load_connection(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """From a kubeconfig (``None``: $KUBECONFIG or ~/.kube/config), else in-cluster.

    The in-cluster fallback applies only when no kubeconfig was named and none exists; a named
    one that cannot be read raises :class:`KubeConfigError`.
    """
    paths, named = _kubeconfig_paths(kubeconfig)
    existing = [p for p in paths if p.exists()]
    if named and len(existing) < len(paths):
        missing = ", ".join(str(p) for p in paths if not p.exists())
        raise KubeConfigError(f"kubeconfig {missing} does not exist")
    if existing:
        return _from_kubeconfig(existing, context)
    if context:
        raise KubeConfigError(f"--context {context}: no kubeconfig found ({', '.join(map(str, paths))})")
    return _in_cluster()
