"""What the gateway reads from certificates: PEM blocks, the SPKI hash, the serial, the URI SANs,
the serverAuth usage, the expiry, and the install identity of a CA.

Pure functions over bytes (no file access): the watcher and the boot check read the files, the
per-stream gate hands over the DER the TLS handshake captured.

- The SPKI hash is SHA-256 over the certificate's own DER `SubjectPublicKeyInfo`, cut out of the
  TBSCertificate byte for byte (never a re-encoding of the parsed key), which is what a pin
  computed with openssl from the same certificate is.
- A PEM text is "certificates" only when every block in it is complete and every CERTIFICATE
  block decodes: a file caught half-written is not a certificate file (seed: "not a PEM
  certificate, or caught half-written").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

import attrs
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

__all__ = [
    "PeerCert",
    "PemError",
    "certificates",
    "earliest_not_after",
    "install_identity",
    "pem_blocks",
    "read_peer",
    "spki_sha256",
]

_BEGIN = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")
_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.DOTALL)
_CERTIFICATE = b"CERTIFICATE"
_IDENTITY_SCHEME = "yuzu://"
_IDENTITY_PATH = "/server"


class PemError(ValueError):
    """Not a complete PEM text of certificates; the message says what is wrong, never the bytes."""


def pem_blocks(data: bytes) -> list[tuple[str, bytes]]:
    """Every PEM block as (label, DER). Raises `PemError` for a block without its END line or
    with a body that is not base64 (a file being written)."""
    blocks = [(m.group(1), m.group(2)) for m in _BLOCK.finditer(data)]
    if len(blocks) != len(_BEGIN.findall(data)):
        raise PemError("a PEM block is incomplete")
    decoded: list[tuple[str, bytes]] = []
    for label, body in blocks:
        try:
            der = base64.b64decode(b"".join(body.split()), validate=True)
        except (binascii.Error, ValueError):
            raise PemError("a PEM block is not base64") from None
        decoded.append((label.decode("ascii"), der))
    return decoded


def certificates(data: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM text, in file order (other blocks, a key, are skipped).
    Raises `PemError` when there is none or one does not decode."""
    certs: list[x509.Certificate] = []
    for label, der in pem_blocks(data):
        if label.encode("ascii") != _CERTIFICATE:
            continue
        try:
            certs.append(x509.load_der_x509_certificate(der))
        except ValueError:
            raise PemError("a CERTIFICATE block does not decode") from None
    if not certs:
        raise PemError("holds no PEM certificate")
    return certs


def earliest_not_after(certs: list[x509.Certificate]) -> float | None:
    """The earliest notAfter in Unix seconds; None when one cannot be read (the seed's "expiry
    unknown": the series is removed rather than showing a wrong time)."""
    try:
        return min(c.not_valid_after_utc for c in certs).timestamp()
    except (ValueError, OverflowError):
        return None


def install_identity(ca_der: bytes) -> str:
    """`yuzu://<install>/server`: the install is the upper-case hex SHA-256 of the CA
    certificate's DER (seed: "Where the identity comes from")."""
    return f"{_IDENTITY_SCHEME}{hashlib.sha256(ca_der).hexdigest().upper()}{_IDENTITY_PATH}"


# -- DER: just enough to cut the SubjectPublicKeyInfo out of a TBSCertificate -----------------

_SEQUENCE = 0x30
_VERSION = 0xA0  # [0] EXPLICIT Version, present from v2 on
# serialNumber, signature, issuer, validity, subject come before subjectPublicKeyInfo.
_FIELDS_BEFORE_SPKI = 5


def _element(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, content start, end) of the DER element at `at`; definite lengths only."""
    if at + 2 > len(data):
        raise ValueError("truncated DER")
    tag, length = data[at], data[at + 1]
    start = at + 2
    if length & 0x80:
        size = length & 0x7F
        if not 1 <= size <= 4 or start + size > len(data):
            raise ValueError("bad DER length")
        length = int.from_bytes(data[start : start + size], "big")
        start += size
    end = start + length
    if end > len(data):
        raise ValueError("truncated DER")
    return tag, start, end


def spki_sha256(cert: x509.Certificate) -> bytes:
    """SHA-256 of the certificate's DER SubjectPublicKeyInfo, as encoded in the certificate.
    Raises ValueError when the TBSCertificate is not the DER it must be."""
    tbs = cert.tbs_certificate_bytes
    tag, at, end = _element(tbs, 0)
    if tag != _SEQUENCE or end != len(tbs):
        raise ValueError("TBSCertificate is not a SEQUENCE")
    tag, _, after = _element(tbs, at)
    if tag == _VERSION:
        at = after
    for _ in range(_FIELDS_BEFORE_SPKI):
        _, _, at = _element(tbs, at)
    tag, _, spki_end = _element(tbs, at)
    if tag != _SEQUENCE:
        raise ValueError("subjectPublicKeyInfo is not a SEQUENCE")
    return hashlib.sha256(tbs[at:spki_end]).digest()


# -- the peer ------------------------------------------------------------------------------------


@attrs.frozen
class PeerCert:
    """What the decision reads of the certificate a management peer presented. Built once per
    connection (`read_peer`); each stream's decision then costs set lookups only."""

    server_auth: bool
    spki_sha256: bytes
    uris: tuple[str, ...]  # the URI SANs as written, compared byte for byte
    serial: int | None  # None: the serial cannot be read


def read_peer(der: bytes | None) -> PeerCert | None:
    """The facts of a DER certificate; None when there is none or it cannot be decoded (the
    decision then refuses `bad_peer_cert`)."""
    if not der:
        return None
    try:
        return _facts(x509.load_der_x509_certificate(der))
    except _UNDECODABLE:
        return None


# What cryptography raises for a certificate it cannot read (a duplicate extension, a general
# name of an unknown type, bad DER): a certificate the gateway cannot judge.
_UNDECODABLE = (ValueError, x509.DuplicateExtension, x509.UnsupportedGeneralNameType)


def _facts(cert: x509.Certificate) -> PeerCert:
    spki = spki_sha256(cert)
    extensions = cert.extensions  # parsed once, here
    try:
        usages = extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        server_auth = ExtendedKeyUsageOID.SERVER_AUTH in usages
    except x509.ExtensionNotFound:
        server_auth = False
    try:
        names = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = tuple(names.get_values_for_type(x509.UniformResourceIdentifier))
    except x509.ExtensionNotFound:
        uris = ()
    try:
        serial: int | None = cert.serial_number
    except ValueError:
        serial = None
    return PeerCert(server_auth, spki, uris, serial)
