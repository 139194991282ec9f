"""Benchmark of the loop system base (`supervisors.runtime.LoopSystemBase`) against
thespian's `simpleSystemBase`: `python -m tests.bench.runtime [--n 10000,100000] [--json]`.

Workload, identical on both bases: a coordinator actor creates N children with
`createActor` (spawn phase, answered to the outside asker when done), then sends each child
one message; each child replies and the coordinator answers the asker once all N replies
are in (exchange phase, 2N messages). Each phase is one `ask` timed from outside.

Memory is measured on a separate system holding N idle children: the growth of
tracemalloc's traced bytes over N (precise, Python heap only) and, on another fresh system
without tracemalloc, the growth of the process RSS over N (what the OS sees; coarser).

See docs/dev/benchmarks.md for how to read the result.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs
from thespian.actors import Actor, ActorAddress, ActorSystem

from supervisors.gc_policy import NODE_GC_THRESHOLD
from supervisors.runtime import LoopSystemBase
from tests.bench.common import (
    GcMeter,
    Row,
    add_common_arguments,
    environment,
    int_list,
    median,
    report,
    rss_bytes,
)

NAME = "runtime"
_T = TypeVar("_T")

DEFAULT_NS = (10_000, 100_000)
DEFAULT_SIMPLE_N = 100_000
DEFAULT_REPEAT = 5
# simpleSystemBase is superlinear (its pending-send queue is a list popped from the front);
# past this many seconds its coordinator gives up and the measured time is a lower bound.
DEFAULT_SIMPLE_BUDGET_S = 60.0
# simpleSystemBase's bytes per idle actor (for comparison only) are measured on at most
# this many actors: under tracemalloc its spawn is slow, and the figure hardly moves with N.
SIMPLE_MEMORY_N_MAX = 20_000
# Our base must never hang the benchmark.
LOOP_ASK_TIMEOUT_S = 600.0

TARGET_SPEEDUP = 10.0
TARGET_BYTES_PER_IDLE_ACTOR = 1536  # 1.5 KiB
TARGET_PER_MSG_RATIO = 1.5

# The coordinator looks at the clock every this many children or replies (a power of 2).
_DEADLINE_CHECK_MASK = 1023


# -- the workload (the same classes run on both bases) -----------------------------------
class _Ping:
    __slots__ = ()


class _Pong:
    __slots__ = ()


PING = _Ping()
PONG = _Pong()


@attrs.frozen
class Spawn:
    """Create `n` children; give up at `deadline` (a `time.perf_counter` value)."""

    n: int
    deadline: float = math.inf


@attrs.frozen
class Exchange:
    """Send every child one message and answer when all have replied (or at `deadline`)."""

    deadline: float = math.inf


@attrs.frozen
class Done:
    count: int
    complete: bool


class Child(Actor):
    def receiveMessage(self, msg: Any, sender: ActorAddress) -> None:
        if msg is PING:
            self.send(sender, PONG)


class Coordinator(Actor):
    def __init__(self) -> None:
        super().__init__()
        self.children: list[ActorAddress] = []
        self.asker: ActorAddress | None = None
        self.expected = 0
        self.replies = 0
        self.deadline = math.inf

    def receiveMessage(self, msg: Any, sender: ActorAddress) -> None:
        if msg is PONG:
            self._on_reply()
        elif isinstance(msg, Spawn):
            self._spawn(msg, sender)
        elif isinstance(msg, Exchange):
            self.asker = sender
            self.expected = len(self.children)
            self.replies = 0
            self.deadline = msg.deadline
            if self.expected == 0:
                self._answer(True)
                return
            for child in self.children:
                self.send(child, PING)

    def _spawn(self, msg: Spawn, sender: ActorAddress) -> None:
        create = self.createActor
        children = self.children
        for i in range(msg.n):
            children.append(create(Child))
            if i & _DEADLINE_CHECK_MASK == 0 and time.perf_counter() > msg.deadline:
                self.send(sender, Done(len(children), False))
                return
        self.send(sender, Done(len(children), True))

    def _on_reply(self) -> None:
        if self.asker is None:
            return  # already answered (gave up at the deadline)
        self.replies += 1
        if self.replies == self.expected:
            self._answer(True)
        elif self.replies & _DEADLINE_CHECK_MASK == 0 and time.perf_counter() > self.deadline:
            self._answer(False)

    def _answer(self, complete: bool) -> None:
        asker, self.asker = self.asker, None
        if asker is not None:
            self.send(asker, Done(self.replies, complete))


# -- one run -----------------------------------------------------------------------------
@attrs.frozen
class Phase:
    """One timed phase: wall clock, this process's CPU time (which leaves out time other
    processes took the CPU, so it is steadier on a busy machine) and the part of the wall
    time the cyclic garbage collector ran."""

    wall_s: float
    cpu_s: float
    gc_s: float

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": self.wall_s, "cpu_s": self.cpu_s, "gc_s": self.gc_s}


class _Stopwatch:
    """Marks phase boundaries while a `GcMeter` runs."""

    def __init__(self, meter: GcMeter) -> None:
        self.meter = meter
        self._last = self._now()

    def _now(self) -> tuple[float, float, float]:
        return time.perf_counter(), time.process_time(), self.meter.seconds

    def lap(self) -> Phase:
        now = self._now()
        wall, cpu, gc_s = (b - a for a, b in zip(self._last, now, strict=True))
        self._last = now
        return Phase(wall, cpu, gc_s)


@attrs.frozen
class RunResult:
    n: int
    spawned: int
    replies: int
    complete: bool
    spawn: Phase
    exchange: Phase
    gc_collections: tuple[int, int, int]  # collections per generation over both phases

    @property
    def total_s(self) -> float:
        return self.spawn.wall_s + self.exchange.wall_s

    @property
    def messages(self) -> int:
        return 2 * self.replies

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "spawned": self.spawned,
            "replies": self.replies,
            "messages": self.messages,
            "complete": self.complete,
            "spawn": self.spawn.as_dict(),
            "exchange": self.exchange.as_dict(),
            "total_s": self.total_s,
            "gc_collections": list(self.gc_collections),
        }


def _per(total: float, count: int, scale: float = 1e6) -> float | None:
    return total / count * scale if count else None


def _summarise(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Medians over repeats (each metric on its own), and the raw runs."""
    n = runs[0].n
    messages = runs[0].messages
    spawn_s = median(r.spawn.wall_s for r in runs)
    exchange_s = median(r.exchange.wall_s for r in runs)
    total_s = median(r.total_s for r in runs)
    return {
        "n": n,
        "spawned": min(r.spawned for r in runs),
        "replies": min(r.replies for r in runs),
        "messages": messages,
        "complete": all(r.complete for r in runs),
        "repeats": len(runs),
        "spawn_s": spawn_s,
        "exchange_s": exchange_s,
        "total_s": total_s,
        "spawn_us_per_actor": _per(spawn_s, n),
        "us_per_message": _per(exchange_s, messages),
        "us_per_message_best": _per(min(r.exchange.wall_s for r in runs), messages),
        "us_per_message_cpu": _per(median(r.exchange.cpu_s for r in runs), messages),
        # the exchange without the garbage collector's pauses (a diagnostic)
        "us_per_message_excluding_gc": _per(
            median(r.exchange.wall_s - r.exchange.gc_s for r in runs), messages
        ),
        "spawn_gc_s": median(r.spawn.gc_s for r in runs),
        "exchange_gc_s": median(r.exchange.gc_s for r in runs),
        "total_gc_s": median(r.spawn.gc_s + r.exchange.gc_s for r in runs),
        "messages_per_second": messages / exchange_s if exchange_s > 0 else None,
        # spawns and messages together: what "spawn and exchange with each" costs
        "operations_per_second": (n + messages) / total_s if total_s > 0 else None,
        "runs": [r.as_dict() for r in runs],
    }


