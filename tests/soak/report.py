"""The soak's table and JSON file, as the benchmarks write them (tests/bench/common.py)."""

from __future__ import annotations

from typing import Any

from tests.bench.common import Row


def table_rows(result: dict[str, Any]) -> list[Row]:
    rss = result["rss_bytes"]
    stop = result["stop"]
    rows = [
        Row("seed (replay with --seed)", str(result["seed"])),
        Row(
            "agents, nodes, minutes",
            f"{result['agents']}, {result['nodes']}, {result['minutes']:g}",
        ),
        Row("fleet joined in", f"{result['join_s']:.1f} s"),
        Row("faults run", str(len(result["faults"]))),
        Row(
            "operator commands, terminal answers",
            f"{result['commands']}, {result['command_terminals']}",
        ),
        Row("sessions seen by the server", str(result["sessions_seen"])),
        Row("agent re-registrations", str(result["reconnects"])),
        Row("repeated notices (at least once)", str(result["notice_repeats"])),
        Row(
            "killed owners recovered / disconnected only / gave up",
            " / ".join(str(n) for n in result["owner_restarts"].values()),
        ),
        Row(
            "planned stop: exit after, DISCONNECTED acknowledged over",
            f"{stop['exit_s']:.2f} s, {stop['disconnected_acknowledged']}"
            f" over {stop['disconnected_span_s']:.2f} s",
        ),
        Row(
            "node RSS after the first cycle / last"
            + ("" if result["rss_compared"] else " (one cycle: not compared)"),
            f"{rss['first_cycle'] / 2**20:.1f} / {rss['last'] / 2**20:.1f} MiB",
        ),
    ]
    rows += [Row(name, str(count), "0", count == 0) for name, count in result["invariants"].items()]
    return rows
