"""Simulated agents: grpcio clients of the gateway's AgentService, one channel (one HTTP/2
connection) each, as the gateway admits a heartbeat only on the connection that opened its
session.

One agent's life, for ever until it is cancelled:

1. Register (its agent id, hostname, platform, plugins); a refusal or an error is retried after
   the refusal's `grpc-retry-pushback-ms` when it gave one (exactly that long), else after the
   backoff (`behaviour.Backoff`);
2. Subscribe with `x-yuzu-session-id`; commands relayed by the gateway (and any pending ones in
   the Register or Heartbeat answers) are answered on the stream, RUNNING then SUCCESS, one
   command at a time, `answer_delay_s` apart;
3. meanwhile a Heartbeat every `heartbeat_s` (the first at a random point of the first
   interval, so agents do not beat in step), an inventory report soon after subscribing and
   then about every `inventory_s`, and a Guardian event about every `guard_s`;
4. the session ends when the stream ends (the gateway stopped or restarted) or a heartbeat is
   answered NOT_FOUND (the session is gone: a stock agent registers again); back to 1 after
   the backoff, which starts over once an agent has subscribed.

Logged (logger `yuzu_gw.devstack.agents`): refusals and failures at DEBUG per agent; the fleet
logs one INFO line when the number of subscribed agents changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import attrs
import grpc
import grpc.aio

from gateway.devstack import behaviour
from protos.yuzu.agent.v1 import agent_pb2

__all__ = ["AgentSettings", "Fleet", "SimAgent", "Target", "agent_id"]

log = logging.getLogger("yuzu_gw.devstack.agents")

SERVICE = "/yuzu.agent.v1.AgentService/"
SESSION_KEY = "x-yuzu-session-id"
# The fleet's INFO line is at most this often: a restarting node moves every agent at once.
REPORT_INTERVAL_S = 2.0
_GRPC_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)


def agent_id(index: int) -> str:
    return f"devstack-agent-{index:04d}"


@attrs.frozen
class Target:
    """The agent listener: `address` host:port; `ca_pem` the CA to verify it with (one-way
    TLS), or None for plaintext."""

    address: str
    ca_pem: bytes | None = None


@attrs.frozen
class AgentSettings:
    heartbeat_s: float = 5.0
    inventory_s: float = 60.0
    guard_s: float = 30.0
    answer_delay_s: float = 0.2
    rpc_timeout_s: float = 10.0
    backoff: behaviour.Backoff = attrs.field(factory=behaviour.Backoff)


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def open_channel(target: Target, backoff: behaviour.Backoff) -> grpc.aio.Channel:
    options = [
        # One connection per agent, never shared with the other agents of this process.
        ("grpc.use_local_subchannel_pool", 1),
        # grpcio's own reconnect backoff reaches 120 s; the agent's backoff is what governs.
        ("grpc.initial_reconnect_backoff_ms", int(backoff.base_s * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(backoff.base_s * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(backoff.cap_s * 1000)),
    ]
    if target.ca_pem is None:
        return grpc.aio.insecure_channel(target.address, options=options)
    credentials = grpc.ssl_channel_credentials(root_certificates=target.ca_pem)
    return grpc.aio.secure_channel(target.address, credentials, options=options)


class SimAgent:
    """One simulated agent (module doc). `run()` until cancelled."""

    def __init__(
        self,
        agent: str,
        target: Target,
        settings: AgentSettings,
        rng: random.Random,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.agent_id = agent
        self.target = target
        self.settings = settings
        self.rng = rng
        self.on_change = on_change
        self.subscribed = False
        self.sessions = 0  # Subscribe streams opened
        self.answered = 0  # commands answered SUCCESS
        self.guard_events = 0
        # The last refusal's grpc-retry-pushback-ms: the next attempt waits exactly that long.
        self.hint_ms: int | None = None
        self._started = time.monotonic()

    async def run(self) -> None:
        attempt = 0
        async with open_channel(self.target, self.settings.backoff) as channel:
            while True:
                sessions = self.sessions
                self.hint_ms = None
                try:
                    await self._session(channel)
                except grpc.aio.AioRpcError as exc:
                    self.hint_ms = behaviour.pushback_ms(exc.trailing_metadata())
                    log.debug("%s: session ended: %s", self.agent_id, _describe(exc))
                except _GRPC_ERRORS as exc:
                    log.debug("%s: session ended: %s", self.agent_id, _describe(exc))
                if self.sessions > sessions:
                    attempt = 0
                elif self.hint_ms is None:  # a hinted retry takes no backoff step
                    attempt += 1
                delay = behaviour.retry_delay(
                    self.hint_ms, self.settings.backoff, attempt, self.rng.random()
                )
                await asyncio.sleep(delay)

    # -- one session ------------------------------------------------------------------------

    def unary(self, channel: grpc.aio.Channel, method: str, response: Any) -> Any:
        return channel.unary_unary(
            SERVICE + method,
            request_serializer=_serialize,
            response_deserializer=response.FromString,
        )

    async def _session(self, channel: grpc.aio.Channel) -> None:
        register = self.unary(channel, "Register", agent_pb2.RegisterResponse)
        reply = await register(
            behaviour.register_request(self.agent_id), timeout=self.settings.rpc_timeout_s
        )
        if not reply.accepted or not reply.session_id:
            log.debug("%s: registration refused: %s", self.agent_id, reply.reject_reason)
            return
        subscribe = channel.stream_stream(
            SERVICE + "Subscribe",
            request_serializer=_serialize,
            response_deserializer=agent_pb2.CommandRequest.FromString,
        )
        call = subscribe(metadata=((SESSION_KEY, reply.session_id),))
        try:
            await call.initial_metadata()
            if call.done():  # a trailers-only answer: the Subscribe was refused
                log.debug("%s: Subscribe refused: %s", self.agent_id, (await call.code()).name)
                self.hint_ms = behaviour.pushback_ms(await call.trailing_metadata())
                return
            self._set_subscribed(True)
            self.sessions += 1
            await _Session(self, channel, call, reply.session_id).serve(reply.pending_commands)
        finally:
            self._set_subscribed(False)
            call.cancel()

    def _set_subscribed(self, value: bool) -> None:
        if self.subscribed != value:
            self.subscribed = value
            self.on_change()

    def uptime_s(self) -> float:
        return time.monotonic() - self._started


class _Session:
    """The tasks of one subscribed session; the first to end ends them all."""

    def __init__(
        self,
        agent: SimAgent,
        channel: grpc.aio.Channel,
        call: grpc.aio.StreamStreamCall,
        session_id: str,
    ) -> None:
        self.agent = agent
        self.settings = agent.settings
        self.channel = channel
        self.call = call
        self.session_id = session_id
        self._write_lock = asyncio.Lock()  # one frame at a time on the stream

    async def serve(self, pending: Any) -> None:
        for command in pending:
            await self._answer(command)
        tasks = [
            asyncio.create_task(self._commands()),
            asyncio.create_task(self._heartbeats()),
            asyncio.create_task(self._inventory()),
            asyncio.create_task(self._guardian()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # an error ends the session with its reason
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _write(self, frame: agent_pb2.CommandResponse) -> None:
        async with self._write_lock:
            await self.call.write(frame)

    async def _answer(self, command: agent_pb2.CommandRequest) -> None:
        running, done = behaviour.answers(command, self.agent.agent_id, time.time())
        await self._write(running)
        await asyncio.sleep(self.settings.answer_delay_s)
        await self._write(done)
        self.agent.answered += 1

    async def _commands(self) -> None:
        while (command := await self.call.read()) is not grpc.aio.EOF:
            await self._answer(command)  # type: ignore[arg-type]

    async def _heartbeats(self) -> None:
        beat = self.agent.unary(self.channel, "Heartbeat", agent_pb2.HeartbeatResponse)
        interval = self.settings.heartbeat_s
        await asyncio.sleep(self.agent.rng.uniform(0.0, interval))
        while True:
            request = behaviour.heartbeat(self.session_id, time.time(), self.agent.uptime_s())
            try:
                reply = await beat(request, timeout=self.settings.rpc_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    log.debug("%s: heartbeat NOT_FOUND, registering again", self.agent.agent_id)
                    return
                log.debug("%s: heartbeat failed: %s", self.agent.agent_id, _describe(exc))
            else:
                for command in reply.pending_commands:
                    await self._answer(command)
            await asyncio.sleep(interval)

    async def _inventory(self) -> None:
        report = self.agent.unary(self.channel, "ReportInventory", agent_pb2.InventoryAck)
        await asyncio.sleep(self.agent.rng.uniform(0.0, self.settings.heartbeat_s))
        while True:
            request = behaviour.inventory(
                self.session_id, self.agent.agent_id, time.time(), self.agent.uptime_s()
            )
            try:
                await report(request, timeout=self.settings.rpc_timeout_s)
            except grpc.aio.AioRpcError as exc:
                log.debug("%s: inventory failed: %s", self.agent.agent_id, _describe(exc))
            await asyncio.sleep(self.settings.inventory_s * self.agent.rng.uniform(0.5, 1.5))

    async def _guardian(self) -> None:
        while True:
            await asyncio.sleep(self.settings.guard_s * self.agent.rng.uniform(0.5, 1.5))
            self.agent.guard_events += 1
            await self._write(
                behaviour.guard_event(self.agent.agent_id, self.agent.guard_events, time.time())
            )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name} {exc.details() or ''}".strip()
    return type(exc).__name__


class Fleet:
    """N agents, `agent_id(first) ...`, each in a task of its own."""

    def __init__(
        self,
        count: int,
        target: Target,
        settings: AgentSettings | None = None,
        *,
        first: int = 1,
        seed: int | None = None,
    ) -> None:
        rng = random.Random(seed)
        self.settings = settings or AgentSettings()
        self.agents = [
            SimAgent(
                agent_id(first + i),
                target,
                self.settings,
                random.Random(rng.random()),
                self._changed,
            )
            for i in range(count)
        ]
        self._tasks: list[asyncio.Task[None]] = []
        self._change = asyncio.Event()
        self._reporter: asyncio.Task[None] | None = None

    @property
    def subscribed(self) -> int:
        return sum(agent.subscribed for agent in self.agents)

    def _changed(self) -> None:
        self._change.set()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(agent.run()) for agent in self.agents]

    async def wait_subscribed(self, timeout: float) -> bool:
        """True once every agent is subscribed, False if `timeout` passes first."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self.subscribed < len(self.agents):
                    self._change.clear()
                    await self._change.wait()
        return self.subscribed == len(self.agents)

    def report_changes(self) -> None:
        """From now on, log one INFO line whenever the number of subscribed agents changed."""
        self._reporter = asyncio.create_task(self._report())

    async def _report(self) -> None:
        shown = self.subscribed
        while True:
            self._change.clear()
            await self._change.wait()
            await asyncio.sleep(REPORT_INTERVAL_S)
            if self.subscribed != shown:
                shown = self.subscribed
                log.info("agents subscribed: %d of %d", shown, len(self.agents))

    async def stop(self) -> None:
        """Cancel every agent; each closes its stream and its channel."""
        tasks = [*self._tasks, *([self._reporter] if self._reporter else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        self._reporter = None
