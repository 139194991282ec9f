"""The server-side TLS context of a listener.

- TLS 1.2 and 1.3 (the Erlang gateway offered 1.2 only, a limit its manual records, not a
  requirement), ALPN `h2`.
- `verify_none`: one-way TLS, no client certificate asked for (the agent listener: agents
  that have not enrolled have none).
- `verify_peer` with `fail_if_no_peer_cert => false`: a certificate is asked for and checked
  against cacertfile when presented, but not required; an invalid one still fails the
  handshake (OpenSSL's CERT_OPTIONAL, as Erlang's ssl does).
- `verify_peer` with `fail_if_no_peer_cert => true` (the defaults): strict mutual TLS.

The files are read when the listener starts, so a restarted listener picks up replaced
files; a file that cannot be loaded fails the start with a line naming the file's role (and
its path, except for the key file, whose path the logs never carry).

Every context built is remembered (weakly) under its `TlsSpec`, so that the certificate
watcher can load a renewed set into the live context (`reload_live`, docs/tls.md "Certificate
reload"): new handshakes use the new set, established connections keep the one they were
made with (OpenSSL copies the certificate into each connection when it is set up).
"""

from __future__ import annotations

import ssl
import weakref

from gateway.config.listener_spec import TlsSpec

__all__ = [
    "TlsFilesUnusable",
    "build_server_context",
    "live_contexts",
    "reload_live",
    "server_context",
]

# Keyed by value: two listeners (or two nodes in one test process) configured with the same
# files reload from the same files. A stopped listener's context drops out with it.
_LIVE: dict[TlsSpec, weakref.WeakSet[ssl.SSLContext]] = {}


class TlsFilesUnusable(Exception):
    """A certificate, key or CA file of a listener cannot be loaded."""


def _shown(role: str, path: str) -> str:
    return role if role == "keyfile" else f"{role} {path}"


def server_context(spec: TlsSpec, listener: str) -> ssl.SSLContext:
    """The context of a listener starting now, remembered for `reload_live`."""
    context = build_server_context(spec, listener)
    _LIVE.setdefault(spec, weakref.WeakSet()).add(context)
    return context


def build_server_context(spec: TlsSpec, listener: str) -> ssl.SSLContext:
    """A context loaded from `spec`'s files; raises `TlsFilesUnusable` naming the file."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # HTTP/2 forbids TLS compression and renegotiation (RFC 9113, 9.2).
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    context.set_alpn_protocols(["h2"])
    try:
        context.load_cert_chain(spec.certfile, spec.keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise TlsFilesUnusable(
            f"gRPC listener {listener}: cannot load {_shown('certfile', spec.certfile)} with"
            f" its keyfile ({type(exc).__name__})"
        ) from None
    if spec.verify == "verify_peer":
        try:
            context.load_verify_locations(cafile=spec.cacertfile)
        except (OSError, ssl.SSLError) as exc:
            raise TlsFilesUnusable(
                f"gRPC listener {listener}: cannot load {_shown('cacertfile', spec.cacertfile)}"
                f" ({type(exc).__name__})"
            ) from None
        context.verify_mode = ssl.CERT_REQUIRED if spec.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def live_contexts(spec: TlsSpec) -> list[ssl.SSLContext]:
    """The contexts of the running listeners configured with `spec`."""
    return list(_LIVE.get(spec, ()))


def reload_live(spec: TlsSpec, files: TlsSpec) -> int:
    """Load `files` (copies of `spec`'s files, already validated together by
    `build_server_context(files, ...)`) into every live context of `spec`; how many were reloaded.

    A CA file's certificates are added to the trust store: one the new file no longer holds
    stays trusted until the listener restarts (OpenSSL cannot remove a trusted CA)."""
    contexts = live_contexts(spec)
    for context in contexts:
        context.load_cert_chain(files.certfile, files.keyfile)
        if spec.verify == "verify_peer":
            context.load_verify_locations(cafile=files.cacertfile)
    return len(contexts)
