"""An in-memory upstream channel (the `actors.upstream.api.Channel` protocol) for actor tests.

No sockets: `unary` answers from a script, after a latency, and records what it was sent. It
models what the call path must cope with: a per-method latency, scripted outcomes (a response
or an `UpstreamCallError`), a freeze (accept and never answer), the timeout the caller gave
(`UpstreamCallError(TIMEOUT)` when it passes first), and a stream limit the channel enforces
itself, as grpclib's HTTP/2 client does (`UpstreamCallError(TOO_MANY_STREAMS)` past it).

`FakeChannelOwner` is an actor that publishes a channel in the `upstream_channels` table, as
the real channel actor does, so the regulator and the call path find it the same way.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message

from actors.core.breaker import ResultKind
from actors.upstream.actor import Upstream
from actors.upstream.api import (
    CHANNEL_ACTOR_NAME,
    CHANNELS_TABLE,
    DEFAULT_CHANNEL,
    REGULATOR_NAME,
    UPSTREAM_NAME,
    UpstreamCallError,
)
from actors.upstream.regulator import Regulator
from gateway.config.context import NodeContext
from gateway.config.keys import SCHEMA
from gateway.config.resolve import resolve_section
from gateway.config.terms import Atom, parse_term
from gateway.config.vm_args import CookieSource, NodeArgs
from gateway.node.children.upstream import regulator_args, upstream_args
from gateway.upstream.calls import UpstreamCalls
from supervisors.address import Address
from supervisors.process import Process
from supervisors.runtime import LoopSystemBase

M = TypeVar("M", bound=Message)

#: A scripted outcome: a response message, an error to raise, or a function of the request
#: that returns either.
Outcome = Message | UpstreamCallError | Callable[[Message], "Message | UpstreamCallError"]


@dataclass
class Sent:
    """One call the channel received."""

    method: str
    request: Message
    timeout: float
    metadata: Mapping[str, str] | None
    started_at: float
    outcome: str = ""  # "ok", an error kind, "cancelled"; "" while in flight


@dataclass
class FakeChannel:
    name: str = DEFAULT_CHANNEL
    #: SETTINGS_MAX_CONCURRENT_STREAMS the "server" declared; 0 = unknown or none.
    max_streams: int = 0
    #: Refuse a call past `max_streams` locally (too_many_streams), as the HTTP/2 client does.
    enforce_streams: bool = True
    latency: dict[str, float] = field(default_factory=dict)
    default_latency: float = 0.0
    sent: list[Sent] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    _scripts: dict[str, deque[Outcome]] = field(default_factory=dict)
    _rules: dict[str, Outcome] = field(default_factory=dict)
    _listeners: list[Callable[[int], None]] = field(default_factory=list)
    _thawed: asyncio.Event | None = None

    # -- the Channel protocol --

    async def unary(
        self,
        method: str,
        request: Message,
        response_type: type[M],
        *,
        timeout: float,
        metadata: Mapping[str, str] | None = None,
    ) -> M:
        short = method.rsplit("/", 1)[-1]
        loop = asyncio.get_running_loop()
        if self.enforce_streams and 0 < self.max_streams <= self.in_flight:
            raise UpstreamCallError(ResultKind.TOO_MANY_STREAMS, detail="too_many_streams")
        record = Sent(short, request, timeout, metadata, loop.time())
        self.sent.append(record)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            async with asyncio.timeout(timeout):
                if self._thawed is not None:
                    await self._thawed.wait()
                delay = self.latency.get(short, self.default_latency)
                if delay > 0:
                    await asyncio.sleep(delay)
        except TimeoutError:
            record.outcome = ResultKind.TIMEOUT.value
            raise UpstreamCallError(ResultKind.TIMEOUT, detail="deadline exceeded") from None
        except asyncio.CancelledError:
            record.outcome = "cancelled"
            raise
        finally:
            self.in_flight -= 1
        outcome = self._next(short)
        if callable(outcome):
            outcome = outcome(request)
        if isinstance(outcome, UpstreamCallError):
            record.outcome = outcome.kind.value
            raise outcome
        record.outcome = "ok"
        if outcome is None:
            return response_type()
        assert isinstance(outcome, response_type), (outcome, response_type)
        return outcome

    def server_max_streams(self) -> int:
        return self.max_streams

    def add_settings_listener(self, listener: Callable[[int], None]) -> None:
        self._listeners.append(listener)

    def tls_files_usable(self) -> bool:
        return True

    # -- scripting --

    def script(self, method: str, *outcomes: Outcome) -> None:
        """Answer the next calls of `method` (short name, e.g. ProxyRegister) with these."""
        self._scripts.setdefault(method, deque()).extend(outcomes)

    def fail(self, method: str, error: UpstreamCallError, times: int = 1) -> None:
        self.script(method, *([error] * times))

    def set_rule(self, method: str, outcome: Outcome | None) -> None:
        """Answer every call of `method` with `outcome` once the script is empty."""
        if outcome is None:
            self._rules.pop(method, None)
        else:
            self._rules[method] = outcome

    def freeze(self) -> None:
        """Accept calls and answer none until `unfreeze` (or their timeout)."""
        if self._thawed is None:
            self._thawed = asyncio.Event()

    def unfreeze(self) -> None:
        thawed, self._thawed = self._thawed, None
        if thawed is not None:
            thawed.set()

    def set_server_max_streams(self, total: int) -> None:
        """The server declared a new limit: tell the listeners, as the channel does."""
        self.max_streams = total
        for listener in list(self._listeners):
            listener(total)

    def calls(self, method: str | None = None) -> list[Sent]:
        return [s for s in self.sent if method is None or s.method == method]

    def _next(self, method: str) -> Any:
        queue = self._scripts.get(method)
        if queue:
            return queue.popleft()
        return self._rules.get(method)


def status_error(code: int, detail: str = "") -> UpstreamCallError:
    """The error a server status turns into on the channel."""
    return UpstreamCallError(ResultKind.STATUS, code, detail)


class FakeChannelOwner(Process):
    """Publishes `args` (a FakeChannel) in `upstream_channels`, like the channel actor."""

    def init(self, args: FakeChannel) -> None:
        self.table = self.new_table(CHANNELS_TABLE)
        self.table.insert(args.name, args)


# -- wiring the upstream actors to a fake channel -------------------------------------------------


def upstream_context(config_text: str = "[]", env: Mapping[str, str] | None = None) -> NodeContext:
    """A NodeContext whose config is the yuzu_gw section `config_text` (Erlang syntax) resolved
    like a real boot, with a fresh metric registry."""
    section = parse_term(config_text + ".")
    assert isinstance(section, list)
    if not any(isinstance(e, tuple) and e[0] == Atom("allow_no_listeners") for e in section):
        # These contexts run actors without listeners: the lab-rig acknowledgement.
        section = [*section, (Atom("allow_no_listeners"), True)]
    config = resolve_section(SCHEMA, section, env or {}, "test.config")
    node = NodeArgs(
        name="test@127.0.0.1",
        name_source="test",
        cookie="test-cookie",
        cookie_source=CookieSource.VM_ARGS,
        cookie_variables=(),
        path="vm.args",
    )
    return NodeContext(config, node, Path("/nonexistent"))


@dataclass
class UpstreamActors:
    ctx: NodeContext
    channel: FakeChannel | None
    channel_owner: Address | None
    upstream: Address
    regulator: Address

    def calls(self, runtime: LoopSystemBase) -> UpstreamCalls:
        return UpstreamCalls(runtime, self.ctx.config)


def start_upstream_actors(
    create: Callable[..., Address],
    ctx: NodeContext,
    channel: FakeChannel | None = None,
) -> UpstreamActors:
    """Start (in tree order) the channel owner when a channel is given, `upstream` and
    `upstream_regulator`, under their registered names, with the Args the node builds from
    `ctx`. `create(cls, args, name)` is the harness's `create`."""
    owner = None
    if channel is not None:
        owner = create(FakeChannelOwner, channel, CHANNEL_ACTOR_NAME)
    upstream = create(Upstream, upstream_args(ctx), UPSTREAM_NAME)
    regulator = create(Regulator, regulator_args(ctx), REGULATOR_NAME)
    return UpstreamActors(ctx, channel, owner, upstream, regulator)
