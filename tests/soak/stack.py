"""The soak's processes: the fake server (in the soak's own loop, so its record and its faults are
at hand), a real node (`rel/yuzu_gw foreground`, its log a file), and the agent processes.

`Stack` is an async context manager: every process it started is ended on the way out, the node
by SIGKILL of its process group if the planned stop did not end it, the agents by `stop` and
then SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

from gateway.console.client import Unreachable, one_shot
from gateway.devstack.fake_upstream import FakeUpstream
from tests.support.node import ROOT, TEST_CONFIG, http_get, node_env

SCRIPT = ROOT / "rel" / "yuzu_gw"
AGENTS_PER_PROCESS = 500
BOOT_S = 30.0
STOP_S = 60.0
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


def soak_config(tmp: Path, upstream_port: int, agents: int) -> Path:
    """test.config with the fake server as the upstream, room for the fleet's connections,
    the shipped flush budget and the shedder's marks."""
    high, low = shedder_marks(agents)
    upstream = (
        "{upstream_client, #{channels => [{default_channel,"
        f' [{{http, "127.0.0.1", {upstream_port}, []}}], #{{}}}}]}}}},'
        f" {{memory_shedding, #{{interval_ms => {SHEDDER_INTERVAL_MS},"
        f" high_water_bytes => {high}, low_water_bytes => {low}}}}}"
    )
    text = TEST_CONFIG.read_text().replace("{allow_no_upstream, true}", upstream)
    text = text.replace(
        "{shutdown_flush_budget_ms, 2000}", f"{{shutdown_flush_budget_ms, {FLUSH_BUDGET_MS}}}"
    )
    text = text.replace("max_connections => 1000", f"max_connections => {2 * agents + 100}")
    path = tmp / "soak.config"
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


class Stack:
    def __init__(self, tmp: Path, agents: int, seed: int) -> None:
        self.tmp = tmp
        self.agents = agents
        self.seed = seed
        self.token = f"soak-canary-enrol-{secrets.token_hex(12)}"
        self.fake = FakeUpstream()
        self.env: dict[str, str] = {}
        self.node: asyncio.subprocess.Process | None = None
        self.log_path = tmp / "node.log"
        self.bound: dict[str, tuple[str, int]] = {}
        self.fleet: list[AgentProcess] = []
        self.node_exit: int | None = None

    @property
    def shedder_marks(self) -> tuple[int, int]:
        return shedder_marks(self.agents)

    @property
    def console(self) -> Path:
        return self.tmp / "yuzu_gw.console"

    def port(self, name: str) -> int:
        return int(self.bound[name][1])

    async def __aenter__(self) -> Stack:
        await self.fake.start()
        try:
            await self._start_node()
            await self._start_agents()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for agents in self.fleet:
            with contextlib.suppress(ProcessLookupError):
                await agents.stop()
        if self.node is not None and self.node.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.node.pid, signal.SIGKILL)
            await self.node.wait()
        await self.fake.stop()

    async def _start_node(self) -> None:
        config = soak_config(self.tmp, self.fake.port, self.agents)
        self.env = {**os.environ, **node_env(self.tmp, YUZU_GW_CONFIG=str(config))}
        self.env["YUZU_GW_PYTHON"] = sys.executable
        with self.log_path.open("wb") as log:
            self.node = await asyncio.create_subprocess_exec(
                str(SCRIPT),
                "foreground",
                env=self.env,
                cwd=self.tmp,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        async with asyncio.timeout(BOOT_S):
            while True:
                if self.node.returncode is not None:
                    raise RuntimeError(f"the node ended during boot:\n{self.log_text()}")
                with contextlib.suppress(OSError, RuntimeError, KeyError, Unreachable):
                    if self.console.exists():
                        self.bound = await self.eval_json("node.bound")
                        break
                await asyncio.sleep(0.2)
            while (await http_get(self.port("health"), "/readyz"))[0] != 200:
                await asyncio.sleep(0.2)

    async def _start_agents(self) -> None:
        target = f"127.0.0.1:{self.port('listener_agent')}"
        for first in range(0, self.agents, AGENTS_PER_PROCESS):
            count = min(AGENTS_PER_PROCESS, self.agents - first)
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.soak.agents",
                "--target",
                target,
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
        """Run `source` in the node through the remote console (as `yuzu_gw eval` does)."""
        reply = await one_shot(self.console, self.env["YUZU_GW_COOKIE"], "eval", source)
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

    async def reports(self) -> dict[str, dict[str, Any]]:
        merged: dict[str, dict[str, Any]] = {}
        for part in await asyncio.gather(*(agents.report() for agents in self.fleet)):
            merged.update(part)
        return merged

    def node_rss(self) -> int:
        assert self.node is not None
        with open(f"/proc/{self.node.pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    async def planned_stop(self) -> int:
        """SIGTERM, as systemd or docker stop sends; the node's exit status."""
        assert self.node is not None
        self.node.send_signal(signal.SIGTERM)
        self.node_exit = await asyncio.wait_for(self.node.wait(), STOP_S)
        return self.node_exit

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
