"""Mutual TLS of the cluster links (docs/cluster.md "Transport security", docs/tls.md "Cluster
links").

Both ends of a link load the node's leaf (`cluster_tls_certfile` / `cluster_tls_keyfile`) and
trust the install CA (`cluster_tls_cacertfile`), with CERT_REQUIRED both ways: a peer whose
certificate does not chain to that CA, or who presents none, fails the handshake, before any
HTTP/2 frame is read (asyncio hands the connection to grpclib only once the handshake is done),
so such a peer never reaches the cookie check. The cookie stays as the second check.

The host name is not checked: a node's address is auto-detected at boot (seed: "Gateway
Clustering"), so a leaf cannot be expected to name it; the install CA is the trust boundary,
as the agent and management listeners' chain check is. The node's leaf serves both ends, so it
needs both the serverAuth and clientAuth usages (or no extended key usage at all).

With none of the three keys set the links are plaintext: the development posture, said at boot
with one WARNING by the cluster actor. Some but not all set refuses boot
`cluster_tls_incomplete` (a config check); a file that cannot be loaded when the cluster child
starts refuses `{cluster_tls_unusable,Role}` naming the file's role (and its path, except for
the key file's), and so the boot (`start_failed`), as a listener's unusable file does.
"""

from __future__ import annotations

import ssl

import attrs

from gateway.config.refusal import BootRefused

__all__ = [
    "INCOMPLETE",
    "UNUSABLE",
    "ClusterTls",
    "LinkContexts",
    "check_complete",
    "link_contexts",
]

INCOMPLETE = "cluster_tls_incomplete"
UNUSABLE = "cluster_tls_unusable"
_ALPN = ["h2"]


@attrs.frozen
class ClusterTls:
    """The three files of the links' TLS; each None when its key is unset."""

    certfile: str | None
    keyfile: str | None
    cacertfile: str | None

    @property
    def plaintext(self) -> bool:
        return self.certfile is None and self.keyfile is None and self.cacertfile is None


@attrs.frozen
class LinkContexts:
    """The server context (the cluster port) and the client context (each PeerLink)."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def check_complete(files: ClusterTls) -> None:
    """All three files or none, else `BootRefused` `cluster_tls_incomplete` (no file is read:
    the boot's config check, before anything starts)."""
    missing = [
        f"cluster_tls_{role}"
        for role, path in (
            ("certfile", files.certfile),
            ("keyfile", files.keyfile),
            ("cacertfile", files.cacertfile),
        )
        if path is None
    ]
    if missing and not files.plaintext:
        raise BootRefused(
            INCOMPLETE,
            "set all of cluster_tls_certfile, cluster_tls_keyfile and cluster_tls_cacertfile,"
            f" or none (unset: {', '.join(missing)})",
        )


def link_contexts(files: ClusterTls) -> LinkContexts | None:
    """The links' contexts, None in the plaintext posture; raises `BootRefused` (module doc)."""
    if files.plaintext:
        return None
    check_complete(files)
    assert files.certfile is not None and files.keyfile is not None
    assert files.cacertfile is not None
    return LinkContexts(
        server=_context(ssl.PROTOCOL_TLS_SERVER, files.certfile, files.keyfile, files.cacertfile),
        client=_context(ssl.PROTOCOL_TLS_CLIENT, files.certfile, files.keyfile, files.cacertfile),
    )


def _context(protocol: int, certfile: str, keyfile: str, cacertfile: str) -> ssl.SSLContext:
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # HTTP/2 forbids TLS compression and renegotiation (RFC 9113, 9.2).
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(_ALPN)
    context.check_hostname = False  # module doc: the CA, not the address, is the boundary
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise BootRefused(
            UNUSABLE,
            f"cannot load cluster_tls_certfile {certfile} with its cluster_tls_keyfile"
            f" ({type(exc).__name__})",
            context=("certfile",),
        ) from None
    try:
        context.load_verify_locations(cafile=cacertfile)
    except (OSError, ssl.SSLError) as exc:
        raise BootRefused(
            UNUSABLE,
            f"cannot load cluster_tls_cacertfile {cacertfile} ({type(exc).__name__})",
            context=("cacertfile",),
        ) from None
    return context
