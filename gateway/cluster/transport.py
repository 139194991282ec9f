"""The inter-node transport: an internal gRPC service over grpclib (docs/cluster.md).

`ClusterService` is served on the cluster port of the node's advertise address only. Every
method but `Challenge` must carry a call signature (gateway/cluster/auth.py) or is answered
UNAUTHENTICATED before its request is read. The methods reuse the management plane's messages
and its handlers, scoped to this node (`local=True`), so a forwarded call is answered exactly as
a local operator's would be:

| method | request -> response | what it does on the dialled node |
| --- | --- | --- |
| Challenge | Empty -> Empty | nonces, the dialled node's proof, its host's ports (2), in metadata |
| Ping | Empty -> Empty | nothing (the membership probe) |
| Commands | stream Frame -> stream Frame | the link's command stream (1) |
| ListAgents, GetAgent | as the management plane | its own agents |
| WatchEvents | WatchEventsRequest -> stream AgentEvent | its own agents' events |
| HeldAgents | Empty -> WatchEventsRequest | the ids of its agents, in `agent_ids` |
| Directory | Empty -> stream Frame | its agent directory (gateway/cluster/directory.py) |

(1) Every forwarded SendCommand and its answers, as sealed frames (gateway/cluster/commands.py),
routed to its own agents.
(2) `HostAdvert` (gateway/cluster/hosts.py), proven apart (`host_proof`, gateway/cluster/auth.py),
so a dialler from before adverts reads the answer as it always did.

`PeerLink` is the dialling side: one grpclib channel (one HTTP/2 connection) per peer, and on
it the link's one command stream.

Both take the links' TLS context (gateway/config/cluster_tls.py) or None for plaintext links (the
development posture): over TLS a connection reaches grpclib, and so any method, only once its
mutual handshake is done, and the server drops it unread unless the peer's leaf also carries
serverAuth, as a gateway's does and an agent's, of the same install CA, does not (OpenSSL checks
only clientAuth of a client).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

from google.protobuf import empty_pb2
from google.protobuf.message import Message
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.server import Server, Stream

from actors.registry.api import held_agent_ids
from gateway.cluster.auth import (
    UNAUTHENTICATED_DETAILS,
    ServerNonces,
    call_proof,
    host_proof,
    new_nonce,
    parse_call_auth,
    server_proof,
    stream_key,
    verify,
)
from gateway.cluster.commands import COMMANDS_METHOD, CommandLink, Frame, serve_commands
from gateway.cluster.directory import DIRECTORY_METHOD, serve_directory
from gateway.cluster.hosts import HostAdvert
from gateway.config.certs import read_peer
from gateway.config.cluster_seeds import PeerAddr
from gateway.listeners.h2_closed_streams import bound_closed_streams
from gateway.mgmt.agents import get_agent, list_agents
from gateway.mgmt.command import ResponseWriter, run_command
from gateway.mgmt.metrics import CommandOutcome
from gateway.mgmt.plane import MgmtPlane
from gateway.mgmt.watch import watch_events
from protos.yuzu.server.v1 import management_pb2 as mgmt

__all__ = ["SERVICE", "ClusterServer", "ClusterService", "PeerLink"]

log = logging.getLogger("yuzu_gw.cluster")

SERVICE = "/yuzu.gateway.cluster.v1.Cluster/"
NONCE_KEY = "x-yuzu-cluster-nonce"
PROOF_KEY = "x-yuzu-cluster-proof"
NODE_KEY = "x-yuzu-cluster-node"
AUTH_KEY = "x-yuzu-cluster-auth"
HOST_KEY = "x-yuzu-cluster-host"
HOST_PROOF_KEY = "x-yuzu-cluster-host-proof"
_NONCE_CHARS = 32

M = TypeVar("M", bound=Message)
Empty = empty_pb2.Empty


class ClusterService:
    """The dialled side (module doc). `on_refused` is told each refused call (metrics, log)."""

    def __init__(
        self, cookie: str, node_id: str, plane: MgmtPlane, on_refused: Callable[[], None]
    ) -> None:
        self._cookie = cookie
        self._node_id = node_id
        self._plane = plane
        self._nonces = ServerNonces()
        self._on_refused = on_refused
        # This node's host's cluster ports, told to every dialler; None until the listener is
        # bound (the node knows the port then), and so an answer like an older gateway's.
        self.advert: HostAdvert | None = None

    def __mapping__(self) -> dict[str, Handler]:
        unary, stream = Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM
        plane = self._plane
        return {
            SERVICE + "Challenge": Handler(self._challenge, unary, Empty, Empty),
            SERVICE + "Ping": self._signed("Ping", self._ping, unary, Empty, Empty),
            SERVICE + "HeldAgents": self._signed(
                "HeldAgents", self._held, unary, Empty, mgmt.WatchEventsRequest
            ),
            SERVICE + COMMANDS_METHOD: self._signed(
                COMMANDS_METHOD, self._commands, Cardinality.STREAM_STREAM, Frame, Frame
            ),
            SERVICE + DIRECTORY_METHOD: self._signed(
                DIRECTORY_METHOD, self._directory, stream, Empty, Frame
            ),
            SERVICE + "ListAgents": self._signed(
                "ListAgents",
                lambda s: list_agents(plane, s, local=True),
                unary,
                mgmt.ListAgentsRequest,
                mgmt.ListAgentsResponse,
            ),
            SERVICE + "GetAgent": self._signed(
                "GetAgent",
                lambda s: get_agent(plane, s, local=True),
                unary,
                mgmt.GetAgentRequest,
                mgmt.GetAgentResponse,
            ),
            SERVICE + "WatchEvents": self._signed(
                "WatchEvents",
                lambda s: watch_events(plane, s, local=True),
                stream,
                mgmt.WatchEventsRequest,
                mgmt.AgentEvent,
            ),
        }

    def _signed(
        self,
        method: str,
        handler: Callable[[Stream[Any, Any]], Awaitable[None]],
        cardinality: Cardinality,
        request: type[Message],
        reply: type[Message],
    ) -> Handler:
        path = SERVICE + method

        async def checked(stream: Stream[Any, Any]) -> None:
            value = stream.metadata.get(AUTH_KEY) if stream.metadata else None
            if not isinstance(value, str) or not self._nonces.check(self._cookie, value, path):
                self._on_refused()
                raise GRPCError(Status.UNAUTHENTICATED, UNAUTHENTICATED_DETAILS)
            await handler(stream)

        return Handler(checked, cardinality, request, reply)

    async def _challenge(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        client_nonce = stream.metadata.get(NONCE_KEY) if stream.metadata else None
        if not isinstance(client_nonce, str) or len(client_nonce) != _NONCE_CHARS:
            self._on_refused()
            raise GRPCError(Status.UNAUTHENTICATED, UNAUTHENTICATED_DETAILS)
        nonce = self._nonces.issue()
        proof = server_proof(self._cookie, client_nonce, nonce, self._node_id)
        metadata = {NONCE_KEY: nonce, PROOF_KEY: proof, NODE_KEY: self._node_id}
        if self.advert is not None:
            ports = self.advert.encode()
            metadata[HOST_KEY] = ports
            metadata[HOST_PROOF_KEY] = host_proof(
                self._cookie, client_nonce, nonce, self._node_id, ports
            )
        await stream.send_initial_metadata(metadata=metadata)
        await stream.send_message(Empty())

    async def _ping(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        await stream.send_message(Empty())

    async def _held(self, stream: Stream[Any, Any]) -> None:
        await stream.recv_message()
        ids = held_agent_ids(self._plane.runtime) or []
        await stream.send_message(mgmt.WatchEventsRequest(agent_ids=ids))

    async def _directory(self, stream: Stream[Any, Any]) -> None:
        """This node's agent directory: its full sync, then its joins and leaves."""
        await serve_directory(stream, self._plane.runtime)

    async def _commands(self, stream: Stream[Frame, Frame]) -> None:
        # `_signed` checked the signature: its (sn, seq) keys the stream's frames.
        parsed = parse_call_auth(stream.metadata[AUTH_KEY]) if stream.metadata else None
        assert parsed is not None
        key = stream_key(self._cookie, parsed[0], parsed[1])
        await serve_commands(stream, key, self._route, self._on_refused)

    def _route(
        self, request: mgmt.SendCommandRequest, stream: ResponseWriter
    ) -> Awaitable[CommandOutcome]:
        """A forwarded command, answered as a local operator's, for this node's agents."""
        return run_command(self._plane, request, stream, local=True)


