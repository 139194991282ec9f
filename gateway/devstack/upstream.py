"""Starting the fake Yuzu server (gateway/devstack/fake_upstream/) the way the dev stack runs
it: the default behaviour of docs/dev/testing.md "The fake server" (every agent accepted, heartbeats
acknowledged, stream-status notifications and Guardian events acknowledged), plaintext or with
the stack's PKI.
"""

from __future__ import annotations

from gateway.devstack.fake_upstream import FakeUpstream
from gateway.devstack.pki import DevPki

__all__ = ["FakeUpstream", "start_fake_upstream"]


async def start_fake_upstream(host: str, port: int, pki: DevPki | None) -> FakeUpstream:
    """The fake server listening on `host:port`: plaintext, or with `pki` mutual TLS (it
    presents the server leaf and requires a client certificate from the CA)."""
    fake = FakeUpstream(tls=pki, require_client_auth=True)
    await fake.start(host, port)
    return fake
