"""Carrying out the schedule's events on a running `Stack`.

Kills go through the node's remote console (`runtime.kill`: no terminate, as an operator's
kill), as tests/integration/test_root_intensity.py does; the upstream faults act on the fake
server (gateway/devstack/fake_upstream/server.py); commands and broadcasts are grpcio
SendCommand calls on the management listener, each collected to its end. With two nodes these
act on node a; the cluster's faults cut the link between the two (the relays drop every byte)
and SIGKILL node b, which is started again after the hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt
from tests.soak import schedule as sched
from tests.soak.agents import agent_id
from tests.soak.invariants import CONNECTED, metric_sum, notice_history
from tests.soak.stack import Stack

MGMT = "/yuzu.server.v1.ManagementService/SendCommand"
# A command stream still open this long after its timeout hangs.
HANG_GRACE_S = 20.0
# The parameter every command carries: the node must never log it (seed: command parameters).
PARAM_CANARY = "soak-canary-param-5b1f"
_RUNNING = agent_pb2.CommandResponse.Status.RUNNING

KILL_OWNERS = """
import random as _random
_rows = sorted(
    (r for r in runtime.table("owners").values() if getattr(r, "state", "") == "live"),
    key=lambda r: r.session_id,
)
_picked = _random.Random({seed}).sample(_rows, min({count}, len(_rows)))
for _row in _picked:
    runtime.kill(_row.owner)
"""

# The shedder fault's ballast: touched pages (a large bytes object is its own mmap, so freeing
# it gives them back at once), kept on `sys` between two console sessions.
BALLAST = """
import sys
from gateway.node.memory_reader import rss_anon_bytes
_before = rss_anon_bytes()
sys._yuzu_soak_ballast = b"\\x01" * max(0, {high} - _before + {margin})
_after = rss_anon_bytes()
"""
DROP_BALLAST = """
import sys
sys.__dict__.pop("_yuzu_soak_ballast", None)
"""
SHEDDING = """
from actors.memory.api import shedding_now
"""
# Past the high-water mark by this much, so the node's own churn cannot take it back under.
BALLAST_MARGIN_BYTES = 64 * 2**20
NOTIFY_PENDING = "yuzu_gw_upstream_notify_pending"
INFLIGHT = "yuzu_gw_upstream_notify_inflight"
# How long the shedder may take to notice either way: many of its samples.
SHEDDER_NOTICE_S = 10.0

PEER_OWNERS = """
from actors.agents.api import OWNERS_TABLE
_table = runtime.table(OWNERS_TABLE)
_owned = {} if _table is None else {r.session_id: r.state for r in _table.values()}
"""

KILL_NAMED = """
_victim = runtime.whereis({name!r})
_killed = 0 if _victim is None else 1
if _victim is not None:
    runtime.kill(_victim)
