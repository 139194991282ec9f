"""The router's registered name (`router`) and its contract with the SendCommand handler
(gateway/mgmt/command.py).

    handler -> router   RouteCommand(command, agent_ids, timeout_seconds, sink)   (tell)
    router -> sink      sink.put(response, kind, final) for every answer, as it arrives
                        sink.finish("completed") when every target has its terminal answer,
                        sink.finish("timeout") at the timeout (the stream ends OK either way)
    handler -> router   AbandonCommand(sink) when the operator went away before the end

The sink is the handler's object, like the owner's `StreamHandle`: the router only calls its
two methods, which never block and never await, so a slow operator stream cannot hold the
router (the sink decides what it keeps; gateway/mgmt/command.py). The handler watches the router:
a router that ends with the command in flight ends the stream UNAVAILABLE.

`LocalRouteCommand` is the RouteCommand a peer's forwarded call gives its own router (the
handler run with `local`, for the cluster transport): routed to this node's agents only, never
forwarded again, so a command cannot loop between nodes, and a target not held here is answered
to the forwarding node as "not held", not `not_connected`.

The owners' side of the conversation (DeliverCommand, CommandAnswer, CommandFailed,
ForgetCommand) is in actors/agents/api.py; the router's side of the cluster (ForwardCommand) is
in actors/cluster/api.py.
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

import attrs

from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2

__all__ = [
    "NOT_CONNECTED",
    "RESPONSE_KINDS",
    "ROUTER_NAME",
    "UNAVAILABLE",
    "AbandonCommand",
    "CommandSink",
    "LocalRouteCommand",
    "ResponseKind",
    "RouteCommand",
]

ROUTER_NAME: Final = "router"

# The FAILURE output for a target this node does not hold (or that has not subscribed yet).
NOT_CONNECTED = "not_connected"
# The FAILURE output for a target known to be on a node this one cannot reach now (its link is
# down): retryable, nothing was sent (docs/cluster.md, "What an operator sees").
UNAVAILABLE = "unavailable"

# What each response on an operator's stream is (the label of
# yuzu_gw_mgmt_command_responses_total): `agent`, a frame of the agent itself; the rest are the
# terminal answers the gateway writes for a target (FAILURE with that output, or TIMEOUT).
ResponseKind = Literal[
    "agent",
    "not_connected",
    "agent_disconnected",
    "duplicate_command_id",
    "stream_stuck",
    "too_many_pending",
    "timeout",
    "unavailable",
]
RESPONSE_KINDS: tuple[ResponseKind, ...] = (
    "agent",
    "not_connected",
    "agent_disconnected",
    "duplicate_command_id",
    "stream_stuck",
    "too_many_pending",
    "timeout",
    "unavailable",
)


class CommandSink(Protocol):
    """Where the router writes one command's responses (the handler's side)."""

    def put(
        self, response: management_pb2.SendCommandResponse, kind: ResponseKind, final: bool
    ) -> None:
        """One response for the operator; `final` when it is its target's terminal answer."""

    def finish(self, outcome: Literal["completed", "timeout"]) -> None:
        """The command is over: end the operator's stream OK after what is queued."""


@attrs.frozen(eq=False)
class RouteCommand:
    """Tell: fan `command` out to `agent_ids` (empty: every agent this node holds) and stream
    the answers into `sink`. `timeout_seconds` is the request's, unclamped. The command is
    forwarded untouched; it is never logged or shown (its parameters may be secrets)."""

    command: agent_pb2.CommandRequest = attrs.field(repr=False)
    agent_ids: tuple[str, ...] = attrs.field(repr=False)
    timeout_seconds: int
    sink: CommandSink = attrs.field(repr=False)


@attrs.frozen(eq=False)
class LocalRouteCommand(RouteCommand):
    """A RouteCommand for this node's agents only (module doc)."""


@attrs.frozen(eq=False)
class AbandonCommand:
    """Tell: nobody reads `sink` any more (the operator cancelled, its deadline passed, its
    connection closed). The router forgets the command and tells the owners to."""

    sink: CommandSink = attrs.field(repr=False)
