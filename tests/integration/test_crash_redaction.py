"""The crash redaction canary (issue 7 section 5; seed "Known limits", crash redaction E5): a
real node holds registrations with a known enrolment token, certificate and CSR, and a command
with a marker parameter; each covered actor (heartbeat_buffer, upstream, router, an agent owner,
registry) is crashed by a defect raised inside its `receiveMessage` while it holds them or
handles a message carrying them; everything logged (every logger at DEBUG) and written to stderr
holds none of the markers.

The injected defect is the worst a defect could do: its exception's text carries the markers,
and before raising it hands them to asyncio (a callback with them as its argument, a task that
fails with them, both logged by asyncio) and logs its own traceback with the message as an
argument. The runtime's reports are redacted by construction; the rest is the filter's
(gateway/node/crash_redaction.py), which the test sees at work (asyncio's reports, reduced).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import grpc.aio
import pytest
from google.protobuf.message import Message

from actors.agents.api import owner_row
from actors.heartbeat.api import NAME as HEARTBEAT_BUFFER
from actors.registry.api import REGISTRY_NAME
from actors.router.api import ROUTER_NAME
from actors.upstream.api import UPSTREAM_NAME as UPSTREAM
from gateway.devstack.fake_upstream import SESSION_METADATA_KEY
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from supervisors import introspection
from supervisors.address import Address
from supervisors.runtime import LoopSystemBase
from tests.integration.test_agent_plane import DEADLINE_S, Agent, agents, gateway, run, until
from tests.integration.test_management_plane import operator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TOKEN = "canary-enrolment-5b1d"
CERT = "canary-certificate-77aa"
CSR = "canary-csr-c0de"
PARAM = "canary-parameter-9e4f"
TAG = "canary-status-tag-31ab"
# The seed's seven: the values, the PEM headers and the field names a printed request shows.
MARKERS = (
    TOKEN,
    CERT,
    CSR,
    PARAM,
    TAG,
    "BEGIN CERTIFICATE",
    "enrollment_token",
    "csr_pem",
    "machine_certificate",
)
# A replay starts at once: the upstream actor holds one in flight sooner.
FAST_REPLAY = ", {registration_replay_start_jitter_ms, 0}"


def register_request(agent_id: str) -> agent_pb2.RegisterRequest:
    request = agent_pb2.RegisterRequest(
        enrollment_token=TOKEN,
        machine_certificate=(
            f"-----BEGIN CERTIFICATE-----\n{CERT}\n-----END CERTIFICATE-----\n".encode()
        ),
        csr_pem=f"-----BEGIN CERTIFICATE REQUEST-----\n{CSR}\n-----END CERTIFICATE REQUEST-----\n",
    )
    request.info.agent_id = agent_id
    request.info.plugins.add(name="shell")
    return request


def command(command_id: str) -> agent_pb2.CommandRequest:
    return agent_pb2.CommandRequest(
        command_id=command_id, plugin="shell", action="run", parameters={"secret": PARAM}
    )


# What a defect's exception would carry: the registration and the command it was handed.
HELD = (register_request("held"), command("held"))


async def register(agent: Agent, agent_id: str) -> str:
    call = agent.unary("Register", agent_pb2.RegisterResponse)
    answer = await call(register_request(agent_id), timeout=DEADLINE_S)
    assert answer.accepted
    session_id: str = answer.session_id
    return session_id


async def heartbeat(agent: Agent, session_id: str, **tags: str) -> None:
    call = agent.unary("Heartbeat", agent_pb2.HeartbeatResponse)
    request = agent_pb2.HeartbeatRequest(session_id=session_id, status_tags=tags)
    assert (await call(request, timeout=DEADLINE_S)).acknowledged


# -- the defect ------------------------------------------------------------------------------


class CanaryDefect(Exception):
    pass


@attrs.frozen
class Poke:
    """A message for an actor that gets no message of its own at the moment."""


def _fail(held: object) -> None:
    raise CanaryDefect(f"defect while holding {held!r}")


async def _fail_later(held: object) -> None:
    _fail(held)


def carries(msg: object, marker: str) -> bool:
    return holds(msg, marker, limit=200)


def inject(runtime: LoopSystemBase, address: Address, when: Callable[[Any], bool]) -> list[str]:
    """Make the actor at `address` fail (module doc) on the first message `when` accepts; the
    returned list gets the actor's name when it did."""
    ref = runtime.ref(address)
    assert ref is not None
    instance = ref.instance
    original = instance.receiveMessage
    loop = runtime.loop
    fired: list[str] = []

    def defective(msg: Any, sender: Address) -> None:
        if fired or not when(msg):
            original(msg, sender)
            return
        fired.append(ref.label)
        loop.call_soon(functools.partial(_fail, HELD))
        loop.create_task(_fail_later(HELD))  # never awaited: "exception was never retrieved"
        try:
            _fail(HELD)
        except CanaryDefect:
            logging.getLogger("yuzu_gw.canary").exception("defect handling %r", HELD)
        raise CanaryDefect(f"defect while handling {msg!r} holding {HELD!r}")

    instance.receiveMessage = defective
    return fired


