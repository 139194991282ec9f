"""An endpoint's SSL options as a Python `ssl.SSLContext`, built afresh for every dial.

Fresh per dial on purpose: a reconnect presents the files as they are then, so replaced
certificates take effect on the next reconnect, as they did on the Erlang gateway (without
its two-minute file cache). Building reads files: the channel runs it in a thread.

Mapping of the Erlang options (others are accepted and ignored, see `endpoint_options`):

| Erlang ssl option | here |
| --- | --- |
| `{verify, verify_peer}` | `CERT_REQUIRED`, host name checked against the SNI name |
| `{verify, verify_none}` or unset | `CERT_NONE` (refused at boot without the dev override) |
| `{cacertfile, F}` / `{cacerts, [DER]}` | the only trusted CAs (the system store otherwise) |
| `{certfile, F}`, `{keyfile, K}`, `{password, P}` | the client certificate chain and key |
| `{server_name_indication, Name \\| disable}` | SNI and the checked name; `disable`: neither |
| `{versions, ['tlsv1.2', 'tlsv1.3']}` | the minimum and maximum version (default both) |

ALPN always offers `h2` (gRPC needs HTTP/2).
"""

from __future__ import annotations

import ssl

from gateway.config.endpoint_options import TlsOptions

__all__ = ["build_context", "server_hostname"]


def server_hostname(tls: TlsOptions, host: str) -> str | None:
    """The name sent as SNI and checked, or None with `{server_name_indication, disable}`."""
    if tls.server_name is False:
        return None
    return tls.server_name if isinstance(tls.server_name, str) else host


def build_context(tls: TlsOptions) -> ssl.SSLContext:
    """Raises OSError or ssl.SSLError when the options cannot be used (a missing file, a file
    without PEM, a key that does not match its certificate)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    versions = tls.versions or (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3)
    context.minimum_version = min(versions)
    context.maximum_version = max(versions)
    context.set_alpn_protocols(["h2"])
    if tls.verify_peer:
        context.check_hostname = tls.server_name is not False
        context.verify_mode = ssl.CERT_REQUIRED
        if tls.cacertfile is not None:
            context.load_verify_locations(cafile=tls.cacertfile)
        for ca in tls.cacerts:
            # `cacerts` are DER in Erlang; PEM text in a binary is taken as well.
            if ca.lstrip().startswith(b"-----BEGIN"):
                context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
            else:
                context.load_verify_locations(cadata=ca)
        if not tls.own_ca:
            context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if tls.certfile is not None:
        context.load_cert_chain(tls.certfile, tls.keyfile, password=tls.password)
    return context
