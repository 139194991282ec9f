"""The soak's processes: the fake server (in the soak's own loop, so its record and its faults are
at hand), a real node (`rel/yuzu_gw foreground`, its log a file), and the agent processes.

The two-node variant (`--nodes 2`) runs nodes `yuzu_gw-a` and `yuzu_gw-b`, clustered on
loopback, each dialling the other through a `Relay` (tests/integration/test_cluster_partition.py)
that the `link_cut` fault pauses; every port is fixed before boot, so node b restarted after a
`peer_kill` is where its agents and its peer look for it. Each agent dials both nodes' agent
listeners (pick_first, half the fleet b first), so it moves to the other node when its own ends.

`Stack` is an async context manager: every process it started is ended on the way out, a node
by SIGKILL of its process group if the planned stop did not end it, the agents by `stop` and
then SIGKILL, the relays closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from gateway.console.client import Unreachable, open_session
from gateway.devstack.fake_upstream import FakeUpstream
from protos.yuzu.gateway.v1 import gateway_pb2
from tests.integration.test_cluster import free_port
from tests.integration.test_cluster_partition import Relay
from tests.support.node import ROOT, TEST_CONFIG, http_get, node_env

SCRIPT = ROOT / "rel" / "yuzu_gw"
NOTIFY = "NotifyStreamStatus"
EVENT = gateway_pb2.StreamStatusNotification.Event
AGENTS_PER_PROCESS = 500
# The agents stand for 10,000 other hosts: here they share the node's two cores, and at the
# lowest priority they take only what the node and the fake server leave (at equal priority
# 20 agent processes left the node a fifth of a core through the planned stop).
AGENT_NICE = 19
BOOT_S = 30.0
STOP_S = 60.0
# How long the console may take to greet: a node of 10,000 agents under a reclaim pass's full
# collection, on a loaded host, has missed the client's own 5 s (the 2026-12-04 full run).
CONSOLE_S = 30.0
# The cluster's redial: quick, so a cut link or a restarted peer is found again within a fault.
REDIAL_MS = 500
NODE_NAMES = ("yuzu_gw-a", "yuzu_gw-b")
# The planned stop's budget: the shipped default (seed: "Planned stop").
FLUSH_BUDGET_MS = 20000
# The memory shedder's marks, in bytes of RssAnon (what it samples): far above what the fleet
# costs (about 45 KB an agent, docs/dev/benchmarks.md, `agents`), so only the `shedder_over` fault's
# ballast crosses them. Sampled every SHEDDER_INTERVAL_MS.
SHEDDER_BASE_BYTES = 512 * 2**20
SHEDDER_BYTES_PER_AGENT = 96 * 2**10
SHEDDER_HYSTERESIS_BYTES = 128 * 2**20
SHEDDER_INTERVAL_MS = 200


def shedder_marks(agents: int) -> tuple[int, int]:
    """The (high, low) water marks for a fleet of `agents`."""
    high = SHEDDER_BASE_BYTES + agents * SHEDDER_BYTES_PER_AGENT
    return high, high - SHEDDER_HYSTERESIS_BYTES


@attrs.frozen
class Ports:
    """A node's ports, fixed before it boots (so a restart finds the same ones)."""

    agent: int
    mgmt: int
    health: int
    metrics: int
    cluster: int

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port())


