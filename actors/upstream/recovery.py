"""The owner-recovery lane of the `upstream` actor (seed: "When an agent's owner process
crashes", step 3; docs/owner-recovery.md).

A restarted owner asks two things of the upstream actor (actors/upstream/api.py):

* `SettleDisconnected`: the predecessor's DISCONNECTED goes into the held store like any
  notification, after every resend of the session is ended (counted
  unacked_ended{superseded}, so no refused notice of the predecessor reaches the server after
  the session is presented again). The store's `Settled` effect for it (delivered, refused,
  superseded or lost) is answered `DisconnectSettled`; the owner registers the session again
  only then, so its CONNECTED cannot coalesce with the DISCONNECTED it follows.
* `PresentSession`: ProxyRegister of the stored request with the session id in
  `x-yuzu-session-id`, on a worker through the same call path as a registration replay (the
  replay permits, the breaker, upstream_rpc_timeout_ms). accepted=true: adopted.
  accepted=false, FAILED_PRECONDITION (superseded) or any failure: not adopted, with the
  details the owner ends the agent's stream with; the agent registers again.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Final

import attrs
from grpclib.const import Status

from actors.core.breaker import ResultKind
from actors.core.notify_store import Event, NotifyKey, Settled, log_text
from actors.core.permits import Caller
from actors.upstream.api import (
    FAILED_DETAILS,
    PROXY_REGISTER,
    SESSION_ID_METADATA,
    STOPPING_DETAILS,
    Calls,
    DisconnectSettled,
    PresentSession,
    SessionPresented,
    SettleDisconnected,
    UpstreamCallError,
    UpstreamRefused,
)
from actors.upstream.lane import LaneHost
from actors.upstream.replay import NOT_ACCEPTED_DETAILS, SUPERSEDED_DETAILS
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.messages import WorkerDone

if TYPE_CHECKING:
    from actors.upstream.notify import NotifyLane
    from supervisors.address import Address

__all__ = ["PresentWork", "RecoveryLane"]

log = logging.getLogger("yuzu_gw.upstream")

_FAILED_PRECONDITION: Final = int(Status.FAILED_PRECONDITION.value)
# One line per recovery that the server did not take (no session id, the reason's class only).
NOT_PRESENTED_LINE: Final = "Owner recovery: {agent}'s session was not presented again ({why})"


@attrs.frozen
class PresentWork:
    """The tag of a presenting worker's `WorkerDone`."""

    token: int


@attrs.frozen(repr=False)
class _Out:
    owner: Address
    session_id: str
    agent_id: str


async def _present(calls: Calls, msg: PresentSession) -> agent_pb2.RegisterResponse:
    return await calls.call(
        Caller.REPLAY,
        PROXY_REGISTER,
        msg.request,
        agent_pb2.RegisterResponse,
        grpc_timeout_s=None,
        metadata={SESSION_ID_METADATA: msg.session_id},
    )


class RecoveryLane:
    """Owned by the `upstream` actor; everything here runs inside its `receiveMessage`.
    `calls` is the replay lane's call path; `stopping` is set by a planned stop (no session is
    presented again then)."""

    def __init__(self, host: LaneHost, notify: NotifyLane, calls: Calls) -> None:
        self.host = host
        self.notify = notify
        self.calls = calls
        self.stopping = False
        self._waiters: defaultdict[NotifyKey, list[Address]] = defaultdict(list)
        self._out: dict[int, _Out] = {}
        self._token = 0
        self.settled = 0
        self.presented = 0
        self.not_presented = 0

    # -- the predecessor's DISCONNECTED --

    def on_settle(self, msg: SettleDisconnected, owner: Address) -> None:
        notify = msg.notify
        self.notify.cancel_resends(notify.agent_id, notify.session_id)
        key = (notify.agent_id, notify.session_id, notify.stream_home_id)
        # Before the offer: a notification lost at the cap settles inside it.
        self._waiters[key].append(owner)
        self.notify.on_notify(notify)

    def on_settled(self, effect: Settled) -> None:
        note = effect.note
        if note.event is not Event.DISCONNECTED:
            return
        waiters = self._waiters.pop(note.key, None)
        for owner in waiters or ():
            self.settled += 1
            self.host.send(owner, DisconnectSettled(note.session_id, effect.outcome))

    # -- presenting the session again --

    def on_present(self, msg: PresentSession, owner: Address) -> None:
        if self.stopping:
            self.not_presented += 1
            self.host.send(
                owner, SessionPresented(msg.session_id, False, STOPPING_DETAILS, "stopping")
            )
            return
        self._token += 1
        self._out[self._token] = _Out(owner, msg.session_id, msg.agent_id)
        self.host.run_worker(_present(self.calls, msg), PresentWork(self._token))

    def on_done(self, done: WorkerDone) -> None:
        out = self._out.pop(done.tag.token, None)
        if out is None:
            return
        error, answer = done.error, None
        if error is None and getattr(done.result, "accepted", False):
            self.presented += 1
            answer = SessionPresented(out.session_id, True)
        elif error is None:
            answer = SessionPresented(out.session_id, False, NOT_ACCEPTED_DETAILS, "not_accepted")
        elif (
            isinstance(error, UpstreamCallError)
            and error.kind is ResultKind.STATUS
            and error.status == _FAILED_PRECONDITION
        ):
            answer = SessionPresented(out.session_id, False, SUPERSEDED_DETAILS, "superseded")
        else:
            # Refused before it was sent (no permit, the breaker open) or failed: the class only.
            why = "refused" if isinstance(error, UpstreamRefused) else type(error).__name__
            answer = SessionPresented(out.session_id, False, FAILED_DETAILS, why)
        if not answer.accepted:
            self.not_presented += 1
            line = NOT_PRESENTED_LINE.format(agent=log_text(out.agent_id), why=answer.reason)
            log.warning("%s", line)
        self.host.send(out.owner, answer)

    def status(self) -> dict[str, int]:
        """Counts only."""
        return {
            "recovery_waiting_settle": sum(len(w) for w in self._waiters.values()),
            "recovery_presenting": len(self._out),
            "recovery_settled": self.settled,
            "recovery_presented": self.presented,
            "recovery_not_presented": self.not_presented,
        }