class ClusterServer(Server):
    """grpclib's server plus `leave`: close the listener and every connection, so the peers'
    calls fail at once (their targets settle `agent_disconnected`) instead of waiting for their
    deadline, as they would behind grpclib's `close`, which only cancels the handlers. Each
    connection remembers a bounded number of closed streams
    (gateway/listeners/h2_closed_streams.py).
    Written against grpclib 0.4.9 (`_protocol_factory`)."""

    def __init__(self, service: ClusterService, tls: ssl.SSLContext | None = None) -> None:
        super().__init__([service])
        self._tls = tls
        self._transports: set[asyncio.BaseTransport] = set()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        made, lost = protocol.connection_made, protocol.connection_lost
        transports = self._transports
        tls = self._tls

        def connection_made(transport: asyncio.BaseTransport) -> None:
            transports.add(transport)
            made(transport)
            bound_closed_streams(protocol.connection._connection)
            if tls is not None and not _gateway_leaf(transport):
                transport.abort()  # before grpclib has read a byte of it

        def connection_lost(exc: Exception | None) -> None:
            transports.difference_update([t for t in transports if t.is_closing()])
            lost(exc)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        return protocol

    async def serve(self, host: str, port: int) -> None:
        """Listen on `host`:`port`, over TLS when the server was given a context."""
        await self.start(host, port, ssl=self._tls)

    def bound_port(self, default: int) -> int:
        sockets = self._server.sockets if self._server is not None else ()
        return int(sockets[0].getsockname()[1]) if sockets else default

    def leave(self) -> None:
        self.close()
        for transport in list(self._transports):
            transport.close()
        self._transports.clear()


