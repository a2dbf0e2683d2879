"""envtest mode starts a real kube-apiserver (KUBEBUILDER_ASSETS): the command line and the key
files it gets must be what kube-apiserver accepts. Checked without the binaries, which no package
registry ships: the flags are kube-apiserver's documented ones and the key files parse as the
key types it reads (``--service-account-key-file``: PEM public keys; the signing key: an RSA or
EC private key in its own PEM type, never the PKCS#8 ECDSA serving key it refused)."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.hashes import SHA256

from railyard_local.apiserver.envtest import apiserver_args
from railyard_local.apiserver.pki import ensure_certs, ensure_service_account_keys


def _flags(args: list[str]) -> dict[str, str]:
    out = {}
    for a in args:
        assert a.startswith("--") and "=" in a, a
        k, v = a[2:].split("=", 1)
        assert k not in out, f"--{k} given twice"
        out[k] = v
    return out


def test_service_account_keys_are_a_dedicated_rsa_pair(tmp_path: Path) -> None:
    keys = ensure_service_account_keys(tmp_path / "pki")
    pub_pem = keys.public_key.read_bytes()
    priv_pem = keys.private_key.read_bytes()
    assert pub_pem.startswith(b"-----BEGIN PUBLIC KEY-----")
    assert priv_pem.startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    public = serialization.load_pem_public_key(pub_pem)
    private = serialization.load_pem_private_key(priv_pem, password=None)
    assert isinstance(public, rsa.RSAPublicKey) and isinstance(private, rsa.RSAPrivateKey)
    assert public.key_size >= 2048
    signature = private.sign(b"token", padding.PKCS1v15(), SHA256())
    public.verify(signature, b"token", padding.PKCS1v15(), SHA256())  # the pair belongs together
    assert keys.private_key.stat().st_mode & 0o077 == 0
    again = ensure_service_account_keys(tmp_path / "pki")
    assert again.public_key.read_bytes() == pub_pem, "kept across restarts (tokens stay valid)"


def test_the_serving_key_is_not_used_for_service_accounts(tmp_path: Path) -> None:
    certs = ensure_certs(tmp_path / "pki")
    keys = ensure_service_account_keys(tmp_path / "pki")
    serving = serialization.load_pem_private_key(certs.key.read_bytes(), password=None)
    assert isinstance(serving, ec.EllipticCurvePrivateKey)
    flags = _flags(apiserver_args(etcd_url="http://127.0.0.1:2379", port=6443, cert_dir=tmp_path / "certs",
                                  certs=certs, tokens=tmp_path / "tokens.csv", sa_keys=keys))
    assert flags["service-account-key-file"] == str(keys.public_key)
    assert flags["service-account-signing-key-file"] == str(keys.private_key)
    assert str(certs.key) not in (flags["service-account-key-file"], flags["service-account-signing-key-file"])
    assert flags["service-account-issuer"].startswith("https://")
    assert flags["tls-private-key-file"] == str(certs.key) and flags["tls-cert-file"] == str(certs.cert)
    assert flags["secure-port"] == "6443" and flags["bind-address"] == "127.0.0.1"
    assert flags["advertise-address"] == "127.0.0.1"
    assert flags["etcd-servers"] == "http://127.0.0.1:2379"
    assert flags["authorization-mode"] == "RBAC" and flags["token-auth-file"].endswith("tokens.csv")