def holds(root: object, marker: str, limit: int = 100_000) -> bool:
    """Whether `marker` is anywhere in the objects reachable from `root` (not through the
    runtime, the loop or the node's context: only what the actor itself keeps)."""
    needle = marker.encode()
    seen: set[int] = set()
    stack: list[object] = [root]
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        if isinstance(obj, str):
            if marker in obj:
                return True
        elif isinstance(obj, bytes | bytearray):
            if needle in obj:
                return True
        elif isinstance(obj, Message):
            if needle in obj.SerializeToString():
                return True
        elif isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset | deque):
            stack.extend(obj)
        else:
            stack.extend(_fields(obj))
    return False


def _fields(obj: object) -> Iterator[object]:
    if isinstance(obj, int | float | type | Callable):  # type: ignore[arg-type]
        return
    yield from getattr(obj, "__dict__", {}).values()
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            with contextlib.suppress(AttributeError):
                yield getattr(obj, slot)


_OPAQUE = (LoopSystemBase, asyncio.AbstractEventLoop, Node, logging.Logger)


def crash_reports(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "supervisors.crash"]


def everything(caplog: pytest.LogCaptureFixture) -> str:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(record) for record in caplog.records)


def assert_counts_only(runtime: LoopSystemBase, name: str | Address) -> None:
    status = introspection.status(runtime, name)
    for value in status.values():
        assert isinstance(value, int | float | str | bool | tuple | type(None)), status
    text = repr(status)
    assert not [m for m in MARKERS if m in text], status


# -- the canary ------------------------------------------------------------------------------


