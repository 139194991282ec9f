"""Memory shedding on a real node (`running_node`, in this process) whose memory reader is a fake
the test drives (`gateway.node.memory_reader.READER`, swapped before the node starts).

What crosses a wire is what is checked: a new TCP connection to the agent port is refused while
an established grpcio channel keeps getting answers; `/readyz` is 503 naming the checks, then 200;
`/metrics` shows the gauges and counters; a resume that cannot bind keeps `/readyz` red until the
port is free (seed: "What a new agent connection sees while shedding", "When a suspend or resume
fails"; SPEC_INDEX MS-02..MS-04, MS-07, MS-09)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest

from actors.memory import reclaim as mem_reclaim
from gateway.config.refusal import BootRefused
from gateway.node import memory_reader
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from tests.support.node import TEST_CONFIG, http_get, running_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

HIGH, LOW = 200_000_000, 100_000_000
SHEDDING = (
    f"{{memory_shedding, #{{interval_ms => 20, high_water_bytes => {HIGH},"
    f" low_water_bytes => {LOW}}}}}"
)


class Memory:
    def __init__(self) -> None:
        self.used = 0

    def __call__(self) -> int:
        return self.used


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Memory:
    fake = Memory()
    monkeypatch.setattr(memory_reader, "READER", fake)
    return fake


def write_config(tmp_path: Path, shedding: str = SHEDDING) -> Path:
    config = tmp_path / "shedding.config"
    config.write_text(
        TEST_CONFIG.read_text().replace(
            "{allow_no_upstream, true}", f"{{allow_no_upstream, true}}, {shedding}"
        )
    )
    return config


def agent_port(node: Node) -> int:
    return node.ctx.bound["listener_agent"][1]


async def heartbeat(channel: grpc.aio.Channel) -> grpc.StatusCode:
    """One Heartbeat for a session nobody holds: the gateway answers NOT_FOUND itself, so an
    answer proves the connection is served."""
    call = channel.unary_unary(
        "/yuzu.agent.v1.AgentService/Heartbeat",
        request_serializer=agent_pb2.HeartbeatRequest.SerializeToString,
        response_deserializer=agent_pb2.HeartbeatResponse.FromString,
    )
    try:
        await call(agent_pb2.HeartbeatRequest(session_id="nobody"), timeout=5)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def channel(port: int) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )


async def readyz(node: Node) -> tuple[int, dict[str, object]]:
    status, body = await http_get(node.ctx.bound["health"][1], "/readyz")
    return status, json.loads(body)


async def metric(node: Node, name: str) -> float:
    _, body = await http_get(node.ctx.bound["metrics"][1], "/metrics")
    match = re.search(rf"^{re.escape(name)} (\S+)$", body.decode(), re.MULTILINE)
    assert match is not None, name
    return float(match.group(1))


async def until(predicate: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not await predicate():  # type: ignore[misc]
            await asyncio.sleep(0.02)


async def refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


def test_shedding_refuses_new_agents_keeps_established_ones_and_turns_readyz_red(
    tmp_path: Path, memory: Memory
) -> None:
    async def main() -> None:
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(write_config(tmp_path))) as node:
            port = agent_port(node)
            held = channel(port)
            try:
                assert await heartbeat(held) == grpc.StatusCode.NOT_FOUND
                assert (await readyz(node))[0] == 200

                memory.used = HIGH
                await until(lambda: refused(port), "the agent port to refuse")
                status, body = await readyz(node)
                assert status == 503
                assert body["failing"] == ["listeners", "memory_shedding"]
                # The established connection is untouched and keeps being served.
                assert await heartbeat(held) == grpc.StatusCode.NOT_FOUND
                assert await metric(node, "yuzu_gw_memory_shedding_active") == 1
                assert await metric(node, "yuzu_gw_memory_shedding_suspensions_total") == 1

                memory.used = LOW + 1  # between the marks: still shedding
                await asyncio.sleep(0.2)
                assert await refused(port)

                memory.used = LOW
                await until(lambda: _ready(node), "/readyz to turn ready")
                assert not await refused(port)
                fresh = channel(port)
                try:
                    assert await heartbeat(fresh) == grpc.StatusCode.NOT_FOUND
                finally:
                    await fresh.close()
                assert await heartbeat(held) == grpc.StatusCode.NOT_FOUND
                assert await metric(node, "yuzu_gw_memory_shedding_active") == 0
                assert await metric(node, "yuzu_gw_memory_shedding_high_water_bytes") == HIGH
                assert await metric(node, "yuzu_gw_memory_shedding_low_water_bytes") == LOW
            finally:
                await held.close()

    asyncio.run(main())


async def _ready(node: Node) -> bool:
    return (await readyz(node))[0] == 200


def test_a_resume_that_cannot_bind_keeps_readyz_red_until_the_port_is_free(
    tmp_path: Path, memory: Memory
) -> None:
    async def main() -> None:
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(write_config(tmp_path))) as node:
            port = agent_port(node)
            memory.used = HIGH
            await until(lambda: refused(port), "the agent port to refuse")
            blocker = socket.socket()
            try:
                blocker.bind(("127.0.0.1", port))
                blocker.listen()
                memory.used = 0
                failing = 'yuzu_gw_memory_shedding_transition_failing{action="resume"}'

                async def resume_failing() -> bool:
                    return await metric(node, failing) == 1

                await until(resume_failing, "a failed resume")
                status, body = await readyz(node)
                assert status == 503 and body["failing"] == ["listeners"]
                assert await metric(node, "yuzu_gw_memory_shedding_active") == 0
            finally:
                blocker.close()
            await until(lambda: _ready(node), "the resume once the port is free")
            assert await metric(node, failing) == 0
            total = 'yuzu_gw_memory_shedding_transition_failures_total{action="resume"}'
            assert await metric(node, total) >= 1

    asyncio.run(main())


class Allocator:
    """RssAnon as the allocators make it: it follows memory in use up, but what Python frees
    stays counted (cycles until a full collection, glibc's free pages until malloc_trim) until
    mem_reclaim's pass, whose trim is this fake's `trim`."""

    def __init__(self) -> None:
        self.live = self.rss = 0
        self.trims = 0

    def use(self, live: int) -> None:
        self.live, self.rss = live, max(self.rss, live)

    def __call__(self) -> int:
        return self.rss

    def trim(self) -> int:
        self.trims += 1
        given_back, self.rss = self.rss > self.live, self.live
        return int(given_back)


def test_shedding_ends_once_memory_falls_though_the_allocator_kept_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21 §2: memory in use falls under the low mark while the agent count does not drop
    (no drop pass); mem_reclaim's passes while shedding give the allocator's memory back, so
    the shedder's reading falls and the node resumes."""
    allocator = Allocator()
    monkeypatch.setattr(memory_reader, "READER", allocator)
    monkeypatch.setattr(mem_reclaim, "load_malloc_trim", lambda: (allocator.trim, ""))
    reclaim = "{mem_reclaim, #{interval_ms => 100, followup_ms => 1000, trim_interval_ms => 0}}"
    config = write_config(tmp_path, f"{SHEDDING}, {reclaim}")

    async def main() -> None:
        async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)) as node:
            port = agent_port(node)
            allocator.use(HIGH)
            await until(lambda: refused(port), "the agent port to refuse")
            allocator.use(LOW - 1)  # freed, but still counted in RssAnon
            assert allocator() == HIGH
            await until(lambda: _ready(node), "/readyz to turn ready", timeout=10.0)
            assert not await refused(port)
            assert allocator.trims >= 1
            assert await metric(node, "yuzu_gw_memory_shedding_active") == 0

    asyncio.run(main())


@pytest.mark.parametrize(
    ("shedding", "detail"),
    [
        (
            "{memory_shedding, #{high_water_bytes => 4611686018427387904}}",
            "the high-water mark (high_water_bytes 4611686018427387904",
        ),
        (
            "{memory_shedding, #{high_water_bytes => 1000, low_water_bytes => 1000}}",
            "the low-water mark (low_water_bytes 1000 = 1000 bytes) is not below",
        ),
        ("{memory_shedding, #{high_water => 1}}", "memory_shedding has keys outside its"),
    ],
)
def test_marks_that_cannot_work_refuse_the_boot(
    tmp_path: Path, memory: Memory, shedding: str, detail: str
) -> None:
    async def main() -> None:
        with pytest.raises(BootRefused) as caught:
            config = write_config(tmp_path, shedding)
            async with running_node(tmp_path, YUZU_GW_CONFIG=str(config)):
                pass
        assert caught.value.log_line().startswith(
            f"Refusing to start: {{yuzu_gw,memory_shedding}}: {detail}"
        )

    asyncio.run(main())
