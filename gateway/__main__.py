"""`python -m gateway`: boot one node in the foreground (what `rel/yuzu_gw foreground`
execs). Exit status 0 after a planned stop, 1 when boot is refused, 2 when the tree gave
up (the root supervisor reached its restart intensity)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence

from gateway.config.refusal import BootRefused, log_refusal
from gateway.node.boot import prepare
from gateway.node.logs import configure_logging
from gateway.node.node import Node
from gateway.node.sd_notify import SystemdNotify
from gateway.node.version import add_version_option

log = logging.getLogger("yuzu_gw.boot")

EXIT_STOPPED = 0
EXIT_REFUSED = 1
EXIT_TREE_ENDED = 2


async def serve(node: Node) -> int:
    loop = asyncio.get_running_loop()
    # Handlers first: the pid file appears during start, and a SIGTERM sent as soon as it
    # does must still be a planned stop, not the default (immediate) termination.
    stop_requested = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    await node.start()
    ended = loop.create_task(node.wait())
    requested = loop.create_task(stop_requested.wait())
    await asyncio.wait({ended, requested}, return_when=asyncio.FIRST_COMPLETED)
    if requested.done():
        log.info("planned stop requested")
        await node.stop()
        ended.cancel()
        return EXIT_STOPPED
    requested.cancel()
    await node.close()
    return EXIT_STOPPED if ended.result().is_normal else EXIT_TREE_ENDED


def run(env: Mapping[str, str]) -> int:
    configure_logging(env)
    try:
        ctx = prepare(env)
        configure_logging(env, ctx.config)  # log_format of the file (gateway/node/logs.py)
        node = Node(ctx, SystemdNotify.from_env(env))
        return _run_loop(serve(node))
    except BootRefused as refused:
        log_refusal(refused)
        return EXIT_REFUSED


def _run_loop(main: object) -> int:
    try:
        import uvloop  # noqa: PLC0415  (optional: a faster loop where it installs)
    except ImportError:
        return asyncio.run(main)  # type: ignore[arg-type]
    return uvloop.run(main)  # type: ignore[arg-type]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gateway",
        description="Boot one Yuzu gateway node in the foreground (what `rel/yuzu_gw"
        " foreground` execs) until SIGTERM or SIGINT, its planned stop. It takes no"
        " arguments: the environment names its files (YUZU_GW_CONFIG, YUZU_GW_VM_ARGS,"
        " YUZU_GW_RUN_DIR, YUZU_GW_COOKIE; docs/release.md). Under a systemd Type=notify"
        " unit it sends READY=1, STOPPING=1 and WATCHDOG=1 (docs/install.md).",
        epilog="Exit status: 0 after a planned stop, 1 boot refused, 2 the supervision tree"
        " gave up.",
    )
    add_version_option(p)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    # Before anything boots: --help and --version print and exit, a stray argument is usage.
    parser().parse_args(argv)
    sys.exit(run(os.environ))


if __name__ == "__main__":
    main()
