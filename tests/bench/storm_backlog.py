"""Where a storm's new connections wait before the node reads them: the kernel's accept queue.

`tests.bench.storm` samples, while a wave runs, every loopback listening socket's accept queue
(`ss -ltn`: for a listening socket Recv-Q is the connections accepted by the kernel and not yet
by the process, Send-Q the backlog it was given), and the host's `TcpExtListenOverflows` and
`TcpExtListenDrops` (/proc/net/netstat: SYNs dropped because an accept queue was full). A queue
at its backlog with overflows growing means the connections wait for the node's accept loop; an
empty queue with connect time-outs means they wait after the accept (the HTTP/2 handshake
behind a busy loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from dataclasses import dataclass, field

SAMPLE_EVERY_S = 0.1
NETSTAT = "/proc/net/netstat"
COUNTERS = ("ListenOverflows", "ListenDrops")


@dataclass
class Backlog:
    """The deepest accept queue seen per listening port, its backlog, and the host counters'
    growth over the sampling."""

    deepest: dict[int, int] = field(default_factory=dict)
    backlog: dict[int, int] = field(default_factory=dict)
    samples: int = 0
    growth: dict[str, int] = field(default_factory=dict)

    def of(self, port: int) -> dict[str, int | None]:
        return {
            "accept_queue_max": self.deepest.get(port),
            "backlog": self.backlog.get(port),
            "samples": self.samples,
            "listen_overflows": self.growth.get("ListenOverflows"),
            "listen_drops": self.growth.get("ListenDrops"),
        }


def listen_counters() -> dict[str, int]:
    """TcpExt's ListenOverflows and ListenDrops of the host (empty off Linux)."""
    try:
        with open(NETSTAT, encoding="ascii") as netstat:
            lines = [line.split() for line in netstat if line.startswith("TcpExt:")]
    except OSError:
        return {}
    if len(lines) < 2:
        return {}
    names, values = lines[0], lines[1]
    return {name: int(value) for name, value in zip(names, values, strict=True) if name in COUNTERS}


def parse_ss(text: str) -> dict[int, tuple[int, int]]:
    """`ss -ltnH` output: (accept queue, backlog) by local port."""
    queues: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "LISTEN":
            port = int(parts[3].rsplit(":", 1)[1])
            queues[port] = (int(parts[1]), int(parts[2]))
    return queues


async def _sample(backlog: Backlog) -> None:
    while True:
        process = await asyncio.create_subprocess_exec(
            "ss", "-ltnH", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        out, _ = await process.communicate()
        for port, (queued, limit) in parse_ss(out.decode()).items():
            backlog.deepest[port] = max(queued, backlog.deepest.get(port, 0))
            backlog.backlog[port] = limit
        backlog.samples += 1
        await asyncio.sleep(SAMPLE_EVERY_S)


class Sampler:
    """Samples the accept queues from `start` to `stop`."""

    def __init__(self) -> None:
        self._backlog = Backlog()
        self._before: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._before = listen_counters()
        self._task = asyncio.get_running_loop().create_task(_sample(self._backlog))

    async def stop(self) -> Backlog:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        after = listen_counters()
        self._backlog.growth = {name: after[name] - self._before.get(name, 0) for name in after}
        return self._backlog
