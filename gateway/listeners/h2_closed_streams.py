"""How many closed streams an HTTP/2 connection of the gateway remembers.

h2 remembers the end of the last 65,536 closed streams of a connection (about 100 bytes each),
only to tell a late frame on a stream that ended long ago from one on a stream never opened.
The gateway's connections live for weeks and open a stream per call: an agent connection one
per heartbeat, an upstream connection one per call of the whole node (about a thousand a second
in a cold wave). Left alone, each such record fills to some 6.5 MB, so a pool of 64 upstream
connections would hold 400 MB of it. Past the bound a late frame on a forgotten stream gets
RST_STREAM STREAM_CLOSED (or, on the client side, is ignored as for an unknown stream), which
RFC 9113 allows for any closed stream.
"""

from __future__ import annotations

from h2.connection import H2Connection
from h2.utilities import SizeLimitDict

__all__ = ["CLOSED_STREAMS_KEPT", "bound_closed_streams"]

CLOSED_STREAMS_KEPT = 128


def bound_closed_streams(connection: H2Connection) -> None:
    """Keep at most `CLOSED_STREAMS_KEPT` closed streams of `connection` from now on.

    h2 sizes the record from `MAX_CLOSED_STREAMS` when the connection is built, which grpclib
    does for the upstream channel; so the record itself is replaced (it is read and written
    only through the mapping protocol). The tests of both callers check the bound holds."""
    connection._closed_streams = SizeLimitDict(
        connection._closed_streams, size_limit=CLOSED_STREAMS_KEPT
    )
