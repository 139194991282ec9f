"""A link cut between two nodes (issue 22; docs/cluster.md, "What an operator sees"): node a
reaches node b's cluster port only through a TCP relay in the test, which the test pauses (it
drops every byte both ways, the connections stay open, as a partition does). While cut, b's
agent answers the retryable `unavailable` (never `not_connected`), a broadcast names b on a
final line of its own, and ListAgents says b is missing and does not claim a complete
listing; once the relay forwards again, b's agent is reached as before."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import pytest

from gateway.mgmt.agents import UNREACHABLE_KEY
from gateway.mgmt.command import NODE_UNREACHABLE
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt
from tests.integration.test_agent_plane import agents, run, until
from tests.integration.test_cluster import FORM_S, cluster, free_port, hold, knows, peers
from tests.integration.test_management_plane import (
    SERVICE,
    answers,
    collect,
    command,
    operator,
    reply,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Code = grpc.StatusCode
S = agent_pb2.CommandResponse.Status


class Relay:
    """127.0.0.1:`port` -> 127.0.0.1:`target`, byte for byte; `paused` drops every byte."""

    def __init__(self, port: int, target: int) -> None:
        self.port, self.target = port, target
        self.paused = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while data := await src.read(65536):
                if not self.paused:
                    dst.write(data)
                    await dst.drain()
        dst.close()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def test_a_cut_link_answers_unavailable_and_a_truthful_broadcast(tmp_path: Path) -> None:
    async def body() -> None:
        relay = Relay(free_port(), 0)

        def seeds(n: int, ports: list[int]) -> list[str]:
            # a dials b through the relay (aimed at b's port, known now); b dials a directly.
            relay.target = ports[1]
            return [f"127.0.0.1:{relay.port}"] if n == 0 else [f"127.0.0.1:{ports[0]}"]

        await relay.start()
        try:
            async with contextlib.AsyncExitStack() as stack:
                a, b = await stack.enter_async_context(cluster(tmp_path, 2, seeds_of=seeds))
                [agent_a] = await stack.enter_async_context(agents(a))
                [agent_b] = await stack.enter_async_context(agents(b))
                op = await stack.enter_async_context(operator(a))
                stream_a = await hold(a, agent_a, "agent-a")
                stream_b = await hold(b, agent_b, "agent-b")
                relay_addr = f"127.0.0.1:{relay.port}"

                relay.paused = True
                await until(lambda: peers(a) == 0, "a to lose b", FORM_S)
                # b's agent is known to be on a node a cannot reach: retryable, nothing sent.
                responses, code = await collect(op.send(command("u1"), ("agent-b",), 30))
                assert code is Code.OK
                assert answers(responses) == [("agent-b", S.FAILURE, "unavailable")]
                # A broadcast: a's agent, b's agent unavailable, then a line naming b.
                call = op.send(command("u2"), (), 30)
                assert await asyncio.wait_for(stream_a.read(), 5) == command("u2")
                await reply(stream_a, "u2", S.SUCCESS)
                responses, code = await collect(call)
                assert code is Code.OK
                *agents_answers, last = responses
                assert sorted(answers(agents_answers)) == [
                    ("agent-a", S.SUCCESS, f"s{S.SUCCESS}"),
                    ("agent-b", S.FAILURE, "unavailable"),
                ]
                assert last.agent_id == ""
                assert last.response.status == S.FAILURE
                assert last.response.output == "unavailable"
                assert last.response.error.code == NODE_UNREACHABLE
                assert dict(last.response.error.metadata) == {"node": relay_addr}
                # ListAgents: what a has, b named as missing, the listing not claimed complete.
                list_call = op.channel.unary_unary(
                    SERVICE + "ListAgents",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=mgmt.ListAgentsResponse.FromString,
                )(mgmt.ListAgentsRequest(limit=100), timeout=10)
                page = await list_call
                assert [s.agent_id for s in page.agents] == ["agent-a"]
                assert page.next_cursor == "agent-a"
                trailers = dict(await list_call.trailing_metadata())
                assert trailers[UNREACHABLE_KEY] == relay_addr

                relay.paused = False
                await until(lambda: peers(a) == 1 and knows(a, "agent-b"), "a and b again", FORM_S)
                call = op.send(command("u3"), ("agent-b",), 30)
                # The first command b's agent sees: it never got u1 or u2.
                assert await asyncio.wait_for(stream_b.read(), 5) == command("u3")
                await reply(stream_b, "u3", S.SUCCESS)
                responses, code = await collect(call)
                assert answers(responses) == [("agent-b", S.SUCCESS, f"s{S.SUCCESS}")]
                page = await op.unary(
                    "ListAgents", mgmt.ListAgentsRequest(limit=100), mgmt.ListAgentsResponse
                )
                assert [s.agent_id for s in page.agents] == ["agent-a", "agent-b"]
                assert page.next_cursor == ""
        finally:
            await relay.stop()

    run(body)