def _gateway_leaf(transport: asyncio.BaseTransport) -> bool:
    """The TLS peer's leaf is a gateway's: it may serve as well as dial (module doc)."""
    tls = transport.get_extra_info("ssl_object")
    peer = read_peer(tls.getpeercert(binary_form=True) if tls is not None else None)
    return peer is not None and peer.server_auth


class _PeerChannel(Channel):
    """grpclib's channel, its connection remembering a bounded number of closed streams: a
    link makes a signed call per membership probe for as long as both nodes run.
    Written against grpclib 0.4.9 (`_protocol_factory`)."""

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        made = protocol.connection_made

        def connection_made(transport: asyncio.BaseTransport) -> None:
            made(transport)
            bound_closed_streams(protocol.connection._connection)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        return protocol


class PeerLink:
    """The dialling side of one peer (module doc). `challenge` first; then the signed calls."""

    def __init__(
        self, addr: PeerAddr, cookie: str, node_id: str, tls: ssl.SSLContext | None = None
    ) -> None:
        self.addr = addr
        self._cookie = cookie
        self._node_id = node_id
        self._channel: Channel = _PeerChannel(addr.host, addr.port, ssl=tls)
        self._server_nonce: str | None = None
        self._seq = 0
        self._commands: CommandLink | None = None
        self.peer_node: str | None = None
        # What the peer's challenge answer said of its host: None when it said nothing.
        self.peer_host: HostAdvert | None = None

    def close(self) -> None:
        if self._commands is not None:
            self._commands.close()
        self._channel.close()

    async def dial(
        self, timeout: float, deliver: Callable[[Any], None]
    ) -> Literal["up", "self", "refused"]:
        """The challenge, then the link's command stream (its answers go to `deliver`)."""
        outcome = await self.challenge(timeout)
        if outcome != "up":
            return outcome
        path = SERVICE + COMMANDS_METHOD
        metadata = self._metadata(path)
        assert self._server_nonce is not None
        key = stream_key(self._cookie, self._server_nonce, self._seq)
        self._commands = CommandLink(self, deliver)
        try:
            await self._commands.open(self._channel, path, metadata, key, timeout)
        except GRPCError as exc:
            if exc.status is Status.UNAUTHENTICATED:
                return "refused"
            raise
        return "up"

    @property
    def ended(self) -> bool:
        """The command stream opened and is over since (the link is down)."""
        return self._commands is not None and self._commands.ended

    def forward(self, command_id: int, request: mgmt.SendCommandRequest) -> None:
        """Send forwarded command `command_id` on the command stream (never waits)."""
        if self._commands is not None:
            self._commands.forward(command_id, request)

    def forget(self, command_id: int) -> None:
        if self._commands is not None:
            self._commands.forget(command_id)

    async def challenge(self, timeout: float) -> Literal["up", "self", "refused"]:
        """Prove the peer has the cookie and read its host's ports (`peer_host`); "self" when
        the address is this very node. Ports whose proof is missing or wrong refuse the link;
        proven ports that do not parse are read as none."""
        client_nonce = new_nonce()
        metadata = {NONCE_KEY: client_nonce, NODE_KEY: self._node_id}
        async with self._channel.request(
            SERVICE + "Challenge",
            Cardinality.UNARY_UNARY,
            Empty,
            Empty,
            timeout=timeout,
            metadata=metadata,
        ) as stream:
            await stream.send_message(Empty(), end=True)
            await stream.recv_initial_metadata()
            got = stream.initial_metadata or {}
            await stream.recv_message()
        nonce, proof, node = got.get(NONCE_KEY), got.get(PROOF_KEY), got.get(NODE_KEY)
        if not (isinstance(nonce, str) and isinstance(proof, str) and isinstance(node, str)):
            return "refused"
        if not verify(server_proof(self._cookie, client_nonce, nonce, node), proof):
            return "refused"
        if node == self._node_id:
            return "self"
        ports, ports_proof = got.get(HOST_KEY), got.get(HOST_PROOF_KEY)
        advert = None
        if ports is not None:
            if not (isinstance(ports, str) and isinstance(ports_proof, str)):
                return "refused"
            if not verify(host_proof(self._cookie, client_nonce, nonce, node, ports), ports_proof):
                return "refused"
            advert = HostAdvert.decode(ports)
        self._server_nonce, self.peer_node, self.peer_host = nonce, node, advert
        return "up"

    def _metadata(self, path: str) -> dict[str, str]:
        if self._server_nonce is None:
            raise GRPCError(Status.UNAUTHENTICATED, "link not challenged")
        self._seq += 1
        mac = call_proof(self._cookie, self._server_nonce, self._seq, path)
        return {AUTH_KEY: f"{self._server_nonce}.{self._seq}.{mac}"}

    async def unary(self, method: str, request: Message, reply: type[M], timeout: float) -> M:
        path = SERVICE + method
        async with self._channel.request(
            path,
            Cardinality.UNARY_UNARY,
            type(request),
            reply,
            timeout=timeout,
            metadata=self._metadata(path),
        ) as stream:
            await stream.send_message(request, end=True)
            answer = await stream.recv_message()
            await stream.recv_trailing_metadata()
        if answer is None:
            raise GRPCError(Status.UNKNOWN, "no answer")
        return answer

    async def stream(
        self, method: str, request: Message, reply: type[M], timeout: float | None
    ) -> AsyncIterator[M]:
        path = SERVICE + method
        async with self._channel.request(
            path,
            Cardinality.UNARY_STREAM,
            type(request),
            reply,
            timeout=timeout,
            metadata=self._metadata(path),
        ) as stream:
            await stream.send_message(request, end=True)
            while (message := await stream.recv_message()) is not None:
                yield message
            await stream.recv_trailing_metadata()
