"""The dev stack's orchestration: start in order, say where everything is, stop in order.

Start (each step waits for the one before; any failure stops what was started and exits 1):

1. the run directory `<YUZU_GW_RUN_DIR or ./run>/devstack` (mode 0700): with `--tls` a new
   throwaway PKI in `pki/`, the node's config `devstack.config` (derived from
   sys_config/sys.config, `config`), the cookie `cookie` (0600) unless YUZU_GW_COOKIE is set;
2. the ports: the shipped ones (agent 50051, management 50063, health 8081, metrics 9568,
   fake server 50055), each checked free first, or with `--free-ports` ports the kernel picks;
3. the fake Yuzu server, in this process;
4. the node, `python -m gateway`, a subprocess in its own session (a Ctrl-C in the terminal
   reaches only this process, which then stops the node in order), output in `node.log`;
5. `/readyz` answers 200 (the upstream channel is connected, every check passes);
6. the N simulated agents, in this process; all of them subscribed;
7. the banner (where everything listens, how to send a command) and `devstack.json` (the same
   facts for scripts), ending with the line `READY_LINE`.

Stop, on SIGINT or SIGTERM: the agents first (their streams and connections close), then the
node with its planned stop (SIGTERM; SIGKILL after `DEFAULT_STOP_TIMEOUT_S`), then the fake
server. Exit 0 when the node finished its planned stop, 1 otherwise (it failed to start, it
ended on its own, or its stop was not clean).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import attrs

from gateway.cli import DEFAULT_STOP_TIMEOUT_S
from gateway.config.loader import PROJECT_ROOT, SHIPPED_CONFIG, read_sections
from gateway.config.refusal import BootRefused
from gateway.devstack import config
from gateway.devstack.agents import AgentSettings, Fleet, Target
from gateway.devstack.pki import DevPki, write_pki
from gateway.devstack.upstream import FakeUpstream, start_fake_upstream

__all__ = ["READY_LINE", "Options", "StartFailed", "run"]

log = logging.getLogger("yuzu_gw.devstack")

READY_LINE = "devstack ready (Ctrl-C stops everything)"
EXIT_OK = 0
EXIT_FAILED = 1
# The node's boot plus its upstream connection; a slow shared CI host needs some of it.
READY_TIMEOUT_S = 60.0
# Readiness polls: often enough that the banner follows the node closely.
POLL_S = 0.2
LOG_TAIL_LINES = 20
# The node's environment must not move a port the banner names.
_NODE_ENV_DROPPED = ("YUZU_GW_AGENT_PORT", "YUZU_GW_MGMT_PORT", "YUZU_GW_NODE_NAME")


class StartFailed(Exception):
    """The stack could not start; the message says what to do."""


@attrs.frozen
class Options:
    agents: int = 50
    tls: bool = False
    free_ports: bool = False
    run_dir: Path = Path("run") / "devstack"
    settings: AgentSettings = attrs.field(factory=AgentSettings)
    ready_timeout_s: float = READY_TIMEOUT_S


# -- ports -------------------------------------------------------------------------------------


def _bind_host(port: int, ports: config.Ports) -> str:
    # The node's HTTP endpoints bind every interface, as in production; the rest loopback.
    return "0.0.0.0" if port in (ports.health, ports.metrics) else config.HOST


def free_ports() -> config.Ports:
    """Five distinct ports the kernel says are free now (a later bind can still lose a race)."""
    with contextlib.ExitStack() as stack:
        picked = []
        for _ in range(5):
            sock = stack.enter_context(socket.socket())
            sock.bind(("0.0.0.0", 0))
            picked.append(sock.getsockname()[1])
    upstream, agent, mgmt, health, metrics = picked
    return config.Ports(agent=agent, mgmt=mgmt, health=health, metrics=metrics, upstream=upstream)


def check_free(ports: config.Ports) -> None:
    for port in ports.all():
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((_bind_host(port, ports), port))
            except OSError:
                raise StartFailed(
                    f"port {port} is in use (a node or another dev stack running? rel/yuzu_gw"
                    " stop, or Ctrl-C the other stack); --free-ports picks free ports"
                ) from None


# -- the run directory -------------------------------------------------------------------------


@attrs.frozen
class RunDir:
    path: Path

    @property
    def config(self) -> Path:
        return self.path / "devstack.config"

    @property
    def node_log(self) -> Path:
        return self.path / "node.log"

    @property
    def facts(self) -> Path:
        return self.path / "devstack.json"

    @property
    def cookie(self) -> Path:
        return self.path / "cookie"

    @property
    def pki(self) -> Path:
        return self.path / "pki"

    def prepare(self) -> None:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)

    def cookie_for(self, env: Mapping[str, str]) -> str:
        """YUZU_GW_COOKIE when set, else a new one in the cookie file (0600), where
        `rel/yuzu_gw remote_console` with this run directory finds it."""
        if env.get("YUZU_GW_COOKIE"):
            return env["YUZU_GW_COOKIE"]
        cookie = secrets.token_hex(32)
        self.cookie.unlink(missing_ok=True)
        fd = os.open(self.cookie, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(cookie + "\n")
        return cookie

    def refuse_if_running(self) -> None:
        """Another stack's live node in this directory: its cookie and config must stay."""
        try:
            pid = int(json.loads(self.facts.read_text())["node_pid"])
            os.kill(pid, 0)
        except (OSError, ValueError, KeyError, TypeError):
            return  # no file, a stale one, or a node that is gone
        raise StartFailed(
            f"a dev stack already runs from {shown(self.path)} (its node is pid {pid}); stop it"
            " with Ctrl-C, or set YUZU_GW_RUN_DIR to another directory"
        )

    def log_tail(self) -> str:
        try:
            lines = self.node_log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no node log)"
        return "\n".join(lines[-LOG_TAIL_LINES:])


