"""The node gauges: what the whole process holds, sampled by the `node_gauges` actor every
`telemetry_gauge_interval_ms` (actors/node/gauges.py, the Erlang gateway's yuzu_gw_gauge), and
the interpreter's garbage-collection pauses. The names are this rebuild's; the seed names only
`yuzu_gw_beam_memory_bytes{type}` (SPEC_INDEX M43), which has no BEAM to describe here.

- `yuzu_gw_process_memory_bytes{type}`, the Python analogue of `yuzu_gw_beam_memory_bytes`:
  - `rss`: `VmRSS` of /proc/self/status, every resident page (code and libraries included);
  - `rss_anon`: `RssAnon`, the resident anonymous pages (pymalloc's arenas, malloc's heaps,
    OpenSSL's and grpc's buffers): the figure the memory shedder compares with its marks
    (both read by gateway/node/memory_reader.py, which the sampler is given);
  - `heartbeat_buffer`: the encoded heartbeat bytes the buffer retains, the bound of
    `max_heartbeat_buffer_bytes`, read from the buffer actor's status (the console's view; the
    sampler is given the actor's name, so the node feature, which every feature reads, reads
    none of theirs).
  A kind that cannot be read (off Linux, the buffer actor restarting) has no series at that
  sample. Not reported, because no cheap measure exists: the Python heap in use (pymalloc has no
  byte count; `sys.getallocatedblocks()` counts blocks of 8 to 512 bytes), glibc's
  `mallinfo2()` (it walks every free chunk: 22 ms on a fragmented heap, a loop stall every
  sample), and the node's tables (only their hash tables have a size; the rows are shared
  objects a walk would have to visit one by one).
- `yuzu_gw_actor_mailbox_messages{actor}`: messages waiting in each named actor's mailbox
  (Erlang's `message_queue_len` of the registered processes). Only the tree's named actors
  carry a name; agent owners never do, so no agent or session id can become a label. An actor
  not running at a sample has no series.
- `yuzu_gw_gc_pause_seconds{generation}`: a histogram of every collection's duration, timed by a
  `gc.callbacks` hook (two clock reads and one observation a collection; the node's thresholds
  make collections rare, supervisors/gc_policy.py). Series of generations 0, 1, 2 exist from
  start. The hook is process-wide: two nodes in one test process each see every collection.

Agents current and the connected total are the agent plane's (gateway/agent/metrics.py), read
at scrape time; the loop lag and stalls are the loop monitor's (gateway/node/loop_monitor.py).

One `NodeMetrics` per registry, so a restarted sampler finds its families again.
"""

from __future__ import annotations

import contextlib
import gc
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
from prometheus_client import CollectorRegistry, Gauge, Histogram

from supervisors import introspection
from supervisors.runtime import LoopSystemBase

__all__ = [
    "GC_GENERATIONS",
    "GC_PAUSE",
    "GC_PAUSE_BUCKETS",
    "MAILBOX",
    "MEMORY",
    "RSS",
    "RSS_ANON",
    "NodeMetrics",
    "heartbeat_buffer_bytes",
    "mailbox_lengths",
    "node_metrics",
]

MEMORY: Final = "yuzu_gw_process_memory_bytes"
MAILBOX: Final = "yuzu_gw_actor_mailbox_messages"
GC_PAUSE: Final = "yuzu_gw_gc_pause_seconds"

# The `type` values: two read from /proc/self/status (the sampler is given them), one from the
# buffer.
RSS, RSS_ANON, HEARTBEAT_BUFFER = "rss", "rss_anon", "heartbeat_buffer"
# The heartbeat buffer's status key for the retained bytes (actors/core/heartbeat_buffer.py
# BufferStatus.bytes, which its format_status carries).
_BUFFER_BYTES: Final = "bytes"

GC_GENERATIONS: Final = ("0", "1", "2")
# From a young collection (tens of microseconds) to a full one of a large heap (seconds).
GC_PAUSE_BUCKETS: Final = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