def soak_config(
    run_dir: Path,
    upstream_port: int,
    agents: int,
    ports: Ports,
    *,
    name: str = "yuzu_gw",
    seeds: Sequence[int] = (),
) -> Path:
    """test.config with the fake server as the upstream, room for the fleet's connections, the
    shipped flush budget, the shedder's marks, fixed ports, and the node's name and cluster
    seeds (`seeds`: the loopback ports it dials its peers on)."""
    high, low = shedder_marks(agents)
    upstream = (
        "{upstream_client, #{channels => [{default_channel,"
        f' [{{http, "127.0.0.1", {upstream_port}, []}}], #{{}}}}]}}}},'
        f" {{memory_shedding, #{{interval_ms => {SHEDDER_INTERVAL_MS},"
        f" high_water_bytes => {high}, low_water_bytes => {low}}}}},"
        f' {{node_name, <<"{name}@127.0.0.1">>}}'
    )
    peers = ", ".join(f'<<"127.0.0.1:{port}">>' for port in seeds)
    replacements = {
        "{allow_no_upstream, true}": upstream,
        "{shutdown_flush_budget_ms, 2000}": f"{{shutdown_flush_budget_ms, {FLUSH_BUDGET_MS}}}",
        "max_connections => 1000": f"max_connections => {2 * agents + 100}",
        "{health_port, 0}": f"{{health_port, {ports.health}}}",
        "{prometheus_port, 0}": f"{{prometheus_port, {ports.metrics}}}",
        "{cluster_port, 0}": f"{{cluster_port, {ports.cluster}}}",
        "{cluster_seed_nodes, []}": f"{{cluster_seed_nodes, [{peers}]}}",
        "{cluster_redial_interval_ms, 5000}": f"{{cluster_redial_interval_ms, {REDIAL_MS}}}",
        # The agent listener's, then the management listener's.
        "listen => #{port => 0, ip => {127,0,0,1}},\n": (
            f"listen => #{{port => {ports.agent}, ip => {{127,0,0,1}}}},\n"
        ),
        "listen => #{port => 0, ip => {127,0,0,1}}}": (
            f"listen => #{{port => {ports.mgmt}, ip => {{127,0,0,1}}}}}}"
        ),
    }
    text = TEST_CONFIG.read_text()
    for old, new in replacements.items():
        if old not in text:
            raise RuntimeError(f"sys_config/test.config no longer has {old!r}")
        text = text.replace(old, new)
    path = run_dir / "soak.config"
    path.write_text(text)
    return path