def shown(path: Path) -> str:
    """A path as a person would type it from here: relative below the working directory."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative


# -- the stack ---------------------------------------------------------------------------------


class Stack:
    def __init__(self, options: Options, env: Mapping[str, str]) -> None:
        self.options = options
        self.env = env
        self.run_dir = RunDir(options.run_dir.absolute())
        self.ports: config.Ports | None = None
        self.pki: DevPki | None = None
        self.fake: FakeUpstream | None = None
        self.node: asyncio.subprocess.Process | None = None
        self.fleet: Fleet | None = None
        self._log_file: IO[bytes] | None = None
        self._wrote_facts = False  # devstack.json is this stack's (not a running other's)

    async def start(self) -> None:
        self.run_dir.prepare()
        self.run_dir.refuse_if_running()
        sections = read_sections(PROJECT_ROOT / SHIPPED_CONFIG)
        if self.options.free_ports:
            self.ports = free_ports()
        else:
            self.ports = config.shipped_ports(sections)
            check_free(self.ports)
        if self.options.tls:
            self.pki = write_pki(self.run_dir.pki)
        derived = config.derive(sections, self.ports, self.pki)
        self.run_dir.config.write_text(config.render(derived, str(SHIPPED_CONFIG)))
        cookie = self.run_dir.cookie_for(self.env)
        if not self.env.get("YUZU_GW_COOKIE"):
            # The node's cookie guard fails closed; the stack passes this one explicitly.
            log.info(
                "YUZU_GW_COOKIE unset: the node gets a fresh cookie for this stack, in %s",
                shown(self.run_dir.cookie),
            )

        self.fake = await start_fake_upstream(config.HOST, self.ports.upstream, self.pki)
        log.info("fake Yuzu server listening on %s", self.fake.address)
        await self._start_node(cookie)
        await self._until_ready()
        log.info("node ready; starting %d agents", self.options.agents)

        ca = self.pki.ca_cert_pem if self.pki is not None else None
        target = Target(f"{config.HOST}:{self.ports.agent}", ca)
        self.fleet = Fleet(self.options.agents, target, self.options.settings)
        self.fleet.start()
        if not await self.fleet.wait_subscribed(self.options.ready_timeout_s):
            raise StartFailed(
                f"only {self.fleet.subscribed} of {self.options.agents} agents subscribed within"
                f" {self.options.ready_timeout_s:g} s; the end of {shown(self.run_dir.node_log)}:"
                f"\n{self.run_dir.log_tail()}"
            )
        self.fleet.report_changes()
        self.run_dir.facts.write_text(json.dumps(self.facts(), indent=2) + "\n")
        self._wrote_facts = True

    async def _start_node(self, cookie: str) -> None:
        env = {k: v for k, v in self.env.items() if k not in _NODE_ENV_DROPPED}
        path = env.get("PYTHONPATH")
        env.update(
            YUZU_GW_CONFIG=str(self.run_dir.config),
            YUZU_GW_RUN_DIR=str(self.run_dir.path),
            YUZU_GW_COOKIE=cookie,
            # The checkout's code, whatever else is installed (as rel/yuzu_gw does).
            PYTHONPATH=f"{PROJECT_ROOT}{os.pathsep + path if path else ''}",
        )
        self._log_file = self.run_dir.node_log.open("wb")
        self.node = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway",
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        log.info("node started (pid %d), log in %s", self.node.pid, shown(self.run_dir.node_log))

    async def _until_ready(self) -> None:
        assert self.node is not None and self.ports is not None
        url = f"http://{config.HOST}:{self.ports.health}/readyz"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.ready_timeout_s
        while loop.time() < deadline:
            if self.node.returncode is not None:
                raise StartFailed(
                    f"the node exited with status {self.node.returncode} before it was ready;"
                    f" the end of {shown(self.run_dir.node_log)}:\n{self.run_dir.log_tail()}"
                )
            if await asyncio.to_thread(http_status, url) == 200:
                return
            await asyncio.sleep(POLL_S)
        raise StartFailed(
            f"{url} did not answer 200 within {self.options.ready_timeout_s:g} s; the end of"
            f" {shown(self.run_dir.node_log)}:\n{self.run_dir.log_tail()}"
        )

    def facts(self) -> dict[str, object]:
        assert self.ports is not None and self.node is not None
        return {
            "ports": attrs.asdict(self.ports),
            "tls": self.pki is not None,
            "pki": str(self.pki.directory) if self.pki is not None else None,
            "node_pid": self.node.pid,
            "agents": self.options.agents,
            "node_log": str(self.run_dir.node_log),
        }

    async def wait_node(self) -> int:
        assert self.node is not None
        return await self.node.wait()

    async def stop(self) -> int:
        """Agents, node, fake server (module doc); the exit status."""
        status = EXIT_OK
        if self.fleet is not None:
            await self.fleet.stop()
            log.info("agents stopped")
        if self.node is not None:
            status = await self._stop_node()
        if self.fake is not None:
            await self.fake.stop()
            log.info("fake Yuzu server stopped")
        if self._log_file is not None:
            self._log_file.close()
        if self._wrote_facts:
            self.run_dir.facts.unlink(missing_ok=True)
        return status

    async def _stop_node(self) -> int:
        assert self.node is not None
        if self.node.returncode is None:
            self.node.send_signal(signal.SIGTERM)  # the planned stop
            try:
                async with asyncio.timeout(DEFAULT_STOP_TIMEOUT_S):
                    await self.node.wait()
            except TimeoutError:
                log.error("the node did not stop within %g s; killed", DEFAULT_STOP_TIMEOUT_S)
                self.node.kill()
                await self.node.wait()
            log.info("node stopped (status %d)", self.node.returncode)
        return EXIT_OK if self.node.returncode == 0 else EXIT_FAILED


def http_status(url: str) -> int | None:
    """The status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


