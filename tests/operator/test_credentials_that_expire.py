"""Credentials that expire keep working: kubeconfig exec plugins (EKS, GKE, AKS) and rotated
service-account token files are renewed on expiry and after a 401, for our client and kopf's.

The exec plugin here is a real script run as a subprocess, handing out short-lived tokens that
the embedded API server accepts until they expire (its ``accept_token_file`` hook).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.waiting import wait_until_async

from railyard.k8s.client import ApiError, Kube
from railyard.kubecreds import (
    Credential,
    ExecPlugin,
    KubeAuthError,
    KubeConfigError,
    Static,
    TokenFile,
    _in_cluster,
    load_connection,
)

#: Mints a token per run, appends "TOKEN EXPIRES" to the server's accepted-token file (unless
#: MINT_UNGRANTED is set) and prints the ExecCredential. argv: accepted-token file, lifetime in
#: seconds, apiVersion.
PLUGIN = r"""
import datetime as dt, json, os, secrets, sys, time
accept, lifetime, api_version = sys.argv[1], float(sys.argv[2]), sys.argv[3]
token = "exec-" + secrets.token_hex(8)
expires = time.time() + lifetime
if not os.environ.get("MINT_UNGRANTED"):
    with open(accept, "a") as f:
        f.write(f"{token} {expires}\n")
with open(accept + ".runs", "a") as f:
    f.write(json.dumps({"token": token, "info": json.loads(os.environ["KUBERNETES_EXEC_INFO"])}) + "\n")
