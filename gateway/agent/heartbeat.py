"""Heartbeat: admission, then the heartbeat buffer (seed: "Heartbeat admission", all of it;
"Heartbeat Batching" for invalid UTF-8; SPEC_INDEX ADM-01..ADM-11, S19, S20, M03, M04, L02, L03).

A heartbeat is admitted only when this node holds its session and it arrives on the HTTP/2
connection bound to the session (`actors.registry.api.admit`: node-local tables, no message).
Otherwise the answer is NOT_FOUND "unknown session" whatever the reason, so the caller cannot
learn which condition failed; the reason goes to the counters and the summary line only:

- `connection_mismatch`: `yuzu_gw_heartbeat_session_mismatch_total{event="security"}`;
- `unknown_session`, `no_connection`, `registry_unavailable`:
  `yuzu_gw_heartbeat_rejected_total{reason}`.

There is no per-heartbeat log line. `RejectionSummary` folds rejections into one INFO line,
written at the first rejection and then at most once per telemetry_gauge_interval_ms, with
reason counts only (never a session id), and only when a rejection arrives.

A heartbeat whose text is not valid UTF-8 (which the generated class refuses to parse) is read
by the heartbeat buffer's lenient decoder instead of being refused: a session id that is not
valid UTF-8 is no session this node holds (`unknown_session`, NOT_FOUND), and an admitted one
is buffered as a `RawHeartbeat`, whose tags the buffer repairs and counts (`heartbeat_invalid`;
seed: "Heartbeat Batching" > chunked flush), so the session stays online. Only bytes that are
not a heartbeat at all are INTERNAL "request cannot be decoded".

An admitted heartbeat is answered first (acknowledged, server_time) and then told to the
`heartbeat_buffer` actor. Decision: when that actor is not running (a restart gap) the heartbeat
is still acknowledged and is not buffered, with a warn-limited WARNING. Refusing it would make
the agent drop its stream and register again for a gap that is not its fault; what is lost is one
heartbeat's state, which the agent sends again on its own interval (the seed's reasoning for
every heartbeat the buffer drops). The buffer's dropped-reason set is its own, so this case is
not counted there.
"""

from __future__ import annotations

import logging
import time

import attrs
from google.protobuf.message import DecodeError
from grpclib.server import Stream

from actors.core.heartbeat_sanitise import RawHeartbeat, decode_lenient
from actors.heartbeat.api import NAME as HEARTBEAT_BUFFER
from actors.heartbeat.api import BufferHeartbeat
from actors.registry.api import (
    ADMISSION_REASONS,
    UNKNOWN_SESSION_DETAILS,
    AdmissionReason,
    admit,
)
from gateway.agent.lenient import Undecoded, escaped
from gateway.agent.plane import AgentPlane, conn_key, receive, undecodable
from gateway.agent.status import not_found
from protos.yuzu.agent.v1 import agent_pb2

__all__ = [
    "ADMISSION_STARTUP_LINE",
    "SUMMARY_PREFIX",
    "RejectionSummary",
    "heartbeat",
]

log = logging.getLogger("yuzu_gw.agent")

ADMISSION_STARTUP_LINE = (
    "Heartbeat admission is connection-bound: a heartbeat is admitted only on the connection"
    " that opened its session."
)
SUMMARY_PREFIX = "Heartbeat admission rejected heartbeats since the last summary: "


@attrs.define
class RejectionSummary:
    """Counts rejections and says when the summary line is due. One state for the node, so a
    burst of simultaneous first rejections gives one line. No clock inside: `record` takes
    `now` (monotonic seconds)."""

    interval_s: float
    _counts: dict[AdmissionReason, int] = attrs.field(init=False, factory=dict)
    _last_at: float | None = attrs.field(init=False, default=None)

    def record(self, reason: AdmissionReason, now: float) -> str | None:
        """Count one rejection; the line to log now, or None."""
        self._counts[reason] = self._counts.get(reason, 0) + 1
        if self._last_at is not None and now - self._last_at < self.interval_s:
            return None
        self._last_at = now
        counts, self._counts = self._counts, {}
        return SUMMARY_PREFIX + ", ".join(
            f"{r}={counts[r]}" for r in ADMISSION_REASONS if counts.get(r)
        )


async def heartbeat(
    plane: AgentPlane,
    summary: RejectionSummary,
    stream: Stream[agent_pb2.HeartbeatRequest, agent_pb2.HeartbeatResponse],
) -> None:
    received = await receive(stream)
    request: agent_pb2.HeartbeatRequest | RawHeartbeat
    if isinstance(received, Undecoded):
        request, session_id = _lenient(plane, received)
    else:
        request, session_id = received, received.session_id
    reason = admit(plane.runtime, session_id, conn_key())
    if reason is not None:
        plane.metrics.heartbeat_refused(reason)
        line = summary.record(reason, plane.now())
        if line is not None:
            log.info("%s", line)
        raise not_found(UNKNOWN_SESSION_DETAILS)
    response = agent_pb2.HeartbeatResponse(acknowledged=True)
    response.server_time.millis_epoch = int(time.time() * 1000)
    await stream.send_message(response)
    buffer = plane.runtime.whereis(HEARTBEAT_BUFFER)
    if buffer is None:
        plane.warn(
            "heartbeat_buffer_down",
            "Heartbeat buffer is not running: an admitted heartbeat was acknowledged and not"
            " buffered",
        )
        return
    plane.runtime.tell(buffer, BufferHeartbeat(request))


def _lenient(plane: AgentPlane, received: Undecoded) -> tuple[RawHeartbeat, str]:
    """A heartbeat whose text is not valid UTF-8, read by the buffer's lenient decoder (the
    buffer repairs its tags once it is admitted), and its session id for admission: one that
    is not valid UTF-8 is no session this node holds."""
    try:
        raw = decode_lenient(received.data)
    except DecodeError:
        raise undecodable(plane, None) from None
    assert isinstance(raw.session_id, bytes)  # the lenient decoder reads every string as bytes
    return raw, escaped(raw.session_id)
