"""yuzu-gw-ctl end to end: the command as a subprocess (`python -m gateway.ctl`) against a real
node (`running_node`, its upstream the grpcio fake server) holding grpcio agents: the dev stack's
simulated agents (each answers RUNNING then SUCCESS) and, where the test must see what reached
the agent, a bare agent from the agent-plane tests. Every assertion is on what the operator
reads (stdout, stderr, the exit status) or on what crossed the agent's wire.

The TLS postures are exercised by tests/integration/test_devstack.py (`--tls`), whose broadcast
is sent with this command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from gateway.devstack.agents import AgentSettings, Fleet, Target
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from tests.integration.test_agent_plane import agents
from tests.integration.test_management_plane import connect, gateway
from tests.support.certs import CertAuthority
from tests.support.node import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

S = agent_pb2.CommandResponse.Status
CTL = (sys.executable, "-m", "gateway.ctl")
WITHIN_S = 30.0
FLEET = 3
# Quick answers, no background chatter beyond what the test waits for.
SETTINGS = AgentSettings(heartbeat_s=30.0, inventory_s=600.0, guard_s=600.0, answer_delay_s=0.05)


@attrs.frozen
class Ran:
    code: int
    out: str
    err: str

    def objects(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.out.splitlines()]


async def ctl(*argv: str) -> Ran:
    proc = await asyncio.create_subprocess_exec(
        *CTL,
        *argv,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), WITHIN_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


def target(node: Node) -> str:
    return f"127.0.0.1:{node.ctx.bound['listener_mgmt'][1]}"


@contextlib.asynccontextmanager
async def fleet(node: Node, count: int, first: int = 1) -> AsyncIterator[Fleet]:
    made = Fleet(
        count, Target(f"127.0.0.1:{node.ctx.bound['listener_agent'][1]}"), SETTINGS, first=first
    )
    made.start()
    try:
        assert await made.wait_subscribed(WITHIN_S)
        yield made
    finally:
        await made.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_list_get_and_send(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node, fleet(node, FLEET):
            at = ("--target", target(node))
            ids = [f"devstack-agent-{n:04d}" for n in range(1, FLEET + 1)]

            # agents list: a table for people, the count on stderr.
            listed = await ctl(*at, "agents", "list")
            assert listed.code == 0, listed.err
            header, *rows = listed.out.splitlines()
            assert header.split()[:3] == ["AGENT", "ID", "HOSTNAME"]
            assert [row.split()[0] for row in rows] == ids
            assert f"-- {FLEET} agents" in listed.err
            # One page of two says where the next starts; --all pages through every agent.
            page = await ctl(*at, "--json", "agents", "list", "--limit", "2")
            assert [o["agent_id"] for o in page.objects()] == ids[:2]
            assert f"--cursor {ids[1]}" in page.err
            every = await ctl(*at, "--json", "agents", "list", "--all", "--limit", "2")
            assert [o["agent_id"] for o in every.objects()] == ids
            assert all(o["online"] for o in every.objects()) and "--cursor" not in every.err

            # agents get: the agent and its plugins; an agent not held is NOT_FOUND, status 1.
            got = await ctl(*at, "agents", "get", ids[0], "--json")
            [details] = got.objects()
            assert details["agent_id"] == ids[0] and details["hostname"]
            assert "os" in [p["name"] for p in details["plugins"]]  # type: ignore[union-attr]
            missing = await ctl(*at, "agents", "get", "no-such-agent")
            assert missing.code == 1 and "NOT_FOUND" in missing.err and missing.out == ""

            # send to one: each answer a line as it comes, RUNNING then SUCCESS; status 0.
            one = await ctl(*at, "send", ids[1], "os", "info", "--timeout", "20")
            assert one.code == 0, one.err
            assert [line.split()[:2] for line in one.out.splitlines()] == [
                [ids[1], "RUNNING"],
                [ids[1], "SUCCESS"],
            ]
            assert one.out.splitlines()[-1].endswith(f"{ids[1]}: os info done")
            assert "-- 1 target: 1 SUCCESS" in one.err

            # send --all: every held agent answers SUCCESS once, with the id the CLI chose.
            everyone = await ctl(*at, "--json", "send", "--all", "os", "info", "--command-id", "b1")
            assert everyone.code == 0, everyone.err
            finals = [o for o in everyone.objects() if o["final"]]
            assert sorted(o["agent_id"] for o in finals) == ids  # type: ignore[type-var]
            assert {o["status"] for o in finals} == {"SUCCESS"}
            assert {o["command_id"] for o in everyone.objects()} == {"b1"}

    asyncio.run(body())


def test_send_carries_the_parameters_and_a_failed_target_exits_4(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node, agents(node) as [agent]:
            stream = await connect(node, agent, "bare-1")
            argv = ["send", "bare-1", "shell", "run", "cmd=ls -l", "env=A=1", "--timeout", "20"]
            sent = asyncio.create_task(ctl("--target", target(node), *argv))
            command = await asyncio.wait_for(stream.read(), WITHIN_S)
            assert (command.plugin, command.action) == ("shell", "run")
            assert dict(command.parameters) == {"cmd": "ls -l", "env": "A=1"}
            await stream.write(
                agent_pb2.CommandResponse(
                    command_id=command.command_id, status=S.FAILURE, output="no", exit_code=2
                )
            )
            ran = await sent
            assert ran.code == 4, ran.err
            assert ran.out.split() == ["bare-1", "FAILURE", "no", "(exit", "2)"]
            assert "-- 1 target: 1 FAILURE" in ran.err
            # A target this gateway does not hold is answered FAILURE not_connected: also 4.
            absent = await ctl("--target", target(node), "send", "ghost", "os", "info")
            assert absent.code == 4 and "not_connected" in absent.out

    asyncio.run(body())


def test_watch_sees_an_agent_connect_and_leave(tmp_path: Path) -> None:
    async def body() -> None:
        async with gateway(tmp_path) as node:
            proc = await asyncio.create_subprocess_exec(
                *CTL,
                "--target",
                target(node),
                "--json",
                "watch",
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            assert proc.stdout is not None and proc.stderr is not None
            try:
                # The watch is registered once this is printed: no later event is missed.
                started = await asyncio.wait_for(proc.stderr.readline(), WITHIN_S)
                assert started.decode().startswith("watching every agent")
                async with fleet(node, 1, first=7):
                    line = await asyncio.wait_for(proc.stdout.readline(), WITHIN_S)
                    event = json.loads(line)
                    assert event["agent_id"] == "devstack-agent-0007"
                    assert event["event"] == "connected" and "session_id" not in event
                line = await asyncio.wait_for(proc.stdout.readline(), WITHIN_S)
                assert json.loads(line)["event"] == "disconnected"
                # Ctrl-C is how a watch ends: status 0.
                proc.send_signal(signal.SIGINT)
                assert await asyncio.wait_for(proc.wait(), WITHIN_S) == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    asyncio.run(body())


def test_unreachable_and_silent_targets(tmp_path: Path) -> None:
    async def body() -> None:
        # Nothing listens: refused, status 3, and what to check.
        refused = await ctl("--target", f"127.0.0.1:{free_port()}", "agents", "list")
        assert refused.code == 3 and refused.out == ""
        assert "connection refused" in refused.err and "rel/yuzu_gw ping" in refused.err

        # A port that accepts and never answers: with TLS the handshake never ends (no
        # connection in time, 3); in plaintext the call gets no answer (1).
        silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        async with silent:
            port = silent.sockets[0].getsockname()[1]
            ca, _ = CertAuthority("ctl test CA").write(tmp_path)
            tls = await ctl(
                "--target", f"127.0.0.1:{port}", "--ca", str(ca), "--timeout", "1", "watch"
            )
            assert tls.code == 3 and "no connection to" in tls.err and "within 1 s" in tls.err
            plain = await ctl("--target", f"127.0.0.1:{port}", "--timeout", "1", "agents", "list")
            assert plain.code == 1 and "no answer from" in plain.err

    asyncio.run(body())