# -- the banner --------------------------------------------------------------------------------


def operator_cli() -> str:
    """`yuzu-gw-ctl` beside this interpreter (the venv's console script), else the module."""
    script = Path(sys.executable).parent / "yuzu-gw-ctl"
    return str(script) if script.exists() else f"{sys.executable} -m gateway.ctl"


def banner(stack: Stack) -> str:
    assert stack.ports is not None
    ports, pki, run_dir = stack.ports, stack.pki, stack.run_dir
    host = config.HOST
    agents = stack.options.agents
    if pki is None:
        agent_tls = mgmt_tls = upstream_tls = "plaintext"
        send = f'broadcast("{host}:{ports.mgmt}", "os", "info")'
        ctl = f"{operator_cli()} --target {host}:{ports.mgmt} send --all os info"
    else:
        agent_tls = "one-way TLS (the agents verify the gateway)"
        mgmt_tls = "mutual TLS, peers admitted by the identity yuzu://<install>/server"
        upstream_tls = "mutual TLS"
        send = f'broadcast("{host}:{ports.mgmt}", "os", "info", pki="{pki.directory}")'
        ctl = (
            f"{operator_cli()} --target {host}:{ports.mgmt} --ca {pki.ca_cert_path}"
            f" --cert {pki.server.cert_path} --key {pki.server.key_path} send --all os info"
        )
    rel = shown(PROJECT_ROOT / "rel" / "yuzu_gw")
    lines = [
        f"Yuzu gateway dev stack: one node, a fake Yuzu server and {agents} simulated agents.",
        f"  agent listener       {host}:{ports.agent:<6} {agent_tls}; {agents} agents subscribed",
        f"  management listener  {host}:{ports.mgmt:<6} {mgmt_tls}",
        f"  fake Yuzu server     {host}:{ports.upstream:<6} {upstream_tls} (the node's upstream)",
        f"  health               http://{host}:{ports.health}/readyz",
        f"  metrics              http://{host}:{ports.metrics}/metrics",
        f"  node log             {shown(run_dir.node_log)}",
        f"  remote console       YUZU_GW_RUN_DIR={shown(run_dir.path)} {rel} remote_console",
    ]
    if pki is not None:
        lines.append(
            f"  certificates         {shown(pki.directory)} (throwaway CA; a management client"
            " presents server.pem)"
        )
    lines += [
        "",
        "Send a command to every agent (each answers RUNNING, then SUCCESS):",
        f"  {sys.executable} -c 'from gateway.devstack.client import broadcast; {send}'",
        f"  or with the operator CLI (docs/ctl.md): {ctl}",
        f"Count the agents: curl -s http://{host}:{ports.metrics}/metrics | grep"
        " '^yuzu_gw_agents_current'",
        READY_LINE,
    ]
    return "\n".join(lines)