def test_crashes_of_the_covered_actors_print_no_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)

    async def body() -> None:
        async with (
            gateway(tmp_path, FAST_REPLAY) as (node, fake),
            agents(node, 3) as [held, pending, late],
            operator(node) as op,
        ):
            runtime = node.runtime
            assert runtime is not None
            # Held: registered and subscribed (its owner keeps the request). Pending: registered
            # only (the registry keeps the request in its pending row).
            session = await register(held, "agent-held")
            stream = held.subscribe(session)
            await fake.wait_for_calls("NotifyStreamStatus")
            await register(pending, "agent-pending")
            crashed: dict[str, list[str]] = {}

            async def crash(
                name: str, address: Address, when: Callable[[Any], bool], trigger: Any
            ) -> None:
                assert_counts_only(runtime, address)
                fired = inject(runtime, address, when)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await trigger()
                await until(lambda: bool(fired), f"{name} to crash")
                await until(lambda: not runtime.is_alive(address), f"{name} to end")
                crashed[name] = fired

            def named(name: str) -> Address:
                address = runtime.whereis(name)
                assert address is not None
                return address

            # 1. heartbeat_buffer: handed a heartbeat whose status tag is a marker.
            await crash(
                HEARTBEAT_BUFFER,
                named(HEARTBEAT_BUFFER),
                lambda msg: carries(msg, TAG),
                lambda: heartbeat(held, session, canary=TAG),
            )

            # 2. upstream: while it replays the held agent's registration (the server forgot the
            # session; the replay's ProxyRegister is held at the server).
            fake.freeze("ProxyRegister")
            fake.forget_session(session)

            def replaying() -> bool:
                return any(SESSION_METADATA_KEY in c.metadata for c in fake.calls("ProxyRegister"))

            await until(lambda: runtime.whereis(HEARTBEAT_BUFFER) is not None, "buffer restart")
            async with asyncio.timeout(10):
                while not replaying():
                    await heartbeat(held, session)
                    await asyncio.sleep(0.15)
            upstream = named(UPSTREAM)
            await crash(
                UPSTREAM, upstream, lambda msg: True, lambda: _tell(runtime, upstream, Poke())
            )
            fake.unfreeze("ProxyRegister")

            # 3. router: handed a command whose parameter is a marker.
            calls: list[Any] = []

            def send(command_id: str) -> Callable[[], Any]:
                async def go() -> None:
                    calls.append(op.send(command(command_id), ("agent-held",), 60))

                return go

            await crash(ROUTER_NAME, named(ROUTER_NAME), lambda m: carries(m, PARAM), send("c1"))

            # 4. the held agent's owner: it keeps the registration, and is handed the command.
            await until(lambda: runtime.whereis(ROUTER_NAME) is not None, "router restart")
            row = owner_row(runtime, session)
            assert row is not None
            owner = row.owner
            assert holds(runtime.ref(owner).instance, TOKEN)  # type: ignore[union-attr]
            await crash("owner", owner, lambda m: carries(m, PARAM), send("c2"))

            # 5. registry: it keeps the pending agent's registration, and is handed another.
            registry = named(REGISTRY_NAME)
            assert holds(runtime.ref(registry).instance, TOKEN)  # type: ignore[union-attr]
            await crash(
                REGISTRY_NAME,
                registry,
                lambda m: carries(m, TOKEN),
                lambda: register(late, "agent-late"),
            )

            await until(lambda: runtime.whereis(REGISTRY_NAME) is not None, "registry restart")
            for call in calls:
                call.cancel()
            stream.cancel()
            gc.collect()  # the dropped tasks report their exceptions now
            await asyncio.sleep(0.2)
            assert sorted(crashed) == sorted(
                [HEARTBEAT_BUFFER, UPSTREAM, ROUTER_NAME, "owner", REGISTRY_NAME]
            )
            for name in (HEARTBEAT_BUFFER, UPSTREAM, ROUTER_NAME, REGISTRY_NAME):
                assert_counts_only(runtime, name)

    run(body)
    gc.collect()
    logged = everything(caplog)
    stderr = capfd.readouterr().err
    assert [m for m in MARKERS if m in logged] == []
    assert [m for m in MARKERS if m in stderr] == []
    reports = crash_reports(caplog)
    for label in (HEARTBEAT_BUFFER, UPSTREAM, ROUTER_NAME, "AgentOwner", REGISTRY_NAME):
        # Each crash was reported, with the class and the frame...
        assert any(
            r.startswith(f"actor {label} ") and "CanaryDefect at test_crash_redaction.py:" in r
            for r in reports
        ), (label, reports)
    # ...and asyncio's reports of the callbacks and the dropped tasks went through the filter.
    asyncio_lines = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    callbacks = [line for line in asyncio_lines if line.startswith("Exception in callback [")]
    assert len(callbacks) == 5 and all("CanaryDefect at" in line for line in callbacks)
    assert any(line.startswith("Task exception was never retrieved") for line in asyncio_lines)


async def _tell(runtime: LoopSystemBase, address: Address, msg: object) -> None:
    runtime.tell(address, msg)


def test_the_canary_markers_would_show_without_redaction() -> None:
    """The control: what the defect hands asyncio does print the markers when nothing redacts
    (so the canary above fails if the filter stops working)."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addHandler(keep)
    # Bypass the filter: a node started earlier in this process installed it for good.
    factory = logging.getLogRecordFactory()
    logging.setLogRecordFactory(logging.LogRecord)
    try:

        async def body() -> None:
            asyncio.get_running_loop().call_soon(functools.partial(_fail, HELD))
            await asyncio.sleep(0.01)

        asyncio.run(body())
    finally:
        logging.setLogRecordFactory(factory)
        asyncio_log.removeHandler(keep)
    text = "\n".join(logging.Formatter().format(r) for r in records)
    assert TOKEN in text and PARAM in text and "enrollment_token" in text