"""


@dataclass
class CommandResult:
    """One operator's SendCommand: its targets (empty: a broadcast), the terminal answers per
    agent, how its stream ended (None: it hung) and when it ran (loop time)."""

    command_id: str
    targets: tuple[str, ...]
    started: float
    ended: float = 0.0
    code: str | None = None
    terminals: Counter[str] = field(default_factory=Counter)


@dataclass
class PeerKill:
    """A `peer_kill`: the sessions in the killed node's owner table just before the SIGKILL,
    and the sessions whose last notice at the server, from that node, was CONNECTED once it
    was dead (what this incarnation left the server believing: an earlier one's are its
    own kill's)."""

    owned: frozenset[str]
    left_connected: frozenset[str]


@dataclass
class FaultRecord:
    kind: str
    at_s: float
    started: float
    done: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


class Faults:
    def __init__(self, stack: Stack, seed: int) -> None:
        self.stack = stack
        self.rng = random.Random(seed ^ 0x50A4)
        self.commands: list[CommandResult] = []
        self.faults: list[FaultRecord] = []
        self.peer_kills: list[PeerKill] = []
        self._sequence = 0
        target = f"127.0.0.1:{stack.node.port('listener_mgmt')}"
        self.channel = grpc.aio.insecure_channel(target)

    async def close(self) -> None:
        await self.channel.close()

    def router_kills(self) -> list[float]:
        return [f.started for f in self.faults if f.kind == sched.ROUTER_KILL]

    async def fault(self, event: sched.Fault) -> None:
        loop = asyncio.get_running_loop()
        record = FaultRecord(event.kind, event.at_s, loop.time())
        self.faults.append(record)
        fake = self.stack.fake
        match event.kind:
            case sched.OWNER_KILL | sched.OWNER_MASS_KILL:
                seed = self.rng.randrange(2**32)
                await self.stack.eval(KILL_OWNERS.format(seed=seed, count=event.size))
                record.detail["owners"] = event.size
            case sched.UPSTREAM_KILL:
                record.detail["notify_held"] = await self._held()
                await self.stack.eval(KILL_NAMED.format(name=sched.ROOT_KILLS[event.kind]))
            case kind if kind in sched.ROOT_KILLS:
                await self.stack.eval(KILL_NAMED.format(name=sched.ROOT_KILLS[kind]))
            case sched.UPSTREAM_DROP:
                await fake.stop()
                await asyncio.sleep(event.hold_s)
                await fake.start(fake.host, fake.port)
            case sched.UPSTREAM_STALL:
                fake.freeze()
                await asyncio.sleep(event.hold_s)
                fake.unfreeze()
            case sched.SHEDDER_OVER:
                record.detail.update(await self._over_the_mark(event.hold_s))
            case sched.UPSTREAM_RESTART:
                # A new server instance: its in-memory sessions are gone, its connections
                # dropped; the durable route directory survives, as the server's does.
                await fake.restart(drop_connections=True)
            case sched.LINK_CUT:
                for relay in self.stack.relays:
                    relay.paused = True
                await asyncio.sleep(event.hold_s)
                for relay in self.stack.relays:
                    relay.paused = False
            case sched.PEER_KILL:
                record.detail.update(await self._peer_kill(event.hold_s))
            case _:
                raise ValueError(f"not a fault: {event.kind}")
        record.done = loop.time()

    async def _held(self) -> int:
        """The stream-status notifications node a holds as its upstream actor is killed: they
        outlive it in the notification hold, so the invariants hold them to be sent."""
        exposition = await self.stack.node.metrics()
        return int(metric_sum(exposition, NOTIFY_PENDING) + metric_sum(exposition, INFLIGHT))

    async def _peer_kill(self, hold_s: float) -> dict[str, int]:
        """SIGKILL node b just after reading its owner table; start it again after `hold_s`."""
        peer = self.stack.nodes[1]
        owned = await peer.eval_json("_owned", PEER_OWNERS)
        await peer.kill()
        history, _ = notice_history(self.stack.notices(peer.full_name))
        earlier = frozenset().union(*(k.left_connected for k in self.peer_kills))
        left = frozenset(
            s for s, events in history.items() if events[-1] == CONNECTED and s not in earlier
        )
        self.peer_kills.append(PeerKill(frozenset(owned), left))
        await asyncio.sleep(hold_s)
        await peer.start()
        return {"owners": len(owned), "left_connected": len(left)}

    async def _shedding_becomes(self, wanted: bool) -> bool:
        """Whether the shedder's published verdict becomes `wanted` within SHEDDER_NOTICE_S."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHEDDER_NOTICE_S
        while await self.stack.eval_json("shedding_now(runtime)", SHEDDING) != wanted:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.2)
        return True

    async def _over_the_mark(self, hold_s: float) -> dict[str, Any]:
        """Ballast past the high-water mark for `hold_s`, then dropped: the shedder must shed,
        and leave shedding once memory is back under its low mark (seed: "Node-wide memory
        load shedding")."""
        high, _ = self.stack.shedder_marks
        rss = await self.stack.eval_json(
            "[_before, _after]", BALLAST.format(high=high, margin=BALLAST_MARGIN_BYTES)
        )
        try:
            entered = await self._shedding_becomes(True)
            await asyncio.sleep(hold_s)
        finally:
            await self.stack.eval(DROP_BALLAST)
        left = await self._shedding_becomes(False)
        return {
            "rss_anon_before": rss[0],
            "rss_anon_over": rss[1],
            "entered": entered,
            "left": left,
        }

    def shedder_misses(self) -> dict[str, int]:
        """The shedder faults whose shedder did not shed over the mark, or did not stop."""
        runs = [f.detail for f in self.faults if f.kind == sched.SHEDDER_OVER]
        return {
            "shedder_not_shedding_over_mark": sum(1 for d in runs if not d.get("entered")),
            "shedder_still_shedding_under_mark": sum(1 for d in runs if not d.get("left")),
        }

    async def command(self, event: sched.Fault) -> None:
        """One SendCommand, collected until its stream ends (or hangs)."""
        self._sequence += 1
        command_id = f"soak-{self._sequence:05d}"
        targets: tuple[str, ...] = ()
        if event.kind == sched.COMMAND:
            picked = self.rng.sample(range(self.stack.agents), min(event.size, self.stack.agents))
            targets = tuple(agent_id(i) for i in picked)
        result = CommandResult(command_id, targets, asyncio.get_running_loop().time())
        self.commands.append(result)
        request = mgmt.SendCommandRequest(
            agent_ids=targets,
            command=agent_pb2.CommandRequest(
                command_id=command_id,
                plugin="os",
                action="uptime",
                parameters={"token": PARAM_CANARY},
            ),
            timeout_seconds=sched.COMMAND_TIMEOUT_S,
        )
        call = self.channel.unary_stream(
            MGMT,
            request_serializer=mgmt.SendCommandRequest.SerializeToString,
            response_deserializer=mgmt.SendCommandResponse.FromString,
        )(request, timeout=sched.COMMAND_TIMEOUT_S + HANG_GRACE_S)
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for response in call:
                if response.response.status != _RUNNING:
                    result.terminals[response.agent_id] += 1
        code = await call.code()
        result.ended = asyncio.get_running_loop().time()
        result.code = None if code == grpc.StatusCode.DEADLINE_EXCEEDED else code.name
