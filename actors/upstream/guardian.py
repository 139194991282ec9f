"""The Guardian forward lane of the `upstream` actor.

An agent's owner tells the actor `ForwardGuardian(agent_id, response)` for every unsolicited
`__guard__` frame its agent sends; this lane forwards it with ForwardGuardianMessage. The agent
id is the one the owner asserts from the stream's bound identity, never read from the frame
(WIRE.md), and is sent as given.

Rules (seed: "How the gateway sizes its upstream calls", "Slow server"; issue 4 section 4;
SPEC_INDEX K18, K19, CB-17):

* At most 50 forwards in flight: the 50 streams the permit sizing sets aside for this lane, so
  Guardian traffic never competes with registrations for the server's stream limit. A frame
  that finds all 50 busy is dropped, not queued: Guardian events are best effort and a queue
  would only grow while the server is slow.
* Dropped while the breaker is open: the server is failing, and a forward would only add
  failures. In half open a forward is admitted like any call-path RPC (the breaker's policy).
* Each result feeds the breaker with `Lane.GUARDIAN` through the host's breaker shell; the call
  takes upstream_rpc_timeout_ms.

Drops are counted (`yuzu_gw_upstream_guardian_dropped_total{reason}`) and logged at most once a
second per reason with the number held back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from actors.core.breaker import Lane, ResultKind, State
from actors.core.notify_store import log_text
from actors.core.permits import GUARDIAN_STREAMS
from actors.core.slow_server import LaneFlag, SlowLane
from actors.core.warn_limit import WarnLimiter
from actors.upstream.api import FORWARD_GUARDIAN_MESSAGE, ForwardGuardian
from actors.upstream.lane import CallResult, LaneHost, result_of, start_call
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.messages import WorkerDone

if TYPE_CHECKING:
    from actors.core.breaker import Ticket
    from actors.upstream.metrics import GuardianMetrics

__all__ = ["DROPPED_LINE", "MAX_INFLIGHT", "GuardianLane", "GuardianWork"]

log = logging.getLogger("yuzu_gw.upstream")

# 50: the Guardian streams reserved outside the permits (K18, K19).
MAX_INFLIGHT: Final = GUARDIAN_STREAMS
# The seed names no line for a dropped forward; this rebuild's, at most one a second per reason.
DROPPED_LINE: Final = "Guardian frame from {agent} not forwarded upstream: {reason}"

DropReason = Literal["circuit_open", "at_capacity"]


@attrs.frozen
class GuardianWork:
    """The tag of a Guardian worker's `WorkerDone`."""

    token: int


class GuardianLane:
    """Forwards in flight and their breaker tickets. Owned by the `upstream` actor; each call
    takes `rpc_timeout_s` (upstream_rpc_timeout_ms)."""

    def __init__(self, host: LaneHost, rpc_timeout_s: float, metrics: GuardianMetrics) -> None:
        self.host = host
        self.rpc_timeout_s = rpc_timeout_s
        self.metrics = metrics
        self.forwarded = 0
        self.dropped: dict[DropReason, int] = {"circuit_open": 0, "at_capacity": 0}
        self._out: dict[int, Ticket] = {}
        self._token = 0
        self._limiter = WarnLimiter()
        # All 50 slots held is the `guardian` lane's saturation (the slow-server sampler).
        self._saturation = LaneFlag(SlowLane.GUARDIAN, host.table.insert)
        metrics.watch(lambda: len(self._out))

    @property
    def inflight(self) -> int:
        return len(self._out)

    def detach(self) -> None:
        self.metrics.watch(None)

    def on_forward(self, msg: ForwardGuardian) -> None:
        host = self.host
        now = host.now()
        breaker = host.breaker
        host.perform(breaker.poll(now))  # an open period that has just ended admits it
        if breaker.state is State.OPEN:
            self._drop(msg, "circuit_open", now)
            return
        if len(self._out) >= MAX_INFLIGHT:
            self._drop(msg, "at_capacity", now)
            return
        admission = breaker.admit(now)
        host.perform(list(admission.effects))
        if not admission.allowed or admission.ticket is None:
            self._drop(msg, "circuit_open", now)
            return
        self._token += 1
        token = self._token
        self._out[token] = admission.ticket
        self._saturation.update(len(self._out) >= MAX_INFLIGHT)
        self.forwarded += 1
        agent_id, response = msg.agent_id, msg.response
        start_call(
            host,
            GuardianWork(token),
            FORWARD_GUARDIAN_MESSAGE,
            lambda: gateway_pb2.ForwardGuardianRequest(agent_id=agent_id, response=response),
            gateway_pb2.ForwardGuardianAck,
            timeout=self.rpc_timeout_s,
        )

    def on_done(self, done: WorkerDone) -> None:
        ticket = self._out.pop(done.tag.token, None)
        if ticket is None:
            return
        self._saturation.update(len(self._out) >= MAX_INFLIGHT)
        result = result_of(done)
        if result is None:
            result = CallResult(ResultKind.EXCEPTION, detail=type(done.error).__name__)
        if result.kind is ResultKind.OK:
            acknowledged = getattr(result.response, "acknowledged", False)
            outcome = "acknowledged" if acknowledged else "unacknowledged"
        else:
            outcome = "failed"
        self.metrics.forwarded.labels(outcome).inc()
        # An unacknowledged forward is still an answer from a working server: OK to the breaker.
        self.host.record(ticket, Lane.GUARDIAN, FORWARD_GUARDIAN_MESSAGE, result)

    def _drop(self, msg: ForwardGuardian, reason: DropReason, now: float) -> None:
        self.dropped[reason] += 1
        self.metrics.dropped.labels(reason).inc()
        suffix = self._limiter.admit(reason, now)
        if suffix is not None:
            text = DROPPED_LINE.format(agent=log_text(msg.agent_id), reason=reason)
            log.warning("%s%s", text, suffix)

    def status(self) -> dict[str, Any]:
        return {
            "guardian_inflight": len(self._out),
            "guardian_forwarded": self.forwarded,
            "guardian_dropped_circuit_open": self.dropped["circuit_open"],
            "guardian_dropped_at_capacity": self.dropped["at_capacity"],
        }