def heartbeat_buffer_bytes(runtime: LoopSystemBase, buffer: str) -> int | None:
    """The retained bytes from the status of the buffer actor registered as `buffer`; None while
    none runs."""
    try:
        value = introspection.status(runtime, buffer).get(_BUFFER_BYTES)
    except LookupError:
        return None
    return value if isinstance(value, int) else None


def mailbox_lengths(runtime: LoopSystemBase) -> dict[str, int]:
    """Messages waiting for each registered actor, by name."""
    lengths: dict[str, int] = {}
    for name, address in runtime.registered().items():
        length = runtime.mailbox_len(address)
        if length is not None:
            lengths[name] = length
    return lengths


def _set_all(gauge: Gauge, values: Mapping[str, float], previous: set[str]) -> set[str]:
    """Set one series per key; remove the series of keys no longer present."""
    for key, value in values.items():
        gauge.labels(key).set(value)
    for gone in previous - values.keys():
        with contextlib.suppress(KeyError):
            gauge.remove(gone)
    return set(values)


@attrs.define(eq=False)
class NodeMetrics:
    memory: Gauge
    mailbox: Gauge
    gc_pause: Histogram
    _memory_types: set[str] = attrs.field(factory=set)
    _actors: set[str] = attrs.field(factory=set)
    _gc_hook: Callable[[str, dict[str, Any]], None] | None = None

    def sample(self, runtime: LoopSystemBase, process: Mapping[str, int], buffer: str) -> None:
        """One sample of the memory kinds (`process`: the kinds read from the process, in bytes;
        `buffer`: the heartbeat buffer's registered name) and the mailboxes (reads only, no
        message)."""
        memory: dict[str, float] = dict(process)
        buffered = heartbeat_buffer_bytes(runtime, buffer)
        if buffered is not None:
            memory[HEARTBEAT_BUFFER] = buffered
        self._memory_types = _set_all(self.memory, memory, self._memory_types)
        self._actors = _set_all(self.mailbox, mailbox_lengths(runtime), self._actors)

    def clear(self) -> None:
        """No sampler runs: no series (an absent series is never a stale value)."""
        self._memory_types = _set_all(self.memory, {}, self._memory_types)
        self._actors = _set_all(self.mailbox, {}, self._actors)

    def watch_gc(self) -> None:
        """Time every collection from now on (once per registry, however often called)."""
        if self._gc_hook is not None:
            return
        by_generation = {int(g): self.gc_pause.labels(g).observe for g in GC_GENERATIONS}
        started = [0.0]
        clock = time.perf_counter

        # `observe` holds a child's lock only around float arithmetic, which allocates nothing
        # the collector tracks, so no collection can start while this thread holds that lock.
        def hook(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[0] = clock()
            else:
                by_generation[info["generation"]](clock() - started[0])

        gc.callbacks.append(hook)
        self._gc_hook = hook

    def unwatch_gc(self) -> None:
        hook, self._gc_hook = self._gc_hook, None
        if hook is not None:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(hook)


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, NodeMetrics] = (
    weakref.WeakKeyDictionary()
)


def _create(registry: CollectorRegistry) -> NodeMetrics:
    metrics = NodeMetrics(
        memory=Gauge(
            MEMORY,
            "Process memory by kind in bytes: rss (VmRSS), rss_anon (RssAnon, the shedder's"
            " measure), heartbeat_buffer (encoded heartbeats the buffer retains).",
            ("type",),
            registry=registry,
        ),
        mailbox=Gauge(
            MAILBOX,
            "Messages waiting in each named actor's mailbox, by the actor's registered name.",
            ("actor",),
            registry=registry,
        ),
        gc_pause=Histogram(
            GC_PAUSE,
            "Duration of each garbage collection, by the generation collected.",
            ("generation",),
            buckets=GC_PAUSE_BUCKETS,
            registry=registry,
        ),
    )
    for generation in GC_GENERATIONS:
        metrics.gc_pause.labels(generation)
    return metrics


def node_metrics(registry: CollectorRegistry) -> NodeMetrics:
    """The node families of `registry`, created on first use."""
    metrics = _BY_REGISTRY.get(registry)
    if metrics is None:
        metrics = _BY_REGISTRY[registry] = _create(registry)
    return metrics
