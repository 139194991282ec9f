"""The dev stack end to end: `rel/yuzu_gw devstack --agents 20` as a subprocess, a broadcast
sent with the operator CLI (`yuzu-gw-ctl send --all`, as the banner prints it), the node's
/readyz and /metrics, then SIGINT and nothing left behind. The same over TLS everywhere.

`--free-ports` keeps the run off the shipped ports (a developer's node may hold them); every
port the banner printed is checked against devstack.json and checked closed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from gateway.devstack.stack import READY_LINE
from protos.yuzu.server.v1 import management_pb2
from tests.support.node import ROOT, http_get

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

AGENTS = 20
READY_WITHIN_S = 90.0
STOP_WITHIN_S = 60.0
SEND_COMMAND = "/yuzu.server.v1.ManagementService/SendCommand"
PORT_RE = re.compile(r"127\.0\.0\.1:(\d+)")


class Devstack:
    def __init__(self, proc: asyncio.subprocess.Process, run_dir: Path, stderr: Path) -> None:
        self.proc = proc
        self.run_dir = run_dir
        self.stderr = stderr
        self.banner: list[str] = []
        self.facts: dict[str, Any] = {}

    async def ready(self) -> None:
        assert self.proc.stdout is not None
        async with asyncio.timeout(READY_WITHIN_S):
            while (line := (await self.proc.stdout.readline()).decode()) != "":
                self.banner.append(line.rstrip("\n"))
                if line.strip() == READY_LINE:
                    self.facts = json.loads((self.run_dir / "devstack.json").read_text())
                    return
        raise AssertionError(f"the dev stack ended before it was ready:\n{self.log()}")

    def log(self) -> str:
        return self.stderr.read_text(errors="replace")

    @property
    def ports(self) -> dict[str, int]:
        return self.facts["ports"]

    def printed_ports(self) -> set[int]:
        return {int(port) for line in self.banner for port in PORT_RE.findall(line)}

    def send_line(self) -> list[str]:
        """The banner's ready-to-paste command, as argv."""
        [line] = [line for line in self.banner if "devstack.client import broadcast" in line]
        return shlex.split(line)

    def ctl_line(self) -> list[str]:
        """The banner's operator CLI broadcast, as argv."""
        [line] = [line for line in self.banner if "with the operator CLI" in line]
        return shlex.split(line.split(": ", 1)[1])


@contextlib.asynccontextmanager
async def devstack(tmp_path: Path, *flags: str, **env: str) -> AsyncIterator[Devstack]:
    run_dir = tmp_path / "run"
    stderr = tmp_path / "devstack.err"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("YUZU_GW_")}
    environ.update(YUZU_GW_RUN_DIR=str(run_dir), YUZU_GW_PYTHON=sys.executable, **env)
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            str(ROOT / "rel" / "yuzu_gw"),
            "devstack",
            "--agents",
            str(AGENTS),
            "--free-ports",
            *flags,
            env=environ,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
            start_new_session=True,
        )
    stack = Devstack(proc, run_dir / "devstack", stderr)
    try:
        yield stack
    finally:
        if proc.returncode is None:  # a failed test: leave nothing behind
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            node = stack.facts.get("node_pid")
            if node:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node, signal.SIGKILL)
            await proc.wait()


def credentials(pki: Path, leaf: str) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / f"{leaf}.key").read_bytes(),
        certificate_chain=(pki / f"{leaf}.pem").read_bytes(),
    )


def management(stack: Devstack, leaf: str = "server") -> grpc.aio.Channel:
    target = f"127.0.0.1:{stack.ports['mgmt']}"
    if not stack.facts["tls"]:
        return grpc.aio.insecure_channel(target)
    return grpc.aio.secure_channel(target, credentials(Path(stack.facts["pki"]), leaf))


