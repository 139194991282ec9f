"""The fake Yuzu server itself (`FakeUpstream`); the package docstring says how it answers."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from gateway.devstack.fake_upstream.records import (
    MAX_LISTED_ID_BYTES,
    METHODS,
    SERVICE,
    SESSION_METADATA_KEY,
    UNKNOWN_CAP,
    Call,
    Fault,
    Outcome,
    Presented,
    ServerTls,
    Sessions,
    check_methods,
    mint_session_id,
    trailers_of,
)
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2


class FakeUpstream:
    """The fake server. Construct, then ``await start()`` (or ``async with``).

    ``tls``: a :class:`ServerTls`; the server presents ``tls.server`` and, with
    ``require_client_auth``, refuses clients without a certificate signed by its CA.
    ``max_concurrent_streams``: SETTINGS_MAX_CONCURRENT_STREAMS the server advertises (read at
    start, so change the attribute and ``restart(drop_connections=True)`` to apply a new one).
    """

    def __init__(
        self,
        *,
        tls: ServerTls | None = None,
        require_client_auth: bool = True,
        max_concurrent_streams: int | None = None,
        on_call: Callable[[Call], None] | None = None,
    ) -> None:
        self.tls = tls
        self.require_client_auth = require_client_auth
        self.max_concurrent_streams = max_concurrent_streams
        self.on_call = on_call  # called with each call as it is recorded (the CLI logs with it)
        self.host = "127.0.0.1"
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._calls: list[Call] = []
        self._changed = asyncio.Event()
        # behaviour
        self._latency: dict[str, float] = {}
        self._queues: dict[str, deque[Outcome]] = {m: deque() for m in METHODS}
        self._rules: dict[str, Callable[[Call], Outcome | None]] = {}
        self._thawed: dict[str, asyncio.Event] = {}
        # server state
        self._memory = Sessions()  # the in-memory registry (lost on restart)
        self._directory = Sessions()  # the durable route directory
        self.presented_known = Presented.ADOPT
        self.presented_unknown = Presented.ADOPT
        self.presented_reason = "presented session not accepted"
        self._rejected_agents: dict[str, str] = {}
        self.unknown_cap = UNKNOWN_CAP
        self._refusals: list[Callable[[gateway_pb2.StreamStatusNotification], bool]] = []
        self._defaults: dict[str, Callable[[Call], Outcome]] = {
            "ProxyRegister": self._register,
            "BatchHeartbeat": self._heartbeats,
            "ProxyInventory": self._inventory,
            "NotifyStreamStatus": self._notify_stream_status,
            "ForwardGuardianMessage": self._guardian,
        }

    # ---------------------------------------------------------------- lifecycle

    @property
    def address(self) -> str:
        """``host:port``, usable as a gRPC target once started."""
        return f"{self.host}:{self.port}"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on ``host:port`` (0 picks a free port); returns the port."""
        if self._server is not None:
            raise RuntimeError("already started")
        self.host = host
        self.port = await self._serve(host, port)
        return self.port

    async def stop(self, grace: float | None = None) -> None:
        """Stop listening; calls still running are cancelled (after ``grace`` seconds)."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)

    async def restart(
        self, *, drop_connections: bool = False, wipe_directory: bool = False
    ) -> None:
        """Behave as a restarted server: forget every in-memory session.

        ``drop_connections``: also stop the gRPC server (cancelling running calls, closing every
        connection) and listen again on the same port. ``wipe_directory``: forget the durable
        route directory too (a server with a fresh database).
        """
        self._memory.clear()
        if wipe_directory:
            self._directory.clear()
        if drop_connections and self._server is not None:
            await self.stop()
            await self._serve(self.host, self.port)
        self._notify()

    async def __aenter__(self) -> FakeUpstream:
        if self._server is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _serve(self, host: str, port: int) -> int:
        options: list[tuple[str, Any]] = [("grpc.so_reuseport", 0)]
        if self.max_concurrent_streams is not None:
            options.append(("grpc.max_concurrent_streams", self.max_concurrent_streams))
        server = grpc.aio.server(options=options)
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self._handler(name),
                request_deserializer=req.FromString,
                response_serializer=resp.SerializeToString,
            )
            for name, (req, resp) in METHODS.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.tls is None:
            bound = server.add_insecure_port(target)
        else:
            creds = grpc.ssl_server_credentials(
                [(self.tls.server.key_pem, self.tls.server.cert_pem)],
                root_certificates=self.tls.ca_cert_pem,
                require_client_auth=self.require_client_auth,
            )
            bound = server.add_secure_port(target, creds)
        if bound == 0:
            raise OSError(f"fake upstream could not listen on {target}")
        await server.start()
        self._server = server
        return bound

    # ---------------------------------------------------------------- behaviour: all methods

    def set_latency(self, seconds: float, *methods: str) -> None:
        """Delay answers of ``methods`` (all when none named) by ``seconds``; 0 removes it."""
        for m in check_methods(methods):
            self._latency[m] = seconds

    def script(self, method: str, *outcomes: Outcome) -> None:
        """Queue outcomes for the next calls of ``method``, one per call, in order."""
        check_methods([method])
        self._queues[method].extend(outcomes)

    def fail(
        self,
        method: str,
        code: grpc.StatusCode,
        *,
        times: int | None = 1,
        details: str = "",
        trailers: Mapping[str, str | bytes] | Sequence[tuple[str, str | bytes]] | None = None,
    ) -> Fault:
        """Fail the next ``times`` calls of ``method`` with ``code`` (``times=None``: always,
        as a rule). Trailing metadata such as ``{"grpc-retry-pushback-ms": "500"}`` is sent."""
        fault = Fault(code, details, trailers_of(trailers))
        if times is None:
            self.set_rule(method, lambda _call: fault)
        else:
            self.script(method, *([fault] * times))
        return fault

    def set_rule(self, method: str, rule: Callable[[Call], Outcome | None] | None) -> None:
        """A function of each call (after the scripted queue is empty) that returns an outcome,
        or None for the default behaviour. ``rule=None`` removes it."""
        check_methods([method])
        if rule is None:
            self._rules.pop(method, None)
        else:
            self._rules[method] = rule

    def reset_script(self, *methods: str) -> None:
        """Drop scripted outcomes and rules (of ``methods``, or all)."""
        for m in check_methods(methods):
            self._queues[m].clear()
            self._rules.pop(m, None)

    def freeze(self, *methods: str) -> None:
        """Accept calls of ``methods`` (all when none named) and answer none until unfrozen.
        A frozen call ends only when unfrozen, cancelled by the client (its deadline) or when
        the server stops."""
        for m in check_methods(methods):
            self._thawed.setdefault(m, asyncio.Event()).clear()

    def unfreeze(self, *methods: str) -> None:
        """Let frozen calls of ``methods`` (all when none named) go on to be answered."""
        for m in check_methods(methods):
            if m in self._thawed:
                self._thawed.pop(m).set()

    # ---------------------------------------------------------------- behaviour: per method

    @property
    def sessions(self) -> dict[str, str]:
        """The in-memory registry: session id -> agent id (a copy)."""
        return dict(self._memory.by_session)

    def session_of(self, agent_id: str) -> str | None:
        """The agent's in-memory session id, if any."""
        return self._memory.by_agent.get(agent_id)

    def add_session(self, session_id: str, agent_id: str, *, in_memory: bool = True) -> None:
        """Make a session known: to the directory, and to memory unless ``in_memory=False``."""
        self._directory.bind(session_id, agent_id)
        if in_memory:
            self._memory.bind(session_id, agent_id)

    def forget_session(self, session_id: str, *, directory: bool = False) -> None:
        """Drop a session from memory (so heartbeats list it), and the directory if asked."""
        self._memory.drop(session_id)
        if directory:
            self._directory.drop(session_id)

    def on_presented_session(
        self,
        known: Presented | None = None,
        unknown: Presented | None = None,
        *,
        reason: str | None = None,
    ) -> None:
        """How ProxyRegister answers a presented ``x-yuzu-session-id`` the fake holds in memory
        (``known``) or not (``unknown``); both default to ADOPT. ``reason`` is the
        reject_reason sent with REFUSE."""
        if known is not None:
            self.presented_known = known
        if unknown is not None:
            self.presented_unknown = unknown
        if reason is not None:
            self.presented_reason = reason

    def reject_agents(self, *agent_ids: str, reason: str = "enrollment denied") -> None:
        """ProxyRegister answers these agents accepted=false with ``reason``."""
        for a in agent_ids:
            self._rejected_agents[a] = reason

    def accept_agents(self, *agent_ids: str) -> None:
        """Undo :meth:`reject_agents` (for the ids given, or all)."""
        for a in agent_ids or list(self._rejected_agents):
            self._rejected_agents.pop(a, None)

    def refuse_notifications(
        self,
        predicate: Callable[[gateway_pb2.StreamStatusNotification], bool] | None = None,
        *,
        agent_ids: Iterable[str] | None = None,
        event: int | None = None,
    ) -> None:
        """Answer matching NotifyStreamStatus calls with acknowledged=false.

        A notification matches when every criterion given matches (agent id in ``agent_ids``,
        ``event`` equal, ``predicate`` true); with none given, every notification matches.
        Several calls add alternatives; :meth:`acknowledge_notifications` clears them.
        """
        agents = None if agent_ids is None else frozenset(agent_ids)

        def matches(n: gateway_pb2.StreamStatusNotification) -> bool:
            return (
                (agents is None or n.agent_id in agents)
                and (event is None or n.event == event)
                and (predicate is None or predicate(n))
            )

        self._refusals.append(matches)

    def acknowledge_notifications(self) -> None:
        """Acknowledge every notification again."""
        self._refusals.clear()

    # ---------------------------------------------------------------- the record

    def calls(self, method: str | None = None) -> list[Call]:
        """Calls received so far (of ``method``, or all), oldest first."""
        if method is not None:
            check_methods([method])
        return [c for c in self._calls if method is None or c.method == method]

    def requests(self, method: str) -> list[Any]:
        """The request messages of ``method``, oldest first."""
        return [c.request for c in self.calls(method)]

    def clear(self) -> None:
        """Forget the recorded calls (behaviour and sessions are kept)."""
        self._calls.clear()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate()`` is true; it is checked at every call received or answered
        and every 50 ms. Raises TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"fake upstream: condition not met within {timeout} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05))

    async def wait_for_calls(
        self,
        method: str,
        count: int = 1,
        *,
        where: Callable[[Call], bool] | None = None,
        answered: bool = False,
        timeout: float = 5.0,
    ) -> list[Call]:
        """Wait for at least ``count`` calls of ``method`` (matching ``where``; answered ones
        only with ``answered=True``) and return all such calls."""

        def matching() -> list[Call]:
            return [
                c
                for c in self.calls(method)
                if (where is None or where(c)) and (not answered or c.code is not None)
            ]

        try:
            await self.wait_for(lambda: len(matching()) >= count, timeout)
        except TimeoutError:
            raise TimeoutError(
                f"fake upstream: {len(matching())} of {count} {method} call(s) within {timeout} s"
            ) from None
        return matching()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---------------------------------------------------------------- serving

    def _handler(self, method: str) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await self._handle(method, request, context)

        return handle

    async def _handle(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        call = Call(
            method=method,
            request=request,
            metadata={m.key: m.value for m in context.invocation_metadata() or ()},
            received_at=time.monotonic(),
            peer=context.peer(),
            deadline=context.time_remaining(),
        )
        self._calls.append(call)
        if self.on_call is not None:
            self.on_call(call)
        self._notify()
        try:
            while (thawed := self._thawed.get(method)) is not None:
                await thawed.wait()
            if latency := self._latency.get(method):
                await asyncio.sleep(latency)
            outcome = self._outcome(call)
        except asyncio.CancelledError:
            self._answered(call, grpc.StatusCode.CANCELLED)
            raise
        except Exception:  # a rule that raised: grpcio answers UNKNOWN
            self._answered(call, grpc.StatusCode.UNKNOWN)
            raise
        if isinstance(outcome, Fault):
            self._answered(call, outcome.code)
            await context.abort(outcome.code, outcome.details, outcome.trailers)
        self._answered(call, grpc.StatusCode.OK, outcome)
        return outcome

    def _answered(self, call: Call, code: grpc.StatusCode, response: Any = None) -> None:
        call.code, call.response, call.answered_at = code, response, time.monotonic()
        self._notify()

    def _outcome(self, call: Call) -> Outcome:
        queue = self._queues[call.method]
        if queue:
            return queue.popleft()
        rule = self._rules.get(call.method)
        if rule is not None and (outcome := rule(call)) is not None:
            return outcome
        return self._defaults[call.method](call)

    # ---------------------------------------------------------------- default behaviour

    def _register(self, call: Call) -> Outcome:
        agent_id = call.request.info.agent_id
        if agent_id in self._rejected_agents:
            return agent_pb2.RegisterResponse(
                accepted=False, reject_reason=self._rejected_agents[agent_id]
            )
        presented = call.metadata.get(SESSION_METADATA_KEY)
        if isinstance(presented, str) and presented:
            holder = self._memory.by_session.get(presented)
            policy = self.presented_unknown if holder is None else self.presented_known
            if holder is not None and holder != agent_id:
                policy = Presented.SUPERSEDED  # held by another agent: the server refuses
            if policy is Presented.REFUSE:
                return agent_pb2.RegisterResponse(
                    accepted=False, reject_reason=self.presented_reason
                )
            if policy is Presented.SUPERSEDED:
                return Fault(grpc.StatusCode.FAILED_PRECONDITION, "presented session superseded")
            session_id = presented
        else:
            session_id = mint_session_id()
        self.add_session(session_id, agent_id)
        return agent_pb2.RegisterResponse(session_id=session_id, accepted=True)

    def _heartbeats(self, call: Call) -> Outcome:
        ids = [hb.session_id for hb in call.request.heartbeats]
        acknowledged = sum(1 for s in ids if s in self._directory.by_session)
        unknown = [
            s
            for s in dict.fromkeys(ids)
            if s and len(s.encode()) <= MAX_LISTED_ID_BYTES and s not in self._memory.by_session
        ]
        return gateway_pb2.BatchHeartbeatResponse(
            acknowledged_count=acknowledged,
            unknown_session_ids=unknown[: self.unknown_cap],
            unknown_session_ids_truncated=len(unknown) > self.unknown_cap,
        )

    def _inventory(self, call: Call) -> Outcome:
        return agent_pb2.InventoryAck(received=True)

    def _notify_stream_status(self, call: Call) -> Outcome:
        refused = any(matches(call.request) for matches in self._refusals)
        return gateway_pb2.StreamStatusAck(acknowledged=not refused)

    def _guardian(self, call: Call) -> Outcome:
        return gateway_pb2.ForwardGuardianAck(acknowledged=True)
