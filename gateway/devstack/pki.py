"""The throwaway PKI of `devstack --tls`: one private CA and two leaves, written as PEM files.

- `ca.pem`, `ca.key`: the install CA. Every hop trusts `ca.pem`; the key signs the leaves.
- `gateway.pem`, `gateway.key`: the gateway's leaf (serverAuth and clientAuth; localhost,
  127.0.0.1, ::1). The agent and management listeners present it, and the upstream channel
  presents it to the server.
- `server.pem`, `server.key`: the Yuzu server's leaf (the same usages and names, plus the URI
  SAN `yuzu://<install>/server`). The fake server presents it; a management client presents
  it to the gateway.

The server leaf is also the management client's certificate because the management peers are the
server's replicas: the gateway admits them by the identity `yuzu://<install>/server` (the
install is the upper-case hex SHA-256 of the CA certificate's DER) and requires serverAuth on
the peer's certificate (docs/listeners.md, the mgmt_peer_* keys in docs/configuration.md). The
agents have no certificate: the agent edge is one-way TLS.

Keys are ECDSA P-256 (fast to make). The stack regenerates everything at each start and keeps
it in the run directory; the standalone fake server (`--tls-dir`) reuses what a directory holds
(`ensure_pki`). Nothing here is fit for anything but a dev stack on one host.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.config.certs import install_identity

__all__ = ["DevPki", "Leaf", "ensure_pki", "load_pki", "write_pki"]

# A dev stack lives for a session; a week leaves a margin for a laptop left running.
VALID_DAYS = 7
# Clock skew between the processes of one host is nil, but a minute's grace costs nothing.
BACKDATE = dt.timedelta(minutes=1)
LOOPBACK_DNS = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")
# The files write_pki writes, by stem: each a .pem, and a .key beside it.
CA, GATEWAY, SERVER = "ca", "gateway", "server"


@attrs.frozen
class Leaf:
    """A certificate and its key, as files."""

    cert_path: Path
    key_path: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert_path.read_bytes()

    @property
    def key_pem(self) -> bytes:
        return self.key_path.read_bytes()


@attrs.frozen
class DevPki:
    """What `write_pki` wrote. `server`, `ca_cert_pem` are what the fake server reads (the shape
    of the tests' `Pki`)."""

    directory: Path
    ca_cert_path: Path
    gateway: Leaf
    server: Leaf
    identity: str  # yuzu://<install>/server, carried by the server leaf

    @property
    def ca_cert_pem(self) -> bytes:
        return self.ca_cert_path.read_bytes()


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Yuzu dev stack"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Leaf:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.touch(mode=0o600)
    key_path.chmod(0o600)  # a key file left from an earlier run keeps its mode otherwise
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Leaf(cert_path, key_path)


class _Ca:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = (
            self._builder(_name("Yuzu dev stack CA"), self.key.public_key())
            .issuer_name(_name("Yuzu dev stack CA"))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.now - BACKDATE)
            .not_valid_after(self.now + dt.timedelta(days=VALID_DAYS))
        )

    def issue(
        self, common_name: str, uris: Iterable[str] = ()
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in LOOPBACK_DNS]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in LOOPBACK_IPS]
        sans += [x509.UniformResourceIdentifier(u) for u in uris]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        cert = (
            self._builder(_name(common_name), key.public_key())
            .issuer_name(self.cert.subject)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return cert, key


def write_pki(directory: Path) -> DevPki:
    """Make a new CA and its two leaves; write them into `directory` (created mode 0700),
    replacing what an earlier run left there."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = _Ca(dt.datetime.now(dt.UTC))
    ca_leaf = _write(directory, CA, ca.cert, ca.key)
    identity = install_identity(ca.cert.public_bytes(serialization.Encoding.DER))
    gateway = _write(directory, GATEWAY, *ca.issue("yuzu-gateway"))
    server = _write(directory, SERVER, *ca.issue("yuzu-server", uris=[identity]))
    return DevPki(directory, ca_leaf.cert_path, gateway, server, identity)


def _leaf(directory: Path, stem: str) -> Leaf:
    return Leaf(directory / f"{stem}.pem", directory / f"{stem}.key")


def load_pki(directory: Path) -> DevPki:
    """What `write_pki` wrote into `directory` earlier (the files are read when used)."""
    ca = _leaf(directory, CA)
    der = x509.load_pem_x509_certificate(ca.cert_pem).public_bytes(serialization.Encoding.DER)
    return DevPki(
        directory,
        ca.cert_path,
        _leaf(directory, GATEWAY),
        _leaf(directory, SERVER),
        install_identity(der),
    )


def ensure_pki(directory: Path) -> DevPki:
    """The PKI in `directory` if all its files are there, else a new one written there."""
    leaves = [_leaf(directory, stem) for stem in (CA, GATEWAY, SERVER)]
    if all(leaf.cert_path.is_file() and leaf.key_path.is_file() for leaf in leaves):
        return load_pki(directory)
    return write_pki(directory)
