"""What an operator finds in the remote console: the helpers and the names bound for them.

Every helper reads published state (the runtime's records, the metric registry) and sends no
message, so the console answers while an actor is stuck, which is when it is needed. What is
shown of an actor comes only from its `format_status()` (see `supervisors.introspection`);
the cookie is in no helper's answer.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
from prometheus_client import generate_latest

from supervisors import introspection
from supervisors.address import Address
from supervisors.runtime import LoopSystemBase

if TYPE_CHECKING:
    from gateway.config.context import NodeContext

BANNER = """\
yuzu_gw remote console on {name} (pid {pid}); code runs inside the node's loop, `await` works.
  actors()          every actor: address, class, name, mailbox length
  tree()            the supervision tree
  status(name)      one actor's redacted status (a registered name or an address id)
  metrics(prefix)   the node's current metrics, optionally only names starting with prefix
  node, runtime, config
Leave with exit() or end of input (Ctrl-D); the node keeps running. Blocking code blocks the
node: prefer `await asyncio.sleep(...)` to `time.sleep(...)`."""


class Text(str):
    """A string the console shows as it is (a table, the tree), not as a quoted repr."""

    def __repr__(self) -> str:
        return str(self)


class Listing(list[introspection.ActorInfo]):
    """`actors()`'s answer: a list (so `len(actors())` and filtering work) that the
    console shows as a table."""

    def __repr__(self) -> str:
        return actor_table(self)


def actor_table(rows: Iterable[introspection.ActorInfo]) -> str:
    header = ("ADDRESS", "CLASS", "NAME", "MAILBOX")
    lines = [header] + [
        (str(row.address), row.cls, row.name or "-", str(row.mailbox)) for row in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


@attrs.frozen
class NodeInfo:
    """`node` in the console: who this is, never its cookie."""

    name: str
    short_name: str
    pid: int
    run_dir: Path
    config_path: str
    bound: dict[str, tuple[str, int]]
    started_monotonic: float = attrs.field(repr=False)

    @property
    def uptime_s(self) -> float:
        return round(time.monotonic() - self.started_monotonic, 1)


def filter_metrics(exposition: str, prefix: str) -> str:
    """Keep the samples, HELP and TYPE lines of metrics whose name starts with `prefix`."""
    if not prefix:
        return exposition
    kept = []
    for line in exposition.splitlines():
        if line.startswith("# "):
            parts = line.split(" ", 3)
            name = parts[2] if len(parts) > 2 else ""
        else:
            name = line
        if name.startswith(prefix):
            kept.append(line)
    return "\n".join(kept)


def _leave() -> NoReturn:
    # Not the builtin exit(): site's Quitter closes sys.stdin, which is the node's own.
    raise SystemExit


def namespace(ctx: NodeContext, system: LoopSystemBase, started: float) -> dict[str, Any]:
    """A fresh namespace per session: one operator's variables never leak into another's."""

    def actors() -> Listing:
        return Listing(introspection.actors(system))

    def tree() -> Text:
        return Text(introspection.tree(system))

    def status(target: str | int | Address) -> dict[str, Any]:
        address = Address(target) if isinstance(target, int) else target
        return dict(introspection.status(system, address))

    def metrics(prefix: str = "") -> Text:
        return Text(filter_metrics(generate_latest(ctx.registry).decode(), prefix))

    helpers: dict[str, Callable[..., Any]] = {
        "actors": actors,
        "tree": tree,
        "status": status,
        "metrics": metrics,
        "exit": _leave,
        "quit": _leave,
    }
    return {
        "__name__": "__console__",
        "asyncio": asyncio,
        **helpers,
        "node": NodeInfo(
            name=ctx.node.name,
            short_name=ctx.node.short_name,
            pid=os.getpid(),
            run_dir=ctx.run_dir,
            config_path=str(getattr(ctx.config, "path", "?")),
            bound=ctx.bound,
            started_monotonic=started,
        ),
        "runtime": system,
        "config": ctx.config,
    }