async def broadcast(channel: grpc.aio.Channel) -> list[management_pb2.SendCommandResponse]:
    request = management_pb2.SendCommandRequest(timeout_seconds=20)  # no agent_ids: all
    request.command.command_id = "devstack-test-1"
    request.command.plugin, request.command.action = "os", "info"
    call = channel.unary_stream(
        SEND_COMMAND,
        request_serializer=management_pb2.SendCommandRequest.SerializeToString,
        response_deserializer=management_pb2.SendCommandResponse.FromString,
    )
    return [answer async for answer in call(request, timeout=30)]


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"no {name} in /metrics"
    return float(match.group(1))


def closed(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def exercise(stack: Devstack) -> None:
    """Everything a newcomer does with a ready stack, then Ctrl-C."""
    assert stack.printed_ports() == set(stack.ports.values())
    assert len(stack.printed_ports()) == 5

    # The broadcast, with the operator CLI as the banner prints it (plus --json for the test).
    options = ["--json", "--command-id", "devstack-test-1", "--timeout", "20"]
    cli = await asyncio.create_subprocess_exec(
        *stack.ctl_line(), *options, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    out, _ = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0  # every target answered SUCCESS
    answers = [json.loads(line) for line in out.decode().splitlines()]
    final = [a for a in answers if a["final"]]
    assert [a["status"] for a in final] == ["SUCCESS"] * AGENTS
    assert len({a["agent_id"] for a in final}) == AGENTS
    for answer in final:
        assert answer["command_id"] == "devstack-test-1"
        assert answer["output"] == f"{answer['agent_id']}: os info done"

    # The banner's one-liner works as printed.
    line = await asyncio.create_subprocess_exec(
        *stack.send_line(), stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    out, _ = await asyncio.wait_for(line.communicate(), 60)
    assert line.returncode == 0
    assert f"{AGENTS} SUCCESS" in out.decode().splitlines()[-1]

    status, _ = await http_get(stack.ports["health"], "/readyz")
    assert status == 200
    status, body = await http_get(stack.ports["metrics"], "/metrics")
    assert status == 200 and metric(body.decode(), "yuzu_gw_agents_current") == AGENTS

    node_pid = stack.facts["node_pid"]
    stack.proc.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(stack.proc.wait(), STOP_WITHIN_S) == 0, stack.log()
    with pytest.raises(ProcessLookupError):
        os.kill(node_pid, 0)
    assert [port for port in stack.printed_ports() if not closed(port)] == []
    # The order of the stop: agents, then the node's planned stop, then the fake server.
    log = stack.log()
    order = ["agents stopped", "node stopped (status 0)", "fake Yuzu server stopped"]
    assert sorted(order, key=log.index) == order
    assert not (stack.run_dir / "devstack.json").exists()


def test_plaintext_devstack_fans_a_broadcast_out_and_stops_clean(tmp_path: Path) -> None:
    async def body() -> None:
        async with devstack(tmp_path) as stack:
            await stack.ready()
            await exercise(stack)

    asyncio.run(body())


def test_tls_devstack_fans_a_broadcast_out_and_stops_clean(tmp_path: Path) -> None:
    async def body() -> None:
        async with devstack(tmp_path, "--tls") as stack:
            await stack.ready()
            # Management is mutual TLS with peer authorisation: the gateway's own leaf is from
            # the right CA but is not the server's identity, so it is refused.
            async with management(stack, leaf="gateway") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await broadcast(channel)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            # A plaintext client gets no answer at all from a TLS port.
            async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.ports['mgmt']}") as plain:
                with pytest.raises(grpc.aio.AioRpcError):
                    await asyncio.wait_for(broadcast(plain), 30)
            await exercise(stack)

    asyncio.run(body())


def test_a_node_that_refuses_to_boot_stops_the_stack_with_status_1(tmp_path: Path) -> None:
    async def body() -> None:
        # A cookie shorter than 32 characters: the node's boot guard refuses it.
        async with devstack(tmp_path, YUZU_GW_COOKIE="short") as stack:
            assert await asyncio.wait_for(stack.proc.wait(), STOP_WITHIN_S) == 1
            log = stack.log()
            assert "the node exited with status 1 before it was ready" in log
            assert "fake Yuzu server stopped" in log

    asyncio.run(body())
