"""Shared plumbing for the benchmarks under `tests/bench/` (see docs/dev/benchmarks.md).

Every benchmark is a module run as `python -m tests.bench.<name>`. It measures, then:
- prints a table of metric, value, target and pass/fail;
- writes the full result as JSON to `bench-results/<name>.json` (or `--out PATH`);
- with `--json`, prints the same object as a single line, the last line of stdout, so a
  script can read it with `tail -n 1`.

A benchmark always exits 0: it reports, it does not fail CI. Whether each target was met
is in the JSON under `targets_met`.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO_ROOT / "bench-results"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of a benchmark's table; `passed` is None for a metric with no target."""

    metric: str
    value: str
    target: str = ""
    passed: bool | None = None


def rss_bytes() -> int | None:
    """The resident set size of this process, from /proc/self/status (None elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    # "VmRSS:     123456 kB"
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class GcMeter:
    """Time spent in, and collections run by, the cyclic garbage collector while the
    meter is active (`with GcMeter() as gc_meter: ...`); `mark()` reads it mid-way."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1

    def mark(self) -> tuple[float, list[int]]:
        return self.seconds, list(self.collections)

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def environment() -> dict[str, Any]:
    """What a reader needs to compare two result files."""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def format_table(rows: Sequence[Row]) -> str:
    header = ("metric", "value", "target", "result")
    cells = [header] + [
        (
            row.metric,
            row.value,
            row.target,
            "" if row.passed is None else ("pass" if row.passed else "FAIL"),
        )
        for row in rows
    ]
    widths = [max(len(line[col]) for line in cells) for col in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(line.rstrip() for line in lines)


def add_common_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON object on the last line of stdout",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / f"{name}.json",
        help=f"where to write the JSON result (default bench-results/{name}.json)",
    )


def int_list(text: str) -> list[int]:
    """argparse type for `10000,100000` (underscores allowed: `100_000`)."""
    try:
        values = [int(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from None
    if not values or any(value <= 0 for value in values):
        raise argparse.ArgumentTypeError(f"expected positive integers: {text}")
    return values


def write_json(result: dict[str, Any], out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return out


def report(result: dict[str, Any], rows: Sequence[Row], out: Path, as_json: bool) -> None:
    """Print the table, write the JSON file and, with `as_json`, end stdout with the JSON."""
    print(format_table(rows))
    path = write_json(result, out)
    print(f"\nresults written to {path}")
    if as_json:
        print(json.dumps(result, separators=(",", ":")))
    sys.stdout.flush()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of the line: 12 and 13 after "(comm) ".
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_on_uvloop(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """On uvloop when it installs, as the node runs (gateway/__main__.py)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        import asyncio

        return asyncio.run(coro)
    return uvloop.run(coro)  # type: ignore[no-any-return]
