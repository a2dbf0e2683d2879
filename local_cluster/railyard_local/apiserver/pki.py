"""A self-signed CA and a loopback serving certificate, kept under the state directory.

client-go (kubectl, kopf's fallbacks aside) sends bearer tokens only over TLS, so the server
speaks HTTPS; the CA goes into the kubeconfig as certificate-authority-data. Files are created
once and reused, so a kubeconfig stays valid across restarts.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class ServingCerts:
    ca_cert: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_cert))


def _write(path: Path, data: bytes, private: bool = False) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def ensure_certs(pki_dir: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")) -> ServingCerts:
    pki_dir.mkdir(parents=True, exist_ok=True)
    certs = ServingCerts(pki_dir / "ca.crt", pki_dir / "server.crt", pki_dir / "server.key")
    if certs.ca_cert.exists() and certs.cert.exists() and certs.key.exists():
        return certs
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "railyard-local-ca")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans = _subject_alt_names(hosts)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "railyard-local-apiserver")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write(pki_dir / "ca.key", ca_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()), private=True)
    _write(certs.key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()), private=True)
    _write(certs.cert, cert.public_bytes(serialization.Encoding.PEM))
    _write(certs.ca_cert, ca.public_bytes(serialization.Encoding.PEM))
    return certs


@dataclass(frozen=True)
class ServiceAccountKeys:
    """The key pair kube-apiserver signs and verifies service-account tokens with."""

    private_key: Path
    """PKCS#1 ``RSA PRIVATE KEY`` PEM (``--service-account-signing-key-file``)."""
    public_key: Path
    """SubjectPublicKeyInfo ``PUBLIC KEY`` PEM (``--service-account-key-file``)."""


def ensure_service_account_keys(pki_dir: Path) -> ServiceAccountKeys:
    """A dedicated 2048-bit RSA pair, kept beside the serving certificate.

    Not the serving key: kube-apiserver reads ``--service-account-key-file`` as PEM public keys
    (or RSA/EC private keys in their own PEM types), and refuses a PKCS#8 ECDSA serving key with
    "data does not contain any valid RSA or ECDSA public keys".
    """
    pki_dir.mkdir(parents=True, exist_ok=True)
    keys = ServiceAccountKeys(pki_dir / "sa.key", pki_dir / "sa.pub")
    if keys.private_key.exists() and keys.public_key.exists():
        return keys
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(
        keys.private_key,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        ),
        private=True,
    )
    _write(keys.public_key, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                          serialization.PublicFormat.SubjectPublicKeyInfo))
    return keys


def issue_cert(pki_dir: Path, name: str, *, common_name: str, hosts: tuple[str, ...] = (), client: bool = False,
               organization: str | None = None, out_dir: Path | None = None) -> tuple[Path, Path]:
    """A certificate signed by the CA of ``pki_dir`` (made by :func:`ensure_certs`), written as
    ``<name>.crt`` / ``<name>.key`` there (or in ``out_dir``) and returned as (cert, key): for
    serving ``hosts``, or, with ``client``, for client authentication (kube-apiserver's kubelet
    client certificate)."""
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    builder = (
        x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client
                                              else x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    sans = _subject_alt_names(hosts)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out = out_dir or pki_dir
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / f"{name}.crt", out / f"{name}.key"
    _write(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _subject_alt_names(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """An IP address entry for each host that is one, a DNS name entry for the rest."""
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    return sans