def _result(n: int, spawned: Done, done: Done, phases: list[Phase], meter: GcMeter) -> RunResult:
    young, middle_aged, old = meter.collections
    return RunResult(
        n=n,
        spawned=spawned.count,
        replies=done.count,
        complete=spawned.complete and done.complete,
        spawn=phases[0],
        exchange=phases[1],
        gc_collections=(young, middle_aged, old),
    )


async def _loop_run(n: int) -> RunResult:
    base = LoopSystemBase(asyncio.get_running_loop())
    asys = ActorSystem(systemBase=base, transientUnique=True)
    try:
        coordinator = asys.createActor(Coordinator)
        gc.collect()
        with GcMeter() as meter:
            watch = _Stopwatch(meter)
            spawned: Done = await base.ask(coordinator, Spawn(n), LOOP_ASK_TIMEOUT_S)
            phases = [watch.lap()]
            done: Done = await base.ask(coordinator, Exchange(), LOOP_ASK_TIMEOUT_S)
            phases.append(watch.lap())
    finally:
        asys.shutdown()
    return _result(n, spawned, done, phases, meter)


def _simple_run(n: int, budget_s: float) -> RunResult:
    asys = ActorSystem("simpleSystemBase", transientUnique=True, logDefs=False)
    try:
        coordinator = asys.createActor(Coordinator)
        gc.collect()
        with GcMeter() as meter:
            watch = _Stopwatch(meter)
            deadline = time.perf_counter() + budget_s
            # simpleSystemBase runs every actor inside `ask`, synchronously.
            spawned: Done = asys.ask(coordinator, Spawn(n, deadline), None)
            phases = [watch.lap()]
            done = Done(0, False)
            if spawned.complete:
                done = asys.ask(coordinator, Exchange(deadline), None)
            phases.append(watch.lap())
    finally:
        asys.shutdown()
    return _result(n, spawned, done, phases, meter)


