"""The fake Yuzu server the dev stack runs, and the one place it is imported from.

The fake lives in the tests' support package for now (tests/support/fake_upstream.py,
docs/testing.md "The fake server"); when it moves into the product, only this import changes.
It plays the server with its default behaviour: every agent accepted, heartbeats acknowledged,
stream-status notifications and Guardian events acknowledged.
"""

from __future__ import annotations

from gateway.devstack.pki import DevPki
from tests.support.fake_upstream import FakeUpstream

__all__ = ["FakeUpstream", "start_fake_upstream"]


async def start_fake_upstream(host: str, port: int, pki: DevPki | None) -> FakeUpstream:
    """The fake server listening on `host:port`: plaintext, or with `pki` mutual TLS (it
    presents the server leaf and requires a client certificate from the CA)."""
    # DevPki has the attributes the fake reads from the tests' Pki (server, ca_cert_pem).
    fake = FakeUpstream(tls=pki, require_client_auth=True)  # type: ignore[arg-type]
    await fake.start(host, port)
    return fake
