"""The grpclib channel to the management listener: plaintext, or TLS when `--ca` or `--cert`
is given (the gateway's certificate verified against `--ca`, or the system's CAs without it;
`--cert`/`--key` presented for the mutual TLS a production management listener requires).

`open_channel` connects before any call, within the connect timeout, so that a failure to
reach the gateway (refused, dropped, a TLS handshake that fails) is told apart from a call the
gateway answered with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator

from grpclib.client import Channel
from grpclib.config import Configuration

from gateway.ctl.cli import Connection

__all__ = ["KEEPALIVE_S", "TlsFileError", "open_channel", "tls_context"]

# A listener closes a connection that has received nothing for its http2 idle_timeout (600 s
# by default; docs/listeners.md); a PING counts. A watch or a long send sends nothing after
# its request, so the client pings this often while a call is open.
KEEPALIVE_S = 60.0


class TlsFileError(Exception):
    """A --ca, --cert or --key file that cannot be used; the message names the option."""


def tls_context(connection: Connection) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH,
            cafile=str(connection.ca) if connection.ca is not None else None,
        )
    except (OSError, ssl.SSLError) as exc:
        raise TlsFileError(f"--ca {connection.ca}: {_why(exc)}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    if connection.cert is not None:
        try:
            context.load_cert_chain(str(connection.cert), str(connection.key))
        except (OSError, ssl.SSLError) as exc:
            raise TlsFileError(f"--cert {connection.cert} / --key: {_why(exc)}") from None
    return context


def _why(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)


@contextlib.asynccontextmanager
async def open_channel(connection: Connection) -> AsyncIterator[Channel]:
    """A connected channel (the TLS handshake done); closed on exit. Raises what connecting
    raised: OSError, ssl.SSLError, TimeoutError."""
    context = tls_context(connection) if connection.tls else None
    config = Configuration(
        ssl_target_name_override=connection.server_name,
        _keepalive_time=KEEPALIVE_S,
        # grpclib's defaults stop after 2 pings without data, at least 300 s apart.
        _http2_max_pings_without_data=0,
        _http2_min_sent_ping_interval_without_data=KEEPALIVE_S,
    )
    channel = Channel(connection.host, connection.port, ssl=context, config=config)
    try:
        # grpclib connects on the first call; its connect is awaited here on its own.
        async with asyncio.timeout(connection.timeout_s):
            await channel.__connect__()
        yield channel
    finally:
        channel.close()
