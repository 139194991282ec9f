"""Benchmark of a `/metrics` scrape's cost on the event loop: `python -m tests.bench.scrape
[--fds N] [--scrapes K] [--json]`.

A node holding N agent connections holds N open descriptors, and prometheus-client's process
collector lists `/proc/self/fd` on every scrape, on the loop. This opens N TCP sockets (a
stand-in for held connections: the listing costs the same per descriptor), then times K
`generate_latest` calls of:

- `library`: a registry holding prometheus-client's own `ProcessCollector` only;
- `gateway`: a registry holding the gateway's (gateway/node/process_collector.py) only;
- `node_registry`: the collectors every node's registry starts with (gateway/node/boot.py).

Reported: the median and the largest milliseconds per scrape of each. Target: the gateway's
process collector costs under a tenth of the library's at N descriptors, and the same families
come out of both, with open_fds within one (the library's listing counts the descriptor of the
directory it is listing).
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest

from gateway.node.boot import node_registry
from gateway.node.process_collector import ProcessCollector
from tests.bench.common import Row, add_common_arguments, environment, median, report

NAME = "scrape"
DEFAULT_FDS = 5000
DEFAULT_SCRAPES = 50
TARGET_RATIO = 0.1


@contextlib.contextmanager
def open_sockets(count: int) -> Iterator[int]:
    """`count` open TCP sockets; yields the descriptor limit in force (raised to the hard one
    when the soft one is too low)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 256
    if soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        yield resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        for sock in sockets:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def registry_with(make: Callable[[CollectorRegistry], object]) -> CollectorRegistry:
    registry = CollectorRegistry()
    make(registry)
    return registry


def time_scrapes(registry: CollectorRegistry, scrapes: int) -> list[float]:
    """Milliseconds per `generate_latest`, after one warm-up scrape."""
    generate_latest(registry)
    took = []
    for _ in range(scrapes):
        start = time.perf_counter()
        generate_latest(registry)
        took.append((time.perf_counter() - start) * 1000)
    return took


def open_fds_value(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("process_open_fds")


def _within_one(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and abs(a - b) <= 1


def run_benchmark(fds: int = DEFAULT_FDS, scrapes: int = DEFAULT_SCRAPES) -> dict[str, Any]:
    with open_sockets(fds) as limit:
        library = registry_with(lambda r: prometheus_client.ProcessCollector(registry=r))
        ours = registry_with(lambda r: ProcessCollector(registry=r))
        node = node_registry()
        runs = {
            "library": time_scrapes(library, scrapes),
            "gateway": time_scrapes(ours, scrapes),
            "node_registry": time_scrapes(node, scrapes),
        }
        # Read back to back, so nothing opened in between.
        counts = {"library": open_fds_value(library), "gateway": open_fds_value(ours)}
        names = {
            name: sorted(m.name for m in registry.collect())
            for name, registry in (("library", library), ("gateway", ours))
        }
    library_ms, ours_ms = median(runs["library"]), median(runs["gateway"])
    return {
        "benchmark": NAME,
        "environment": environment(),
        "fds": fds,
        "fd_limit": limit,
        "scrapes": scrapes,
        "median_ms": {name: median(took) for name, took in runs.items()},
        "max_ms": {name: max(took) for name, took in runs.items()},
        "ratio": ours_ms / library_ms if library_ms else None,
        "same_families": names["library"] == names["gateway"],
        "open_fds": counts,
        "same_open_fds": _within_one(counts["library"], counts["gateway"]),
        "targets_met": ours_ms < TARGET_RATIO * library_ms
        and names["library"] == names["gateway"]
        and _within_one(counts["library"], counts["gateway"]),
    }


def rows(result: dict[str, Any]) -> list[Row]:
    median_ms, max_ms = result["median_ms"], result["max_ms"]
    table = [
        Row(f"{name} ms per scrape (median / max)", f"{median_ms[name]:.3f} / {max_ms[name]:.3f}")
        for name in median_ms
    ]
    ratio = result["ratio"]
    table.append(
        Row(
            "gateway / library",
            "n/a" if ratio is None else f"{ratio:.3f}",
            f"< {TARGET_RATIO}",
            ratio is not None and ratio < TARGET_RATIO,
        )
    )
    same = result["same_families"] and result["same_open_fds"]
    table.append(Row("same families and open_fds", "yes" if same else "no", "yes", same))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fds", type=int, default=DEFAULT_FDS, help="open sockets to hold")
    parser.add_argument("--scrapes", type=int, default=DEFAULT_SCRAPES, help="timed scrapes each")
    add_common_arguments(parser, NAME)
    args = parser.parse_args()
    result = run_benchmark(args.fds, args.scrapes)
    report(result, rows(result), args.out, args.json)


if __name__ == "__main__":
    main()