# -- memory ------------------------------------------------------------------------------
def _measure_growth(use_tracemalloc: bool) -> Callable[[], int]:
    if use_tracemalloc:
        return lambda: tracemalloc.get_traced_memory()[0]
    return lambda: rss_bytes() or 0


async def _loop_idle_bytes(n: int, use_tracemalloc: bool) -> tuple[int, int]:
    """(bytes grown, children) for a fresh loop system holding `n` idle children."""
    measure = _measure_growth(use_tracemalloc)
    base = LoopSystemBase(asyncio.get_running_loop())
    asys = ActorSystem(systemBase=base, transientUnique=True)
    try:
        coordinator = asys.createActor(Coordinator)
        gc.collect()
        before = measure()
        spawned: Done = await base.ask(coordinator, Spawn(n), LOOP_ASK_TIMEOUT_S)
        gc.collect()
        after = measure()
    finally:
        asys.shutdown()
    return after - before, spawned.count


def _simple_idle_bytes(n: int, budget_s: float) -> tuple[int, int]:
    asys = ActorSystem("simpleSystemBase", transientUnique=True, logDefs=False)
    try:
        coordinator = asys.createActor(Coordinator)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        spawned: Done = asys.ask(coordinator, Spawn(n, time.perf_counter() + budget_s), None)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        asys.shutdown()
    return after - before, spawned.count


def _with_tracemalloc(fn: Callable[[], _T]) -> _T:
    tracemalloc.start()
    try:
        return fn()
    finally:
        tracemalloc.stop()


# -- the benchmark -----------------------------------------------------------------------
def _progress(quiet: bool) -> Callable[[str], None]:
    def say(text: str) -> None:
        if not quiet:
            print(f"[bench.runtime] {text}", file=sys.stderr, flush=True)

    return say


