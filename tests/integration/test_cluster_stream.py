"""The link's command stream (gateway/cluster/commands.py; docs/cluster.md): forwarded commands
multiplexed on one stream, a stream that breaks mid-command, frames the dialled node must
refuse (a bad MAC, a replayed or reflected frame), counted as refused calls are, and the
batches that carry the answers of one loop turn in one frame."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
from google.protobuf.empty_pb2 import Empty
from grpclib.client import Channel, Stream
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.server import Server
from grpclib.server import Stream as ServerStream

from actors.cluster.api import LinkEnded, PeerEnded, PeerFrame, connected_links
from gateway.cluster.auth import Opener, Sealer, stream_key
from gateway.cluster.batches import BATCH, MAX_BATCH_BYTES, pack, unpack
from gateway.cluster.commands import (
    ANSWER,
    COMMAND,
    COMMANDS_METHOD,
    END,
    TO_DIALLED,
    TO_DIALLER,
    CommandLink,
    Frame,
)
from gateway.cluster.transport import SERVICE, ClusterServer, ClusterService, PeerLink
from gateway.config.cluster_seeds import PeerAddr
from gateway.listeners.h2_closed_streams import CLOSED_STREAMS_KEPT
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt
from tests.integration.test_agent_plane import Metrics, agents, run, until
from tests.integration.test_cluster import FORM_S, cluster, hold, peers
from tests.integration.test_management_plane import answers, collect, command, operator, reply

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Code = grpc.StatusCode
S = agent_pb2.CommandResponse.Status
REFUSED = "yuzu_gw_cluster_auth_refused_total"
PATH = SERVICE + COMMANDS_METHOD
# Far above what any step here takes: a test that hits it has hung, not answered.
STEP_S = 5.0


def the_link(node: Node) -> PeerLink:
    assert node.runtime is not None
    [link] = connected_links(node.runtime)
    return link


def test_two_commands_interleaved_on_one_link_each_get_their_own_answers(tmp_path: Path) -> None:
    async def body() -> None:
        async with (
            cluster(tmp_path, 2) as [a, b],
            agents(b, 2) as [agent_b1, agent_b2],
            operator(a) as op,
        ):
            stream_1 = await hold(b, agent_b1, "agent-b1")
            stream_2 = await hold(b, agent_b2, "agent-b2")
            link = the_link(a)
            first = op.send(command("i1"), ("agent-b1", "agent-b2"), 30)
            for stream in (stream_1, stream_2):
                assert await asyncio.wait_for(stream.read(), STEP_S) == command("i1")
            second = op.send(command("i2"), ("agent-b1",), 30)
            assert await asyncio.wait_for(stream_1.read(), STEP_S) == command("i2")
            # Answers cross in the opposite order to the commands, progress interleaved.
            await reply(stream_1, "i2", S.RUNNING)
            await reply(stream_2, "i1", S.RUNNING)
            running = await asyncio.wait_for(second.read(), STEP_S)
            assert answers([running]) == [("agent-b1", S.RUNNING, f"s{S.RUNNING}")]
            await reply(stream_1, "i2", S.SUCCESS)
            await reply(stream_1, "i1", S.FAILURE)
            await reply(stream_2, "i1", S.SUCCESS)
            async with asyncio.timeout(STEP_S):
                got_second, code_second = await collect(second)
                got_first, code_first = await collect(first)
            assert (code_first, code_second) == (Code.OK, Code.OK)
            assert answers(got_second) == [("agent-b1", S.SUCCESS, f"s{S.SUCCESS}")]
            assert sorted(answers(got_first)) == [
                ("agent-b1", S.FAILURE, f"s{S.FAILURE}"),
                ("agent-b2", S.RUNNING, f"s{S.RUNNING}"),
                ("agent-b2", S.SUCCESS, f"s{S.SUCCESS}"),
            ]
            # Both went over the one stream the link opened: it is still the same link.
            assert the_link(a) is link and not link.ended

    run(body)


def test_a_stream_broken_mid_command_yields_agent_disconnected_and_is_redialled(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with (
            cluster(tmp_path, 2) as [a, b],
            agents(b) as [agent_b],
            operator(a) as op,
        ):
            stream_b = await hold(b, agent_b, "agent-b")
            link = the_link(a)
            call = op.send(command("x1"), ("agent-b",), 60)
            assert await asyncio.wait_for(stream_b.read(), STEP_S) == command("x1")
            # The connection breaks under the stream (grpclib 0.4.9's transport, as a network
            # failure would end it): no trailers, no answer.
            link._channel._protocol.processor.connection._transport.abort()  # type: ignore[union-attr]
            async with asyncio.timeout(STEP_S):  # at once, never the command's 60 s
                responses, code = await collect(call)
            assert code is Code.OK
            assert answers(responses) == [("agent-b", S.FAILURE, "agent_disconnected")]
            # The membership round dials it again, and commands cross on the new stream.
            await until(lambda: peers(a) == 1 and the_link(a) is not link, "the redial", FORM_S)
            again = op.send(command("x2"), ("agent-b",), 30)
            assert await asyncio.wait_for(stream_b.read(), STEP_S) == command("x2")
            await reply(stream_b, "x2", S.SUCCESS)
            async with asyncio.timeout(STEP_S):
                responses, code = await collect(again)
            assert answers(responses) == [("agent-b", S.SUCCESS, f"s{S.SUCCESS}")]

    run(body)


@asynccontextmanager
async def raw_stream(node: Node, cookie: str) -> AsyncIterator[tuple[Stream[Frame, Frame], bytes]]:
    """A command stream opened as a peer opens one (challenge, signed call), its frames left to
    the test; yields the stream and its key."""
    link = PeerLink(PeerAddr("127.0.0.1", node.ctx.bound["cluster"][1]), cookie, "tester")
    try:
        assert await link.challenge(STEP_S) == "up"
        metadata = link._metadata(PATH)
        assert link._server_nonce is not None
        key = stream_key(cookie, link._server_nonce, link._seq)
        async with link._channel.request(
            PATH, Cardinality.STREAM_STREAM, Frame, Frame, metadata=metadata, timeout=STEP_S
        ) as stream:
            await stream.send_request()
            await stream.recv_initial_metadata()
            yield stream, key
    finally:
        link.close()


async def read_to_the_end(stream: Stream[Frame, Frame]) -> None:
    """Until the dialled node ends the stream (its status is raised as the stream closes)."""
    async with asyncio.timeout(STEP_S):
        while await stream.recv_message() is not None:
            pass
        await stream.recv_trailing_metadata()


@asynccontextmanager
async def linked_pair(tmp_path: Path) -> AsyncIterator[tuple[Node, Node, str]]:
    """Two nodes of one cookie, linked to each other; and the cookie, for raw streams."""
    cookie = secrets.token_hex(32)
    async with cluster(tmp_path, 2, [cookie, cookie]) as [a, b]:
        await until(lambda: peers(a) == 1 and peers(b) == 1, "the cluster", FORM_S)
        yield a, b, cookie


@asynccontextmanager
async def refused() -> AsyncIterator[None]:
    """The block's stream ends UNAUTHENTICATED."""
    with pytest.raises(GRPCError) as ended:
        yield
    assert ended.value.status is Status.UNAUTHENTICATED


