"""Messages between the router and the `cluster` actor (gateway/cluster/actor.py).

    router -> cluster   ForwardCommand(command, agent_ids, deadline, reply_to)  not held here
    cluster -> router   CommandAnswer / CommandFailed, as an owner sends them   per target
    router -> cluster   ForgetCommand(command_id)                                the command ended
    link -> cluster     PeerFrame / PeerEnded per forwarded command, LinkEnded once
                        (gateway/cluster/commands.py, told from the link's own task)

A peer's forwarded command reaches its router as a `LocalRouteCommand` (actors/router/api.py).

The agent directory (actors/core/agent_directory.py), read without a message: the row
`DIRECTORY_KEY` of the protected table `cluster_directory`, which the `cluster` actor owns and
alone updates (`directory_of`); its peers are the keys of `cluster_links`. The router and the
management plane only read it: where a target is, a broadcast's remote targets, the peers that
are unreachable.

The links that are up, read without a message: the public table `cluster_links` (peer
address -> link), which the `cluster` actor owns and is the only writer of. Empty or absent (no
peers, no cluster actor) means this node serves alone, and every caller then takes the
single-node path at the cost of one table lookup. A link is a `PeerLink` (the dialling side of
gateway/cluster/transport.py): what its readers call on it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

import attrs
from google.protobuf.message import Message

from actors.core.agent_directory import AgentDirectory
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2
from supervisors.address import Address
from supervisors.errors import TableGone

if TYPE_CHECKING:
    from supervisors.runtime import LoopSystemBase

M = TypeVar("M", bound=Message)


class PeerLink(Protocol):
    """One connected peer's link, as the readers of `cluster_links` use it."""

    @property
    def addr(self) -> Hashable:
        """The peer's address (the table's key; logged)."""

    def forward(self, command_id: int, request: management_pb2.SendCommandRequest) -> None:
        """Send forwarded command `command_id` on the link's command stream (never waits)."""

    def forget(self, command_id: int) -> None: ...

    async def unary(self, method: str, request: Message, reply: type[M], timeout: float) -> M:
        """One signed unary call of the cluster service."""

    def stream(
        self, method: str, request: Message, reply: type[M], timeout: float | None
    ) -> AsyncIterator[M]:
        """One signed server-streaming call of the cluster service."""


@attrs.frozen(eq=False)
class ForwardCommand:
    """Tell: ask the peers for `agent_ids`; answers go to `reply_to` until `deadline` (loop
    clock). The command is never logged (its parameters may be secrets)."""

    command: agent_pb2.CommandRequest = attrs.field(repr=False)
    agent_ids: tuple[str, ...] = attrs.field(repr=False)
    deadline: float
    reply_to: Address


@attrs.frozen(eq=False)
class PeerFrame:
    """One frame of a peer's answer to forwarded command `seq`; `peer` is the link."""

    seq: int
    peer: object
    agent_id: str = attrs.field(repr=False)
    response: agent_pb2.CommandResponse | None = attrs.field(repr=False)


@attrs.frozen
class PeerEnded:
    """The peer has no more word on forwarded command `seq` (its router ended, it refused)."""

    seq: int
    peer: object


@attrs.frozen
class LinkEnded:
    """The link's command stream is over (the peer left, the connection broke, the link was
    closed); `refused` when this node refused a frame of the peer (its MAC or sequence number).
    """

    peer: object
    refused: bool = False


CLUSTER_NAME: Final = "cluster"
LINKS_TABLE: Final = "cluster_links"
DIRECTORY_TABLE: Final = "cluster_directory"
DIRECTORY_KEY: Final = "directory"


def directory_of(runtime: LoopSystemBase) -> AgentDirectory | None:
    """The node's agent directory, or None (no cluster actor)."""
    table = runtime.table(DIRECTORY_TABLE)
    try:
        found = table.get(DIRECTORY_KEY) if table is not None else None
    except TableGone:
        return None
    return found if isinstance(found, AgentDirectory) else None


def connected_links(runtime: LoopSystemBase) -> list[PeerLink]:
    table = runtime.table(LINKS_TABLE)
    if table is None:
        return []
    try:
        return list(table.values()) if len(table) else []
    except TableGone:
        return []


def cluster_route(runtime: LoopSystemBase) -> Address | None:
    """The `cluster` actor when at least one peer is connected, or the directory remembers an
    unreachable one (its agents answer `unavailable`), else None."""
    table = runtime.table(LINKS_TABLE)
    try:
        if table is None:
            return None
        if not len(table):
            directory = directory_of(runtime)
            if directory is None or not directory.any_unreachable():
                return None
    except TableGone:
        return None
    return runtime.whereis(CLUSTER_NAME)
