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
"""

from __future__ import annotations

import ssl

from gateway.config.listener_spec import TlsSpec


class TlsFilesUnusable(Exception):
    """A certificate, key or CA file of a listener cannot be loaded."""


def _shown(role: str, path: str) -> str:
    return role if role == "keyfile" else f"{role} {path}"


def server_context(spec: TlsSpec, listener: str) -> ssl.SSLContext:
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