def test_frames_with_a_bad_mac_or_replayed_or_reflected_are_refused_and_counted(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with linked_pair(tmp_path) as (a, b, cookie):
            ghost = mgmt.SendCommandRequest(agent_ids=["ghost"], command=command("r1"))
            count = (await Metrics.read(b)).value(REFUSED)

            # A well-sealed command is answered, sealed for the dialler (the agent is not held
            # there: a response without `response`); the same frame again is a replay.
            async with refused(), raw_stream(b, cookie) as (stream, key):
                sealed = Sealer(key, TO_DIALLED).seal(COMMAND, 7, ghost.SerializeToString())
                await stream.send_message(Frame(sealed))
                frame = await asyncio.wait_for(stream.recv_message(), STEP_S)
                assert frame is not None
                opened = Opener(key, TO_DIALLER).open(frame.data)
                assert opened is not None
                kind, command_id, answer = opened
                assert (kind, command_id) == (ANSWER, 7)
                assert mgmt.SendCommandResponse.FromString(answer) == mgmt.SendCommandResponse(
                    agent_id="ghost"
                )
                await stream.send_message(Frame(sealed))
                await read_to_the_end(stream)
            assert (await Metrics.read(b)).value(REFUSED) == count + 1

            # One byte of the MAC changed.
            async with refused(), raw_stream(b, cookie) as (stream, key):
                sealed = bytearray(Sealer(key, TO_DIALLED).seal(COMMAND, 1, b""))
                sealed[-1] ^= 1
                await stream.send_message(Frame(bytes(sealed)))
                await read_to_the_end(stream)
            assert (await Metrics.read(b)).value(REFUSED) == count + 2

            # Sealed for the other direction (a dialled node's frame played back to it).
            async with refused(), raw_stream(b, cookie) as (stream, key):
                await stream.send_message(Frame(Sealer(key, TO_DIALLER).seal(COMMAND, 1, b"")))
                await read_to_the_end(stream)
            assert (await Metrics.read(b)).value(REFUSED) == count + 3

            # The cluster's own link was never touched.
            assert peers(a) == 1 and not the_link(a).ended

    run(body)


def test_the_answers_of_one_turn_leave_in_one_batch_frame_in_order_split_at_the_bound(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        async with linked_pair(tmp_path) as (_, b, cookie):
            few = [f"ghost-{n}" for n in range(5)]
            # About 200 KB of answers: more than three frames' worth.
            many = [f"ghost-{n:05d}-{'x' * 40}" for n in range(3000)]
            async with raw_stream(b, cookie) as (stream, key):
                sealer, opener = Sealer(key, TO_DIALLED), Opener(key, TO_DIALLER)

                async def batches(command_id: int, targets: list[str]) -> list[list[str]]:
                    """The frames answering a command to `targets` (none held there, so its
                    router answers them all in one turn): each frame's agent ids."""
                    request = mgmt.SendCommandRequest(agent_ids=targets, command=command("g"))
                    sealed = sealer.seal(COMMAND, command_id, request.SerializeToString())
                    await stream.send_message(Frame(sealed))
                    frames: list[list[str]] = []
                    while sum(map(len, frames)) < len(targets):
                        frame = await asyncio.wait_for(stream.recv_message(), STEP_S)
                        assert frame is not None
                        opened = opener.open(frame.data)
                        assert opened is not None and opened[:2] == (BATCH, 0)
                        assert len(opened[2]) <= MAX_BATCH_BYTES
                        records = unpack(opened[2])
                        assert records is not None
                        assert {(k, i) for k, i, _ in records} == {(ANSWER, command_id)}
                        frames.append(
                            [mgmt.SendCommandResponse.FromString(r).agent_id for *_, r in records]
                        )
                    return frames

                assert await batches(1, few) == [few]
                split = await batches(2, many)
                assert len(split) > 1 and [a for frame in split for a in frame] == many
                await stream.end()
                await read_to_the_end(stream)

    run(body)


async def dial_fake(key: bytes, frames: list[bytes]) -> tuple[list[object], CommandLink]:
    """A command stream to a dialled node (a bare grpclib server) that sends `frames` and holds
    the stream open; what the link delivered once it ended."""

    async def handler(stream: ServerStream[Frame, Frame]) -> None:
        await stream.send_initial_metadata()
        for data in frames:
            await stream.send_message(Frame(data))
        await asyncio.sleep(STEP_S * 2)  # the dialler must end it, not this side

    server = Server([_Fake(handler)])
    await server.start("127.0.0.1", 0)
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    channel = Channel("127.0.0.1", port)
    got: list[object] = []
    link = CommandLink("peer", got.append)
    try:
        await link.open(channel, PATH, {}, key, STEP_S)
        await until(lambda: any(isinstance(m, LinkEnded) for m in got), "the end")
    finally:
        link.close()
        channel.close()
        server.close()
        await server.wait_closed()
    return got, link


def test_the_dialling_side_refuses_a_replayed_or_forged_answer() -> None:
    async def body() -> None:
        key = secrets.token_bytes(32)
        answer = mgmt.SendCommandResponse(agent_id="agent-b", response=command_answer())
        good = Sealer(key, TO_DIALLER).seal(ANSWER, 3, answer.SerializeToString())
        forged = Sealer(secrets.token_bytes(32), TO_DIALLER).seal(ANSWER, 3, b"")

        # The first answer is delivered; the same frame again is a replay.
        got, link = await dial_fake(key, [good, good])
        [frame, ended] = got
        assert isinstance(frame, PeerFrame)
        assert (frame.seq, frame.peer, frame.agent_id) == (3, "peer", "agent-b")
        assert frame.response == answer.response
        assert ended == LinkEnded("peer", True) and link.ended
        got, link = await dial_fake(key, [forged])
        assert got == [LinkEnded("peer", True)]

    run(body)


def test_the_dialling_side_delivers_a_batch_in_order_and_refuses_a_tampered_one() -> None:
    async def body() -> None:
        key = secrets.token_bytes(32)
        sealer = Sealer(key, TO_DIALLER)
        running = agent_pb2.CommandResponse(command_id="c1", status=S.RUNNING)
        records = [
            (ANSWER, 3, mgmt.SendCommandResponse(agent_id="b1", response=running)),
            (ANSWER, 3, mgmt.SendCommandResponse(agent_id="b1", response=command_answer())),
            (ANSWER, 3, mgmt.SendCommandResponse(agent_id="b2")),
        ]
        [batch] = pack([(k, i, m.SerializeToString()) for k, i, m in records] + [(END, 4, b"")])
        good = sealer.seal(*batch)
        tampered = bytearray(sealer.seal(*batch))
        tampered[-1] ^= 1

        got, link = await dial_fake(key, [good, bytes(tampered)])
        *frames, ended, link_ended = got
        assert [(f.seq, f.peer, f.agent_id, f.response) for f in frames] == [
            (3, "peer", "b1", running),
            (3, "peer", "b1", command_answer()),
            (3, "peer", "b2", None),
        ]
        assert (ended, link_ended) == (PeerEnded(4, "peer"), LinkEnded("peer", True))
        assert link.ended
        # Well sealed, but its records do not parse: refused as well.
        got, _ = await dial_fake(key, [Sealer(key, TO_DIALLER).seal(BATCH, 0, batch[2][:-1])])
        assert got == [LinkEnded("peer", True)]

    run(body)


def command_answer() -> agent_pb2.CommandResponse:
    return agent_pb2.CommandResponse(command_id="c1", status=S.SUCCESS, output="ok")


class _Fake:
    """A dialled node's Commands method only, played by `handler`."""

    def __init__(self, handler: Any) -> None:
        self._handler = handler

    def __mapping__(self) -> dict[str, Handler]:
        return {PATH: Handler(self._handler, Cardinality.STREAM_STREAM, Frame, Frame)}


def test_both_ends_of_a_link_remember_a_bounded_number_of_closed_streams() -> None:
    """A link makes a signed call per membership probe for as long as both nodes run: h2's
    record of closed streams stays bounded on the dialling and on the dialled side
    (gateway/listeners/h2_closed_streams.py), not 65,536 entries per connection."""
    cookie = secrets.token_hex(32)

    async def body() -> None:
        server = ClusterServer(ClusterService(cookie, "dialled", cast(Any, None), lambda: None))
        await server.start("127.0.0.1", 0)
        link = PeerLink(PeerAddr("127.0.0.1", server.bound_port(0)), cookie, "dialler")
        try:
            assert await link.challenge(STEP_S) == "up"
            for _ in range(CLOSED_STREAMS_KEPT + 40):
                await link.unary("Ping", Empty(), Empty, STEP_S)
            protocol = link._channel._protocol
            assert protocol is not None
            [transport] = server._transports
            dialled = transport.get_protocol()
            assert isinstance(dialled, H2Protocol)
            for h2 in (protocol.connection._connection, dialled.connection._connection):
                # h2 files a stream as closed when the next one opens: all but the last.
                assert len(h2._closed_streams) == CLOSED_STREAMS_KEPT
        finally:
            link.close()
            server.leave()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(body(), 30.0))
