"""`python -m gateway.devstack [--agents N] [--tls] [--free-ports]` (what `rel/yuzu_gw devstack`
execs): a fake Yuzu server, one gateway node and N simulated agents on loopback until Ctrl-C.
Exit status 0 after a clean stop, 1 when the stack did not start or did not stop cleanly, 2
usage. docs/devstack.md."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.console.paths import DEFAULT_RUN_DIR
from gateway.devstack.stack import Options, run
from gateway.node.version import add_version_option

DEFAULT_AGENTS = 50
# Enough to see fan-out; more is a benchmark (docs/dev/benchmarks.md), not a dev stack.
MAX_AGENTS = 5000


def _agents(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= count <= MAX_AGENTS:
        raise argparse.ArgumentTypeError(f"between 1 and {MAX_AGENTS}")
    return count


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rel/yuzu_gw devstack",
        description="Run a fake Yuzu server, one gateway node and simulated agents on loopback"
        " until Ctrl-C (docs/devstack.md).",
    )
    p.add_argument(
        "--agents",
        type=_agents,
        default=DEFAULT_AGENTS,
        metavar="N",
        help=f"simulated agents (default {DEFAULT_AGENTS})",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="a throwaway CA; one-way TLS to the agents, mutual TLS upstream and on management",
    )
    p.add_argument(
        "--free-ports",
        action="store_true",
        help="let the kernel pick every port instead of the shipped ones (50051, 50063, 8081,"
        " 9568, 50055)",
    )
    add_version_option(p)
    return p


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="devstack %(levelname)s %(message)s", stream=sys.stderr
    )
    run_dir = Path(env.get("YUZU_GW_RUN_DIR") or DEFAULT_RUN_DIR) / "devstack"
    options = Options(agents=args.agents, tls=args.tls, free_ports=args.free_ports, run_dir=run_dir)
    return asyncio.run(run(options, env))


if __name__ == "__main__":
    sys.exit(main())
