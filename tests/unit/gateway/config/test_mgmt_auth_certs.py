"""What the gateway reads from certificates (gateway/config/certs.py)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from gateway.config.certs import (
    PemError,
    certificates,
    earliest_not_after,
    install_identity,
    pem_blocks,
    read_peer,
    spki_sha256,
)
from tests.support.certs import CertAuthority, key_pem, new_key, server_identity, spki_sha256_hex


@pytest.mark.parametrize("rsa_bits", [None, 2048])
def test_the_spki_hash_is_the_pin_openssl_computes(rsa_bits: int | None) -> None:
    ca = CertAuthority()
    leaf = ca.issue("yuzu-server", key=new_key(rsa_bits))
    assert spki_sha256(leaf.cert).hex().upper() == spki_sha256_hex(leaf.cert)
    # Re-issued over the same key: the same pin; a new key: another.
    again = ca.issue("yuzu-server", key=leaf.key)
    assert spki_sha256(again.cert) == spki_sha256(leaf.cert)
    assert spki_sha256(ca.issue("yuzu-server").cert) != spki_sha256(leaf.cert)


def test_read_peer_facts() -> None:
    ca = CertAuthority()
    identity = server_identity(ca)
    server = ca.issue("yuzu-server", uris=[identity, "https://x/"], serial=0x0A1B2C)
    peer = read_peer(server.cert.public_bytes(Encoding.DER))
    assert peer is not None
    assert peer.server_auth and peer.uris == (identity, "https://x/")
    assert peer.serial == 0x0A1B2C
    assert peer.spki_sha256 == spki_sha256(server.cert)
    agent = ca.issue("agent-1", uris=[f"yuzu://{ca.fingerprint_hex}/agent/1"], server_auth=False)
    agent_peer = read_peer(agent.cert.public_bytes(Encoding.DER))
    assert agent_peer is not None and not agent_peer.server_auth
    bare = ca.issue("bare", server_auth=False, client_auth=False)  # no EKU extension at all
    bare_peer = read_peer(bare.cert.public_bytes(Encoding.DER))
    assert bare_peer is not None and not bare_peer.server_auth and bare_peer.uris == ()
    assert read_peer(None) is None
    assert read_peer(b"") is None
    assert read_peer(b"\x30\x03\x02\x01\x01") is None


def test_install_identity_is_the_upper_case_sha256_of_the_ca() -> None:
    ca = CertAuthority()
    assert install_identity(ca.cert.public_bytes(Encoding.DER)) == server_identity(ca)


def test_pem_text_must_be_complete_certificates() -> None:
    one, two = CertAuthority(), CertAuthority(days=5)
    bundle = one.cert_pem + b"# comment between\n" + two.cert_pem
    assert [c.serial_number for c in certificates(bundle)] == [
        one.cert.serial_number,
        two.cert.serial_number,
    ]
    assert earliest_not_after(certificates(bundle)) == two.cert.not_valid_after_utc.timestamp()
    # A key beside the certificate is skipped; a key alone is no certificate.
    assert len(certificates(key_pem(new_key()) + one.cert_pem)) == 1
    for bad in (
        b"",
        key_pem(new_key()),
        one.cert_pem[: len(one.cert_pem) // 2],  # caught half-written
        bundle[: len(bundle) - 40],
        one.cert_pem.replace(b"M", b"!", 3),  # not base64
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",  # not a certificate
    ):
        with pytest.raises(PemError):
            certificates(bad)
    assert [label for label, _ in pem_blocks(bundle)] == ["CERTIFICATE", "CERTIFICATE"]
