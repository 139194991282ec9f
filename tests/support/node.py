"""Helpers to run a real node in a test: its environment, an in-process node, and a plain
HTTP client for the health and metrics ports."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from gateway.node.boot import prepare
from gateway.node.node import Node

ROOT = Path(__file__).resolve().parents[2]
TEST_CONFIG = ROOT / "sys_config" / "test.config"


def node_env(run_dir: Path, config: Path = TEST_CONFIG, **extra: str) -> dict[str, str]:
    """The environment a test node boots with: the test config (ports 0 = free ports), a
    fresh cookie, the shipped vm.args advertising loopback (a single host), and its own run
    directory."""
    env = {
        "YUZU_GW_CONFIG": str(config),
        "YUZU_GW_VM_ARGS": str(ROOT / "sys_config" / "vm.args"),
        "YUZU_GW_COOKIE": secrets.token_hex(32),
        "YUZU_GW_ADVERTISE_ADDR": "127.0.0.1",
        "YUZU_GW_RUN_DIR": str(run_dir),
    }
    env.update(extra)
    return env


@contextlib.asynccontextmanager
async def running_node(run_dir: Path, **extra: str) -> AsyncIterator[Node]:
    node = Node(prepare(node_env(run_dir, **extra)))
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


async def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET on loopback; returns the status and body."""

    async def fetch() -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), body

    return await asyncio.wait_for(fetch(), timeout)