def run_benchmark(
    ns: Sequence[int] = DEFAULT_NS,
    simple_n: int = DEFAULT_SIMPLE_N,
    *,
    repeat: int = DEFAULT_REPEAT,
    simple_budget_s: float = DEFAULT_SIMPLE_BUDGET_S,
    memory_n: int | None = None,
    gc_threshold: Sequence[int] | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run every measurement and return the result object (what `--json` prints).

    `gc_threshold`, if given, is passed to `gc.set_threshold` for the run (both bases) and
    restored afterwards: a way to try a collector setting the node would use.
    """
    previous_threshold = gc.get_threshold()
    if gc_threshold is not None:
        gc.set_threshold(*gc_threshold)
    try:
        return _run(
            ns,
            simple_n,
            repeat=repeat,
            simple_budget_s=simple_budget_s,
            memory_n=memory_n,
            say=_progress(quiet),
        )
    finally:
        gc.set_threshold(*previous_threshold)


def _run(
    ns: Sequence[int],
    simple_n: int,
    *,
    repeat: int,
    simple_budget_s: float,
    memory_n: int | None,
    say: Callable[[str], None],
) -> dict[str, Any]:
    ns = sorted(set(ns))
    memory_n = memory_n or max(ns)
    loop_ns = sorted(set(ns) | {simple_n})

    async def loop_suite() -> tuple[dict[int, list[RunResult]], dict[str, Any]]:
        await _loop_run(min(1000, *ns))  # warm-up: imports, caches, first allocations
        # RSS first, on a heap that earlier runs have not grown, then tracemalloc.
        say(f"loop base: idle memory, {memory_n} actors (RSS)")
        rss_growth, rss_count = await _loop_idle_bytes(memory_n, use_tracemalloc=False)
        say(f"loop base: idle memory, {memory_n} actors (tracemalloc)")
        tracemalloc.start()
        try:
            traced_growth, traced_count = await _loop_idle_bytes(memory_n, use_tracemalloc=True)
        finally:
            tracemalloc.stop()
        memory = {
            "n": memory_n,
            "spawned": traced_count,
            "tracemalloc_growth_bytes": traced_growth,
            "bytes_per_idle_actor": traced_growth / traced_count,
            "rss_growth_bytes": rss_growth,
            "rss_bytes_per_idle_actor": rss_growth / rss_count if rss_count else None,
        }
        # Interleaved (10k, 100k, 10k, 100k, ...) so drift in the machine's speed lands
        # on every N alike rather than on whichever ran last.
        runs: dict[int, list[RunResult]] = {n: [] for n in loop_ns}
        for i in range(repeat):
            say(f"loop base: {', '.join(map(str, loop_ns))} actors, round {i + 1}/{repeat}")
            for n in loop_ns:
                runs[n].append(await _loop_run(n))
        return runs, memory

    loop_runs, memory = asyncio.run(loop_suite())
    loop = {str(n): _summarise(runs) for n, runs in loop_runs.items()}

    say(f"simpleSystemBase: warm-up, then {simple_n} actors (budget {simple_budget_s:g} s)")
    _simple_run(min(200, simple_n), simple_budget_s)
    simple_run = _simple_run(simple_n, simple_budget_s)
    simple = _summarise([simple_run])
    simple_memory_n = min(simple_n, SIMPLE_MEMORY_N_MAX)
    say(f"simpleSystemBase: idle memory, {simple_memory_n} actors (tracemalloc)")
    simple_growth, simple_count = _with_tracemalloc(
        lambda: _simple_idle_bytes(simple_memory_n, simple_budget_s)
    )
    simple["memory_n"] = simple_memory_n
    simple["bytes_per_idle_actor"] = simple_growth / simple_count if simple_count else None

    # Speedup on the whole workload at the same N. If the simple base gave up at its
    # budget, its real time is longer than measured, so the ratio is a lower bound.
    ours = loop[str(simple_n)]
    speedup = simple_run.total_s / ours["total_s"]
    speedup_cpu = (simple_run.spawn.cpu_s + simple_run.exchange.cpu_s) / median(
        r.spawn.cpu_s + r.exchange.cpu_s for r in loop_runs[simple_n]
    )
    small, large = loop[str(ns[0])], loop[str(ns[-1])]

    def ratio(key: str) -> float | None:
        """`key` at the largest N over `key` at the smallest (None with a single N)."""
        if len(ns) < 2 or not small[key] or large[key] is None:
            return None
        return float(large[key] / small[key])

    per_msg_ratio = ratio("us_per_message")
    bytes_per_idle_actor = memory["bytes_per_idle_actor"]

    return {
        "benchmark": NAME,
        "environment": environment(),
        "params": {
            "n": ns,
            "simple_n": simple_n,
            "repeat": repeat,
            "simple_budget_s": simple_budget_s,
            "memory_n": memory_n,
            "gc_threshold": list(gc.get_threshold()),
        },
        "speedup_vs_simple_base": speedup,
        "speedup_is_lower_bound": not simple_run.complete,
        "speedup_at_n": simple_n,
        "speedup_vs_simple_base_cpu": speedup_cpu,
        "bytes_per_idle_actor": bytes_per_idle_actor,
        "rss_bytes_per_idle_actor": memory["rss_bytes_per_idle_actor"],
        "per_msg_ratio_100k_vs_10k": per_msg_ratio,
        "per_msg_ratio_ns": [ns[0], ns[-1]],
        # diagnostics: the same ratio on CPU time, and without the collector's pauses
        "per_msg_ratio_cpu": ratio("us_per_message_cpu"),
        "per_msg_ratio_excluding_gc": ratio("us_per_message_excluding_gc"),
        "per_spawn_ratio": ratio("spawn_us_per_actor"),
        "targets": {
            "speedup_vs_simple_base_min": TARGET_SPEEDUP,
            "bytes_per_idle_actor_max": TARGET_BYTES_PER_IDLE_ACTOR,
            "per_msg_ratio_max": TARGET_PER_MSG_RATIO,
        },
        "targets_met": {
            "speedup_vs_simple_base": speedup >= TARGET_SPEEDUP,
            "bytes_per_idle_actor": bytes_per_idle_actor <= TARGET_BYTES_PER_IDLE_ACTOR,
            "per_msg_ratio": per_msg_ratio is not None and per_msg_ratio <= TARGET_PER_MSG_RATIO,
        },
        "loop_base": loop,
        "simple_base": simple,
        "memory": memory,
    }


# -- reporting ---------------------------------------------------------------------------
def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def table_rows(result: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for key, run in result["loop_base"].items():
        n = int(key)
        done = "" if run["complete"] else " (incomplete)"
        rows += [
            Row(f"loop: spawn {n:,} actors", f"{run['spawn_s']:.3f} s{done}"),
            Row(f"loop: exchange {run['messages']:,} msgs", f"{run['exchange_s']:.3f} s"),
            Row(f"loop: spawn + exchange, {n:,}", f"{run['total_s']:.3f} s"),
            Row(f"loop: messages/s, {n:,}", _fmt(run["messages_per_second"], ",.0f")),
            Row(f"loop: time per message, {n:,}", f"{_fmt(run['us_per_message'], '.2f')} us"),
            Row(
                f"loop: time per message without GC, {n:,}",
                f"{_fmt(run['us_per_message_excluding_gc'], '.2f')} us",
            ),
            Row(f"loop: time per spawn, {n:,}", f"{run['spawn_us_per_actor']:.2f} us"),
            Row(
                f"loop: GC pauses in spawn + exchange, {n:,}",
                f"{run['total_gc_s']:.3f} s",
            ),
        ]
    simple = result["simple_base"]
    n = simple["n"]
    cut = "" if simple["complete"] else " (gave up at budget)"
    rows += [
        Row(
            f"simple: spawn {n:,} actors",
            f"{simple['spawn_s']:.3f} s"
            + ("" if simple["spawned"] == n else f" (only {simple['spawned']:,}, gave up)"),
        ),
        Row(
            f"simple: exchange {simple['messages']:,} msgs",
            f"{simple['exchange_s']:.3f} s{cut}",
        ),
        Row(f"simple: spawn + exchange, {n:,}", f"{simple['total_s']:.3f} s{cut}"),
        Row(f"simple: messages/s, {n:,}", _fmt(simple["messages_per_second"], ",.0f")),
        Row(
            f"simple: bytes per idle actor, {simple['memory_n']:,}",
            _fmt(simple["bytes_per_idle_actor"], ",.0f"),
        ),
    ]
    met = result["targets_met"]
    bound = ">= " if result["speedup_is_lower_bound"] else ""
    memory = result["memory"]
    small, large = result["per_msg_ratio_ns"]
    rows += [
        Row(
            f"speedup vs simpleSystemBase, {result['speedup_at_n']:,}",
            f"{bound}{result['speedup_vs_simple_base']:.1f}x",
            f">= {TARGET_SPEEDUP:g}x",
            met["speedup_vs_simple_base"],
        ),
        Row(
            f"bytes per idle actor, {memory['n']:,} (tracemalloc)",
            f"{result['bytes_per_idle_actor']:,.0f}",
            f"<= {TARGET_BYTES_PER_IDLE_ACTOR:,}",
            met["bytes_per_idle_actor"],
        ),
        Row(
            f"bytes per idle actor, {memory['n']:,} (RSS)",
            _fmt(result["rss_bytes_per_idle_actor"], ",.0f"),
        ),
        Row(
            f"time per message, {large:,} / {small:,}",
            _fmt(result["per_msg_ratio_100k_vs_10k"], ".2f"),
            f"<= {TARGET_PER_MSG_RATIO:g}",
            met["per_msg_ratio"],
        ),
        Row(
            f"time per message without GC, {large:,} / {small:,}",
            _fmt(result["per_msg_ratio_excluding_gc"], ".2f"),
        ),
        Row(
            f"time per spawn, {large:,} / {small:,}",
            _fmt(result["per_spawn_ratio"], ".2f"),
        ),
    ]
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.runtime",
        description="Spawn N actors and exchange one message with each, on the loop "
        "system base and on thespian's simpleSystemBase.",
    )
    parser.add_argument(
        "--n",
        type=int_list,
        default=list(DEFAULT_NS),
        help="actor counts for the loop base, comma-separated (default 10000,100000); "
        "the time-per-message ratio compares the largest with the smallest",
    )
    parser.add_argument(
        "--simple-n",
        type=int,
        default=DEFAULT_SIMPLE_N,
        help="actor count for the simpleSystemBase comparison (default 100000)",
    )
    parser.add_argument(
        "--simple-budget",
        type=float,
        default=DEFAULT_SIMPLE_BUDGET_S,
        help="seconds after which the simpleSystemBase run stops and reports what it "
        "measured; the speedup is then a lower bound (default 60)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        help="runs per N on the loop base; medians are reported (default 5)",
    )
    parser.add_argument(
        "--gc-threshold",
        type=int_list,
        default=list(NODE_GC_THRESHOLD),
        metavar="T0[,T1[,T2]]",
        help="gc.set_threshold for the run; default: the node's own (supervisors.gc_policy),"
        " so the benchmark measures what production runs; 700,10,10 is the interpreter's",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    if args.simple_n <= 0 or args.repeat <= 0 or args.simple_budget <= 0:
        parser.error("--simple-n, --repeat and --simple-budget must be positive")

    result = run_benchmark(
        args.n,
        args.simple_n,
        repeat=args.repeat,
        simple_budget_s=args.simple_budget,
        gc_threshold=args.gc_threshold,
        quiet=args.quiet,
    )
    report(result, table_rows(result), args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