stamp = dt.datetime.fromtimestamp(expires, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
print(json.dumps({"apiVersion": api_version, "kind": "ExecCredential",
                  "status": {"token": token, "expirationTimestamp": stamp}}))
"""


def write_plugin(tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "mint-token"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"#!{sys.executable}\n{PLUGIN}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def exec_kubeconfig(path: Path, server: str, ca_file: Path | None, plugin: Path, accept: Path, *,
                    lifetime_s: float, api_version: str = "client.authentication.k8s.io/v1") -> Path:
    cluster: dict[str, Any] = {"server": server}
    if ca_file:
        cluster["certificate-authority-data"] = base64.b64encode(ca_file.read_bytes()).decode()
    exec_cfg: dict[str, Any] = {"apiVersion": api_version, "command": str(plugin),
                                "args": [str(accept), str(lifetime_s), api_version], "provideClusterInfo": True}
    if api_version.endswith("/v1"):
        exec_cfg["interactiveMode"] = "Never"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "eks",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"exec": exec_cfg}}],
        "contexts": [{"name": "eks", "context": {"cluster": "c", "user": "u"}}],
    }))
    return path


def runs(accept: Path) -> list[dict[str, Any]]:
    f = Path(str(accept) + ".runs")
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


@pytest.fixture
async def apiserver(tmp_path: Path) -> Any:
    """The embedded API server in this process, accepting the tokens listed in ``accept``."""
    from railyard_local.apiserver.server import APIServer

    accept = tmp_path / "accepted-tokens"
    accept.write_text("")
    server = APIServer(tmp_path / "state", token="admin-not-given-to-clients", accept_token_file=accept)
    await server.start()
    try:
        yield server, accept
    finally:
        await server.stop()


# --- against the embedded API server ------------------------------------------------------------


async def test_the_client_picks_up_a_new_token_after_the_first_expires(apiserver: Any, tmp_path: Path) -> None:
    server, accept = apiserver
    kubeconfig = exec_kubeconfig(tmp_path / "kubeconfig", server.url, server.ca_file, write_plugin(tmp_path),
                                 accept, lifetime_s=2.0)
    kube = Kube.from_config(str(kubeconfig), retries=0)
    try:
        assert await kube.get("/api/v1/namespaces/default") is not None
        before = runs(accept)  # one run (two if a stalled machine let the first token lapse)
        expires = float(accept.read_text().split()[-1])
        # the server refuses the token from its expiry on, as a real one does
        await wait_until_async(lambda: dt.datetime.now(dt.UTC).timestamp() > expires, timeout=10, message="the token to expire")
        assert await kube.get("/api/v1/namespaces/default") is not None
        after = runs(accept)
        assert len(after) > len(before)
        second = after[-1]
        assert second["token"] != before[-1]["token"]
        # client-go's contract: non-interactive, with the cluster when provideClusterInfo is set
        assert second["info"]["spec"]["interactive"] is False
        assert second["info"]["spec"]["cluster"]["server"] == server.url
        assert "certificate-authority-data" in second["info"]["spec"]["cluster"]
    finally:
        await kube.close()


async def test_a_refused_token_is_renewed_and_the_request_retried_once(
    apiserver: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, accept = apiserver
    kubeconfig = exec_kubeconfig(tmp_path / "kubeconfig", server.url, server.ca_file, write_plugin(tmp_path),
                                 accept, lifetime_s=3600.0)
    kube = Kube.from_config(str(kubeconfig), retries=0)
    try:
        assert await kube.get("/api/v1/namespaces/default") is not None
        accept.write_text("")  # revoked long before its expiry: only a 401 can tell the client
        assert await kube.get("/api/v1/namespaces/default") is not None
        assert len(runs(accept)) == 2
        # a token the server refuses even when new: the 401 surfaces after one renewal
        accept.write_text("")
        monkeypatch.setenv("MINT_UNGRANTED", "1")
        with pytest.raises(ApiError) as err:
            await kube.get("/api/v1/namespaces/default")
        assert err.value.status == 401 and len(runs(accept)) == 3
    finally:
        await kube.close()


async def test_concurrent_requests_share_one_plugin_run(apiserver: Any, tmp_path: Path) -> None:
    server, accept = apiserver
    kubeconfig = exec_kubeconfig(tmp_path / "kubeconfig", server.url, server.ca_file, write_plugin(tmp_path),
                                 accept, lifetime_s=3600.0, api_version="client.authentication.k8s.io/v1beta1")
    kube = Kube.from_config(str(kubeconfig), retries=0)
    try:
        got = await asyncio.gather(*(kube.get("/api/v1/namespaces/default") for _ in range(20)))
        assert all(g is not None for g in got) and len(runs(accept)) == 1
    finally:
        await kube.close()


async def test_a_rotated_token_file_is_read_again_after_a_401(apiserver: Any, tmp_path: Path) -> None:
    server, accept = apiserver
    token_file = tmp_path / "sa-token"
    token_file.write_text("sa-token-1\n")
    accept.write_text("sa-token-1\n")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "pod",
        "clusters": [{"name": "c", "cluster": {"server": server.url, "certificate-authority": str(server.ca_file)}}],
        "users": [{"name": "sa", "user": {"tokenFile": "sa-token"}}],  # relative to the kubeconfig
        "contexts": [{"name": "pod", "context": {"cluster": "c", "user": "sa"}}],
    }))
    kube = Kube.from_config(str(kubeconfig), retries=0)
    try:
        assert await kube.get("/api/v1/namespaces/default") is not None
        # the kubelet rotates the projected token; the server stops accepting the old one
        token_file.write_text("sa-token-2\n")
        accept.write_text("sa-token-2\n")
        assert await kube.get("/api/v1/namespaces/default") is not None
    finally:
        await kube.close()


async def test_a_static_token_is_not_retried_on_401(apiserver: Any, tmp_path: Path) -> None:
    server, _ = apiserver
    kube = Kube(server.url, token="never-accepted", ssl_context=load_connection_ssl(server), retries=0)
    try:
        with pytest.raises(ApiError) as err:
            await kube.get("/api/v1/namespaces/default")
        assert err.value.status == 401
    finally:
        await kube.close()


def load_connection_ssl(server: Any) -> Any:
    import ssl

    return ssl.create_default_context(cafile=str(server.ca_file))


# --- the kopf login handler -------------------------------------------------------------------


async def test_kopf_logs_in_with_the_given_context_and_renewed_tokens(apiserver: Any, tmp_path: Path) -> None:
    from railyard.handlers import kopf_handlers
    from railyard.handlers.runtime import OperatorSettings

    server, accept = apiserver
    kubeconfig = exec_kubeconfig(tmp_path / "kubeconfig", server.url, server.ca_file, write_plugin(tmp_path),
                                 accept, lifetime_s=3600.0)
    doc = yaml.safe_load(kubeconfig.read_text())
    # the current context points elsewhere: only --context reaches the right cluster
    doc["clusters"].append({"name": "other", "cluster": {"server": "https://other.invalid:6443"}})
    doc["users"].append({"name": "other", "user": {"token": "other"}})
    doc["contexts"].append({"name": "other", "context": {"cluster": "other", "user": "other", "namespace": "x"}})
    doc["current-context"] = "other"
    kubeconfig.write_text(yaml.safe_dump(doc))

    memo = kopf_handlers.build_memo(OperatorSettings(kubeconfig=str(kubeconfig), context="eks", metrics_port=0))
    rt = kopf_handlers.runtime_of(memo)
    try:
        first = await kopf_handlers.on_login_operator(memo=memo)
        assert first.server == server.url and first.scheme == "Bearer"
        assert first.token == runs(accept)[0]["token"] and first.expiration is not None
        assert first.ca_path and Path(str(first.ca_path)).read_bytes() == server.ca_file.read_bytes()
        # kopf logs in again only when its credential was refused or expired: a new one
        second = await kopf_handlers.on_login_operator(memo=memo)
        assert second.token != first.token and second.token == runs(accept)[1]["token"]
        # and our own client shares the renewed credential (no third plugin run)
        assert await rt.api().get("/api/v1/namespaces/default") is not None
        assert len(runs(accept)) == 2
    finally:
        await rt.close()


# --- unit: when a credential is renewed --------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now


def counting_plugin(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "plugin"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    script.chmod(0o755)
    return script


async def test_an_exec_credential_is_kept_until_its_expiration(tmp_path: Path) -> None:
    script = counting_plugin(tmp_path, """
        import json, pathlib
        n = pathlib.Path(__file__).with_suffix(".n")
        k = int(n.read_text()) + 1 if n.exists() else 1
        n.write_text(str(k))
        expires = f"2026-01-01T0{k - 1}:15:00Z"  # run k: valid until (k - 1) h 15 min
        print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                          "status": {"token": f"t{k}", "expirationTimestamp": expires}}))
    """)
    clock = Clock()
    plugin = ExecPlugin({"apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(script)}, clock=clock)
    a = await plugin.current()
    clock.now += dt.timedelta(minutes=14, seconds=59)
    assert (await plugin.current()).token == a.token == "t1" and plugin.runs == 1
    clock.now += dt.timedelta(seconds=1)
    assert (await plugin.current()).token == "t2" and plugin.runs == 2
    # a 401 to an older credential does not throw away the newer one
    assert plugin.invalidate(a) is True
    assert (await plugin.current()).token == "t2" and plugin.runs == 2


async def test_a_token_file_is_read_again_every_minute() -> None:
    t = [0.0]
    path = Path(__import__("tempfile").mkdtemp()) / "token"
    path.write_text("one")
    creds = TokenFile(path, clock=lambda: t[0])
    assert (await creds.current()).token == "one"
    path.write_text("two")
    t[0] = 59.0
    assert (await creds.current()).token == "one"
    t[0] = 60.0
    assert (await creds.current()).token == "two"
    path.write_text("")
    assert creds.invalidate(await creds.current()) is True
    with pytest.raises(KubeAuthError, match="is empty"):
        await creds.current()


@pytest.mark.parametrize(("output", "code", "message"), [
    ("not json", 0, "printed no ExecCredential JSON"),
    ('{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", "status": {"token": "x"}}', 0,
     "answered apiVersion 'client.authentication.k8s.io/v1beta1'"),
    ('{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {}}', 0,
     "neither token nor clientCertificateData"),
    ("", 3, "exited 3: aws: credentials expired, run aws sso login"),
])
async def test_a_failing_plugin_says_what_went_wrong(tmp_path: Path, output: str, code: int, message: str) -> None:
    script = counting_plugin(tmp_path, f"""
        import sys
        print({output!r})
        if {code}:
            print("aws: credentials expired, run aws sso login", file=sys.stderr)
        sys.exit({code})
    """)
    plugin = ExecPlugin({"apiVersion": "client.authentication.k8s.io/v1", "command": str(script),
                         "interactiveMode": "Never"})
    with pytest.raises(KubeAuthError, match=message.replace("(", r"\(")):
        await plugin.current()


async def test_a_plugin_may_answer_with_a_client_certificate(tmp_path: Path) -> None:
    script = counting_plugin(tmp_path, """
        import json
        print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                          "status": {"clientCertificateData": "CERT", "clientKeyData": "KEY"}}))
    """)
    plugin = ExecPlugin({"apiVersion": "client.authentication.k8s.io/v1", "command": str(script),
                         "interactiveMode": "Never"})
    cred = await plugin.current()
    assert cred.token is None and cred.authorization is None and cred.expires is None
    assert cred.cert_file and cred.key_file
    assert Path(cred.cert_file).read_text() == "CERT" and Path(cred.key_file).read_text() == "KEY"
    assert stat.S_IMODE(Path(cred.key_file).stat().st_mode) == 0o600
    # a renewed pair replaces the old one on disk
    assert plugin.invalidate(cred)
    again = await plugin.current()
    assert again.cert_file != cred.cert_file and Path(str(again.cert_file)).exists()
    assert not Path(cred.cert_file).exists()


@pytest.mark.parametrize(("config", "message"), [
    ({"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}, "v1alpha1 was removed"),
    ({"apiVersion": "client.authentication.k8s.io/v1", "command": ""}, "exec.command is missing"),
    ({"apiVersion": "client.authentication.k8s.io/v1", "command": "x", "interactiveMode": "Always"}, "needs a terminal"),
])
def test_unusable_exec_configs_are_refused_with_the_fix(config: dict[str, Any], message: str) -> None:
    with pytest.raises(KubeConfigError, match=message):
        ExecPlugin(config)


# --- unit: reading kubeconfigs ------------------------------------------------------------------


def test_kubeconfigs_merge_as_kubectl_merges_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text(yaml.safe_dump({
        "current-context": "one",
        "clusters": [{"name": "c1", "cluster": {"server": "https://one:6443/", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "from-a"}}],
        "contexts": [{"name": "one", "context": {"cluster": "c1", "user": "u", "namespace": "ml"}}],
    }))
    b.write_text(yaml.safe_dump({
        "current-context": "two",
        "clusters": [{"name": "c2", "cluster": {"server": "https://two:6443"}}],
        "users": [{"name": "u", "user": {"token": "from-b"}}],
        "contexts": [{"name": "two", "context": {"cluster": "c2", "user": "u"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", f"{a}:{b}")
    conn = load_connection()
    assert (conn.server, conn.token, conn.namespace, conn.insecure) == ("https://one:6443", "from-a", "ml", True)
    assert conn.ssl_context is False
    two = load_connection(context="two")
    assert (two.server, two.token) == ("https://two:6443", "from-a")  # the first file's user "u" wins
    with pytest.raises(KubeConfigError, match=r"context 'three' not found \(contexts: one, two\)"):
        load_connection(context="three")
    with pytest.raises(KubeConfigError, match="does not exist"):
        load_connection(str(tmp_path / "missing"))


def test_without_a_kubeconfig_the_pod_service_account_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "token").write_text("sa")
    (tmp_path / "ca.crt").write_text("CA")
    (tmp_path / "namespace").write_text("railyard-system\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    conn = _in_cluster(tmp_path)
    assert conn.server == "https://[fd00::1]:443" and conn.namespace == "railyard-system"
    assert isinstance(conn.credentials, TokenFile) and conn.ca_file == str(tmp_path / "ca.crt")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(KubeConfigError, match="pass --kubeconfig"):
        _in_cluster(tmp_path)


def test_basic_auth_and_removed_auth_providers(tmp_path: Path) -> None:
    path = tmp_path / "k"
    path.write_text(yaml.safe_dump({
        "current-context": "basic",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "b", "user": {"username": "ann", "password": "pw"}},
                  {"name": "g", "user": {"auth-provider": {"name": "gcp"}}}],
        "contexts": [{"name": "basic", "context": {"cluster": "c", "user": "b"}},
                     {"name": "gcp", "context": {"cluster": "c", "user": "g"}}],
    }))
    conn = load_connection(str(path))
    assert isinstance(conn.credentials, Static)
    assert conn.credentials.credential.authorization == "Basic " + base64.b64encode(b"ann:pw").decode()
    with pytest.raises(KubeConfigError, match="gke-gcloud-auth-plugin"):
        load_connection(str(path), "gcp")
    assert Credential(token="Bearer x").authorization == "Bearer x"
