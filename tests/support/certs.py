"""Test certificates: a private CA and the leaves signed by it, made with ``cryptography``.

Nothing here talks to gRPC; the bytes and files fit grpcio, grpclib and ``ssl`` alike.

Quick use (a CA, a server leaf for localhost and the loopback addresses, a client leaf, all
written as PEM files into a directory)::

    pki = write_pki(tmp_path)
    pki.ca_cert_pem, pki.server.cert_path, pki.client.key_pem, ...

For other shapes (an expired leaf, a URI SAN such as ``yuzu://<install>/server``, a chosen serial,
a leaf re-issued over the same key, a second CA whose leaves must be refused) use
:class:`CertAuthority` directly::

    ca = CertAuthority("Other CA")
    leaf = ca.issue("yuzu-server", uris=[f"yuzu://{ca.fingerprint_hex}/server"], serial=0x0A1B2C)
    leaf.write(tmp_path, "server")

Keys are ECDSA P-256 (fast to generate, accepted by BoringSSL and OpenSSL); pass ``rsa_bits``
to :func:`new_key` for an RSA key when a test needs one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

#: Names the default server leaf answers to.
SERVER_DNS = ("localhost",)
SERVER_IPS = ("127.0.0.1", "::1")

# File names used by write_pki / load_pki.
CA_CERT = "ca.pem"
CA_KEY = "ca.key"


def new_key(rsa_bits: int | None = None) -> PrivateKey:
    """A fresh private key: ECDSA P-256, or RSA of ``rsa_bits`` bits."""
    if rsa_bits:
        return rsa.generate_private_key(public_exponent=65537, key_size=rsa_bits)
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: PrivateKey) -> bytes:
    """PKCS#8 PEM of a private key, unencrypted."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Yuzu test"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Leaf:
    """A certificate with its private key; ``cert_path``/``key_path`` once written."""

    cert: x509.Certificate
    key: PrivateKey
    cert_path: Path | None = None
    key_path: Path | None = None

    @property
    def cert_pem(self) -> bytes:
        return cert_pem(self.cert)

    @property
    def key_pem(self) -> bytes:
        return key_pem(self.key)

    @property
    def serial_hex(self) -> str:
        """Upper-case hex of the serial number, without leading zeros."""
        return format(self.cert.serial_number, "X")

    def write(self, directory: Path | str, stem: str) -> Leaf:
        """Write ``<stem>.pem`` and ``<stem>.key`` (mode 0600) into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        cert_path = directory / f"{stem}.pem"
        key_path = directory / f"{stem}.key"
        cert_path.write_bytes(self.cert_pem)
        key_path.write_bytes(self.key_pem)
        key_path.chmod(0o600)
        return Leaf(self.cert, self.key, cert_path, key_path)


class CertAuthority:
    """A self-signed CA that issues leaves. Each instance is a new, unrelated CA."""

    def __init__(
        self, common_name: str = "Yuzu Test CA", *, key: PrivateKey | None = None, days: int = 30
    ) -> None:
        self.key = key or new_key()
        now = _now()
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return cert_pem(self.cert)

    @property
    def fingerprint_hex(self) -> str:
        """Upper-case hex SHA-256 of the CA certificate's DER (no colons)."""
        return self.cert.fingerprint(hashes.SHA256()).hex().upper()

    def issue(
        self,
        common_name: str,
        *,
        dns: Iterable[str] = (),
        ips: Iterable[str] = (),
        uris: Iterable[str] = (),
        server_auth: bool = True,
        client_auth: bool = True,
        key: PrivateKey | None = None,
        serial: int | None = None,
        not_before: dt.datetime | None = None,
        not_after: dt.datetime | None = None,
    ) -> Leaf:
        """Sign a leaf. SANs from ``dns``/``ips``/``uris``; extended key usages as asked.

        ``key`` re-issues over an existing key; ``not_before``/``not_after`` (aware datetimes)
        make not-yet-valid or expired leaves; the default validity is now-5min .. now+30d.
        """
        key = key or new_key()
        now = _now()
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        sans += [x509.UniformResourceIdentifier(u) for u in uris]
        usages = []
        if server_auth:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client_auth:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(serial if serial is not None else x509.random_serial_number())
            .not_valid_before(not_before or now - dt.timedelta(minutes=5))
            .not_valid_after(not_after or now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=isinstance(key, rsa.RSAPrivateKey),
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        return Leaf(builder.sign(self.key, hashes.SHA256()), key)

    def write(self, directory: Path | str) -> tuple[Path, Path]:
        """Write ``ca.pem`` and ``ca.key`` (0600); returns their paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = directory / CA_CERT, directory / CA_KEY
        cert_path.write_bytes(self.cert_pem)
        key_path.write_bytes(key_pem(self.key))
        key_path.chmod(0o600)
        return cert_path, key_path


@dataclass(frozen=True)
class Pki:
    """A CA with one server leaf and one client leaf, as written by :func:`write_pki`."""

    directory: Path
    ca_cert_path: Path
    server: Leaf
    client: Leaf
    ca: CertAuthority | None = None  # None when loaded from files (no signing needed)

    @property
    def ca_cert_pem(self) -> bytes:
        return self.ca_cert_path.read_bytes()


def write_pki(
    directory: Path | str,
    *,
    server_dns: Iterable[str] = SERVER_DNS,
    server_ips: Iterable[str] = SERVER_IPS,
    client_name: str = "yuzu-gateway",
) -> Pki:
    """Create a CA, a server leaf and a client leaf; write them into ``directory``.

    Files: ``ca.pem``, ``ca.key``, ``server.pem``, ``server.key``, ``client.pem``, ``client.key``.
    The server leaf carries serverAuth and the given DNS/IP SANs; the client leaf carries
    clientAuth and a DNS SAN equal to ``client_name``.
    """
    directory = Path(directory)
    ca = CertAuthority()
    ca_cert_path, _ = ca.write(directory)
    server = ca.issue(
        "yuzu-server", dns=server_dns, ips=server_ips, server_auth=True, client_auth=False
    ).write(directory, "server")
    client = ca.issue(client_name, dns=[client_name], server_auth=False, client_auth=True).write(
        directory, "client"
    )
    return Pki(directory, ca_cert_path, server, client, ca)


def load_pki(directory: Path | str) -> Pki:
    """Read back what :func:`write_pki` wrote (``ca`` is None: the CA is not rebuilt)."""
    directory = Path(directory)

    def leaf(stem: str) -> Leaf:
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise ValueError(f"{key_path}: unsupported key type {type(key).__name__}")
        return Leaf(cert, key, cert_path, key_path)

    return Pki(directory, directory / CA_CERT, leaf("server"), leaf("client"))


def ensure_pki(directory: Path | str) -> Pki:
    """Load the PKI in ``directory`` if its files are all there, else write a new one."""
    directory = Path(directory)
    names = (CA_CERT, "server.pem", "server.key", "client.pem", "client.key")
    if all((directory / n).is_file() for n in names):
        return load_pki(directory)
    return write_pki(directory)


def spki_sha256_hex(cert: x509.Certificate) -> str:
    """The ``{spki_sha256, Hex}`` pin of a certificate: upper-case hex SHA-256 of its DER
    SubjectPublicKeyInfo, computed from the key (as ``openssl pkey -pubin -outform DER``)."""
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(spki).hexdigest().upper()


def server_identity(ca: CertAuthority) -> str:
    """The management server identity under ``ca``: ``yuzu://<ca fingerprint>/server``."""
    return f"yuzu://{ca.fingerprint_hex}/server"