# -- running it --------------------------------------------------------------------------------


async def run(options: Options, env: Mapping[str, str]) -> int:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    stack = Stack(options, env)
    status = EXIT_OK
    try:
        status = await _serve(stack, stopping)
    except (StartFailed, BootRefused, OSError) as exc:
        log.error("the dev stack did not start: %s", exc)
        status = EXIT_FAILED
    finally:
        stopped = await stack.stop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return status if status != EXIT_OK else stopped


async def _serve(stack: Stack, stopping: asyncio.Event) -> int:
    """Start, print the banner, wait for a stop request; EXIT_FAILED if the node ends first."""
    requested = asyncio.create_task(stopping.wait())
    starting = asyncio.create_task(stack.start())
    try:
        await asyncio.wait({requested, starting}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            log.info("stop requested while starting")
            return EXIT_OK
        starting.result()
        print(banner(stack), flush=True)
        ended = asyncio.create_task(stack.wait_node())
        await asyncio.wait({requested, ended}, return_when=asyncio.FIRST_COMPLETED)
        if not requested.done():
            log.error(
                "the node ended on its own (status %s); the end of %s:\n%s",
                ended.result(),
                shown(stack.run_dir.node_log),
                stack.run_dir.log_tail(),
            )
            return EXIT_FAILED
        ended.cancel()
        log.info("stopping: agents, then the node (planned stop), then the fake server")
        return EXIT_OK
    finally:
        for task in (requested, starting):
            task.cancel()
        await asyncio.gather(requested, starting, return_exceptions=True)
