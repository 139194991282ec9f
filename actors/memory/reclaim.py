"""`mem_reclaim`: gives memory back to the OS after the agent count drops (the actor around
actors/core/reclaim.py; seed, "Giving memory back after a drop", "Which builds trim", "What a
pass logs and costs"; SPEC_INDEX MR-01..MR-05).

Every `interval_ms` (`ReclaimArgs`: the `mem_reclaim` settings, built by
gateway/node/children/memory.py) it reads the agent count (the size of the registry's `agents`
table, no message) and performs what the core answers:

- a pass: `gc.collect()` (the Erlang gateway collects each process above gc_min_bytes; Python has
  one heap, so one full collection), then `malloc_trim(0)` in a worker thread (ctypes releases
  the GIL, so the loop keeps serving while glibc walks its arenas: the seed's "on a dirty
  scheduler"), then ONE notice line with the count, what was collected, the trim's outcome and
  RssAnon before and after;
- a periodic trim: `malloc_trim(0)` alone, logged at debug.

It also reads the memory shedder's verdict (its `memory_shedder` table, no message): while the
node sheds, a pass runs at once and then whenever none has run for `followup_ms`, so the
RssAnon the shedder samples falls with memory in use and the node can leave shedding without
an agent-count drop (issue 21 §2). These passes are this gateway's own: the seed's
mem_reclaim runs only after a drop.

`malloc_trim` exists only in glibc. Where it does not (musl, the Alpine image; macOS; Windows) the
first pass logs `gateway memory reclaim: malloc_trim unavailable (...); garbage collection only`
and there is no periodic trim. There is no metric (the seed has none). It runs in its own actor,
never on an agent's call path; a collection still holds the interpreter while it runs, as every
automatic collection does.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from thespian.actors import WakeupMessage

from actors.core.reclaim import Reclaim, ReclaimPolicy, RunPass, RunTrim
from actors.memory.api import RECLAIM_LOGGER, shedding_now
from actors.registry.api import AGENTS_TABLE
from supervisors.errors import TableGone
from supervisors.messages import WorkerDone
from supervisors.process import Process

if TYPE_CHECKING:
    from supervisors.address import Address
    from supervisors.runtime import LoopSystemBase

__all__ = ["MemReclaimActor", "ReclaimArgs", "agent_count", "load_malloc_trim"]

log = logging.getLogger(RECLAIM_LOGGER)

_TICK = "mem_reclaim_tick"
_PERIODIC_TRIM = "mem_reclaim_trim"

Trim = Callable[[], int]


@attrs.frozen(eq=False)
class ReclaimArgs:
    """The `mem_reclaim` settings, and where RssAnon is read."""

    interval_ms: int
    followup_ms: int
    # 0: no periodic trim.
    trim_interval_ms: int
    # RssAnon in kB now, or None when it cannot be read.
    rss_anon_kb: Callable[[], int | None]


def load_malloc_trim() -> tuple[Trim | None, str]:
    """`malloc_trim(0)` of the process's C library, or None and why it is not there."""
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):
        return None, f"no C library handle on {sys.platform}"
    function = getattr(libc, "malloc_trim", None)
    if function is None:
        return None, f"the C library on {sys.platform} has none (not glibc)"
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return lambda: int(function(0)), ""


def agent_count(runtime: LoopSystemBase) -> int | None:
    """Sessions the registry holds; None while it has no table (restarting)."""
    table = runtime.table(AGENTS_TABLE)
    if table is None:
        return None
    try:
        return len(table)
    except TableGone:
        return None


@attrs.frozen
class _Pass:
    """A pass waiting for its trim: what its notice line needs."""

    kind: str
    agents: int
    gc_objects: int
    rss_before: int | None
    started: float  # perf_counter


def _kb(value: int | None) -> str:
    return "undefined" if value is None else str(value)


class MemReclaimActor(Process):
    def init(self, args: ReclaimArgs) -> None:
        self.rss_anon_kb = args.rss_anon_kb
        self.trim, self.trim_missing = load_malloc_trim()
        # Without malloc_trim there is nothing to do between passes.
        periodic = args.trim_interval_ms if self.trim is not None else 0
        policy = ReclaimPolicy(
            followup_s=args.followup_ms / 1000,
            trim_interval_s=periodic / 1000 if periodic else None,
        )
        self.core = Reclaim.started(policy, self.now())
        self.interval_s = args.interval_ms / 1000
        self.passes = 0
        self.wakeupAfter(self.interval_s, _TICK)

    def format_status(self) -> Mapping[str, Any]:
        return {"peak": self.core.peak, "busy": self.core.busy, "passes": self.passes}

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case WakeupMessage(payload=payload) if payload == _TICK:
                self._on_tick()
            case WorkerDone(tag=_Pass() as tag):
                self._end_pass(tag, self._trim_outcome(msg))
            case WorkerDone(tag=tag) if tag == _PERIODIC_TRIM:
                log.debug("gateway memory reclaim: periodic trim: %s", self._trim_outcome(msg))
                self.core.finished()
            case _:
                pass

    def _on_tick(self) -> None:
        self.wakeupAfter(self.interval_s, _TICK)
        agents = agent_count(self.runtime)
        if agents is None:
            return
        for effect in self.core.observe(agents, self.now(), shedding_now(self.runtime)):
            match effect:
                case RunPass(kind=kind, agents=count):
                    self._start_pass(kind, count)
                case RunTrim() if self.trim is not None:
                    self.run_worker(asyncio.to_thread(self.trim), _PERIODIC_TRIM)

    def _start_pass(self, kind: str, agents: int) -> None:
        self.passes += 1
        started = time.perf_counter()
        before = self.rss_anon_kb()
        collected = gc.collect()
        tag = _Pass(kind, agents, collected, before, started)
        if self.trim is not None:
            self.run_worker(asyncio.to_thread(self.trim), tag)
            return
        if self.passes == 1:
            log.info(
                "gateway memory reclaim: malloc_trim unavailable (%s); garbage collection only",
                self.trim_missing,
            )
        self._end_pass(tag, "unavailable")

    @staticmethod
    def _trim_outcome(done: WorkerDone) -> str:
        # malloc_trim answers 1 when it gave memory back, 0 when there was nothing to give.
        if done.error is not None:
            return f"error_{type(done.error).__name__}"
        return "true" if done.result else "false"

    def _end_pass(self, tag: _Pass, trim: str) -> None:
        after = self.rss_anon_kb()
        log.info(
            "gateway memory reclaim: #{pass => %s, agents => %d, gc_objects => %d, trim => %s,"
            " rss_anon_kb_before => %s, rss_anon_kb_after => %s, ms => %d}",
            tag.kind,
            tag.agents,
            tag.gc_objects,
            trim,
            _kb(tag.rss_before),
            _kb(after),
            round((time.perf_counter() - tag.started) * 1000),
        )
        self.core.finished()