class AgentProcess:
    """One `python -m tests.soak.agents` child, driven over its stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._lock = asyncio.Lock()

    async def line(self, timeout: float = 60.0) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            raise RuntimeError("an agent process ended")
        return raw.decode().strip()

    async def report(self) -> dict[str, Any]:
        async with self._lock:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"report\n")
            await self.proc.stdin.drain()
            return dict(json.loads(await self.line()))

    async def stop(self) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None:
            with contextlib.suppress(ConnectionError):
                self.proc.stdin.write(b"stop\n")
                await self.proc.stdin.drain()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 10.0)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


class GatewayNode:
    """One node: `rel/yuzu_gw foreground` in its own run directory, its log appended to across
    restarts (a killed incarnation's lines stay)."""

    def __init__(self, run_dir: Path, name: str, ports: Ports, env: dict[str, str]) -> None:
        self.run_dir = run_dir
        self.name = name
        self.ports = ports
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.bound: dict[str, tuple[str, int]] = {}
        self.log_path = run_dir / "node.log"
        self.exit: int | None = None

    @property
    def full_name(self) -> str:
        return f"{self.name}@127.0.0.1"

    @property
    def console(self) -> Path:
        return self.run_dir / f"{self.name}.console"

    def port(self, name: str) -> int:
        return int(self.bound[name][1])

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                str(SCRIPT),
                "foreground",
                env=self.env,
                cwd=self.run_dir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.exit = None
        async with asyncio.timeout(BOOT_S):
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"{self.name} ended during boot:\n{self.log_text()}")
                with contextlib.suppress(OSError, RuntimeError, KeyError, Unreachable):
                    if self.console.exists():
                        self.bound = await self.eval_json("node.bound")
                        break
                await asyncio.sleep(0.2)
            while (await http_get(self.port("health"), "/readyz"))[0] != 200:
                await asyncio.sleep(0.2)

    async def kill(self) -> None:
        """SIGKILL of the node's process group: no stop, no DISCONNECTED."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()

    async def eval(self, source: str) -> dict[str, Any]:
        """Run `source` in the node through the remote console (as `yuzu_gw eval` does)."""
        _, writer, reply = await open_session(
            self.console, self.env["YUZU_GW_COOKIE"], "eval", source, timeout=CONSOLE_S
        )
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        if "raised" in reply:
            raise RuntimeError(f"console eval raised: {reply['raised']}")
        return reply

    async def eval_json(self, expr: str, setup: str = "") -> Any:
        """The value of `expr` (JSON-able), after the statements `setup`, in the node."""
        reply = await self.eval(f"import json\n{setup}\nprint(json.dumps({expr}))")
        return json.loads(reply["output"])

    async def metrics(self) -> str:
        status, body = await http_get(self.port("metrics"), "/metrics", timeout=15.0)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return body.decode()

    def rss(self) -> int:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    async def planned_stop(self) -> int:
        """SIGTERM, as systemd or docker stop sends; the node's exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.exit = await asyncio.wait_for(self.proc.wait(), STOP_S)
        return self.exit

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Stack:
    def __init__(self, tmp: Path, agents: int, seed: int, nodes: int = 1) -> None:
        if nodes not in (1, 2):
            raise ValueError("the soak runs one node or two")
        self.tmp = tmp
        self.agents = agents
        self.seed = seed
        self.token = f"soak-canary-enrol-{secrets.token_hex(12)}"
        self.fake = FakeUpstream()
        self.cookie = secrets.token_hex(32)
        self.ports = [Ports.free() for _ in range(nodes)]
        # Node n dials node n+1 (of two) through relays[n]; none for a single node.
        self.relays = (
            [Relay(free_port(), self.ports[1 - n].cluster) for n in range(nodes)]
            if nodes > 1
            else []
        )
        self.nodes: list[GatewayNode] = []
        self.fleet: list[AgentProcess] = []

    @property
    def node(self) -> GatewayNode:
        """The first node: where the single-node faults, the operators and the checks act."""
        return self.nodes[0]

    @property
    def shedder_marks(self) -> tuple[int, int]:
        return shedder_marks(self.agents)

    async def __aenter__(self) -> Stack:
        await self.fake.start()
        try:
            for relay in self.relays:
                await relay.start()
            await self._start_nodes()
            await self._start_agents()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for agents in self.fleet:
            with contextlib.suppress(ProcessLookupError):
                await agents.stop()
        for node in self.nodes:
            await node.kill()
        for relay in self.relays:
            await relay.stop()
        await self.fake.stop()

    async def _start_nodes(self) -> None:
        single = len(self.ports) == 1
        for n, ports in enumerate(self.ports):
            name = "yuzu_gw" if single else NODE_NAMES[n]
            run_dir = self.tmp if single else self.tmp / name
            run_dir.mkdir(exist_ok=True)
            seeds = [relay.port for relay in self.relays[n : n + 1]]
            config = soak_config(
                run_dir, self.fake.port, self.agents, ports, name=name, seeds=seeds
            )
            env = {
                **os.environ,
                **node_env(run_dir, YUZU_GW_CONFIG=str(config), YUZU_GW_COOKIE=self.cookie),
                "YUZU_GW_PYTHON": sys.executable,
            }
            self.nodes.append(GatewayNode(run_dir, name, ports, env))
        await asyncio.gather(*(node.start() for node in self.nodes))

    def _target(self, index: int) -> str:
        """Agent `index`'s target: its node (of two, by parity) first, then the other."""
        ports = [p.agent for p in self.ports]
        turn = index % len(ports)
        ordered = ports[turn:] + ports[:turn]
        return "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ordered)

    async def _start_agents(self) -> None:
        for first in range(0, self.agents, AGENTS_PER_PROCESS):
            count = min(AGENTS_PER_PROCESS, self.agents - first)
            # Agent first + i dials targets[i % len(targets)].
            targets = [self._target(first + i) for i in range(min(count, len(self.nodes)))]
            proc = await asyncio.create_subprocess_exec(
                "nice",
                "-n",
                str(AGENT_NICE),
                sys.executable,
                "-m",
                "tests.soak.agents",
                *(arg for target in targets for arg in ("--target", target)),
                "--count",
                str(count),
                "--first",
                str(first),
                "--token",
                self.token,
                "--seed",
                str(self.seed + first),
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=64 * 1024 * 1024,  # a report is one line of every agent's sessions
            )
            self.fleet.append(AgentProcess(proc))
        for agents in self.fleet:
            if await agents.line() != "ready":
                raise RuntimeError("an agent process did not start")

    async def eval(self, source: str) -> dict[str, Any]:
        return await self.node.eval(source)

    async def eval_json(self, expr: str, setup: str = "") -> Any:
        return await self.node.eval_json(expr, setup)

    async def reports(self) -> dict[str, dict[str, Any]]:
        merged: dict[str, dict[str, Any]] = {}
        for part in await asyncio.gather(*(agents.report() for agents in self.fleet)):
            merged.update(part)
        return merged

    async def planned_stop(self) -> list[int]:
        """Every node's planned stop at once; their exit statuses."""
        return list(await asyncio.gather(*(node.planned_stop() for node in self.nodes)))

    def notices(self, node: str | None = None) -> list[tuple[str, str]]:
        """The fake's acknowledged stream-status notices as (session, event), in the order
        received; from `node` (its full name) only, when given."""
        return [
            (call.request.session_id, EVENT.Name(call.request.event))
            for call in self.fake.calls(NOTIFY)
            if call.code is not None
            and call.code.name == "OK"
            and call.response.acknowledged
            and node in (None, call.request.gateway_node)
        ]

    def log_text(self) -> str:
        return "".join(node.log_text() for node in self.nodes)
