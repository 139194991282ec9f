"""Messages the `upstream` actor takes from the agent plane (tell, fire and forget)."""

from __future__ import annotations

import attrs

from actors.core.notify_store import Event
from protos.yuzu.agent.v1 import agent_pb2


@attrs.frozen
class Notify:
    """Hold and send a stream-status notification (NotifyStreamStatus)."""

    agent_id: str
    session_id: str = attrs.field(repr=False)
    stream_home_id: str
    event: Event
    peer_addr: str = attrs.field(repr=False)


@attrs.frozen
class ForwardGuardian:
    """Forward an unsolicited `__guard__` frame upstream with the gateway-asserted agent id
    (at most 50 in flight; dropped while the breaker is open)."""

    agent_id: str
    response: agent_pb2.CommandResponse = attrs.field(repr=False)
