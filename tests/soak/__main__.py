"""The standing fault soak: `python -m tests.soak [--agents N] [--minutes M] [--seed S]
[--nodes 2] [--json PATH] [--keep DIR]` (docs/dev/benchmarks.md, "`tests.soak`: the standing
fault soak").

A real node (`rel/yuzu_gw foreground`), the grpcio fake server, grpcio agents that register,
subscribe, heartbeat, answer commands and reconnect with the stock backoff, and a fault schedule
drawn from the seed (printed first, so a failing run can be replayed). It ends with a planned
stop, prints a table of the invariants (each a count that must be 0) and writes the JSON result.
Unlike a benchmark it exits 1 when an invariant is not 0.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.bench.common import RESULTS_DIR, report, run_on_uvloop
from tests.soak.report import table_rows
from tests.soak.run import run_soak

DEFAULT_AGENTS = 500
DEFAULT_MINUTES = 2.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--agents", type=int, default=DEFAULT_AGENTS, help="default 500")
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES, help="default 2")
    parser.add_argument("--seed", type=int, help="the fault schedule's seed (default: drawn)")
    parser.add_argument(
        "--nodes",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: two clustered nodes, and the cluster's faults (default 1)",
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=RESULTS_DIR / "soak.json",
        help="default bench-results/soak.json",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep the node's log, the notices, the snapshot, /metrics and the result in DIR",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
    seed = random.randrange(2**31) if args.seed is None else args.seed
    print(f"soak seed {seed}", flush=True)
    try:
        result = run_on_uvloop(
            run_soak(
                args.agents,
                args.minutes,
                seed,
                nodes=args.nodes,
                quiet=args.quiet,
                keep=args.keep,
            )
        )
    finally:
        if args.keep is not None:
            print(f"soak files kept in {args.keep}", flush=True)
    report(result, table_rows(result), args.json, as_json=False)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
