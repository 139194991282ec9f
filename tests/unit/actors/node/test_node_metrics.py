"""The node gauges (actors/node/metrics.py) and their sampler (actors/node/gauges.py): memory by
kind from /proc/self/status (gateway/node/memory_reader.py) and the heartbeat buffer's status,
each named actor's mailbox, the garbage-collection pause histogram, and the sampler's cadence."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from actors.heartbeat.api import NAME as HEARTBEAT_BUFFER
from actors.node.api import GAUGES_NAME as NAME
from actors.node.gauges import NodeGauges
from actors.node.metrics import GC_PAUSE, MAILBOX, MEMORY, mailbox_lengths, node_metrics
from gateway.config.context import NodeContext
from gateway.config.keys import SCHEMA
from gateway.config.resolve import resolve_section
from gateway.config.terms import parse_term
from gateway.config.vm_args import CookieSource, NodeArgs
from gateway.node.children.gauges import gauges_args
from gateway.node.memory_reader import process_memory
from supervisors.process import Process
from supervisors.reason import SHUTDOWN
from tests.support.actors import Harness, Ping, actor_test

STATUS = """Name:\tpython
VmPeak:\t  900000 kB
VmRSS:\t   51200 kB
RssAnon:\t   40960 kB
RssFile:\t   10240 kB
"""


def write_status(tmp_path: Path, text: str = STATUS) -> Path:
    path = tmp_path / "status"
    path.write_text(text)
    return path


def sample_value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


class FakeBuffer(Process):
    """Stands for the heartbeat buffer actor: only its status matters here."""

    retained = 4096

    def format_status(self) -> Mapping[str, Any]:
        return {"sessions": 3, "bytes": self.retained}


def test_process_memory_reads_rss_and_anonymous_rss_in_bytes(tmp_path: Path) -> None:
    assert process_memory(write_status(tmp_path)) == {
        "rss": 51200 * 1024,
        "rss_anon": 40960 * 1024,
    }


def test_process_memory_is_empty_without_the_file_or_the_fields(tmp_path: Path) -> None:
    assert process_memory(tmp_path / "missing") == {}
    assert process_memory(write_status(tmp_path, "Name:\tpython\nVmRSS:\tlots kB\n")) == {}


def test_the_real_process_has_both_kinds() -> None:
    memory = process_memory()
    assert 0 < memory["rss_anon"] <= memory["rss"]


@actor_test
async def test_a_sample_sets_memory_and_mailboxes_and_drops_what_ended(
    h: Harness, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    metrics = node_metrics(registry)
    status = write_status(tmp_path)
    h.tell(h.spawn("unnamed"), Ping())  # an unnamed actor is never a series
    named = h.create(FakeBuffer, None, name=HEARTBEAT_BUFFER)
    for _ in range(3):
        h.tell(named, Ping())
    # Sampled before the loop runs: the three pings still wait in the mailbox.
    assert mailbox_lengths(h.base) == {"heartbeat_buffer": 3}
    metrics.sample(h.base, process_memory(status), HEARTBEAT_BUFFER)
    assert sample_value(registry, MAILBOX, actor="heartbeat_buffer") == 3
    assert sample_value(registry, MEMORY, type="rss") == 51200 * 1024
    assert sample_value(registry, MEMORY, type="rss_anon") == 40960 * 1024
    assert sample_value(registry, MEMORY, type="heartbeat_buffer") == 4096

    await h.settle()
    metrics.sample(h.base, process_memory(status), HEARTBEAT_BUFFER)
    assert sample_value(registry, MAILBOX, actor="heartbeat_buffer") == 0

    h.base.kill(named)
    metrics.sample(h.base, process_memory(tmp_path / "missing"), HEARTBEAT_BUFFER)
    # Nothing stale: an actor that is gone and a kind that cannot be read have no series.
    assert sample_value(registry, MAILBOX, actor="heartbeat_buffer") is None
    assert sample_value(registry, MEMORY, type="heartbeat_buffer") is None
    assert sample_value(registry, MEMORY, type="rss") is None


def test_gc_pauses_are_observed_per_generation_while_watched() -> None:
    registry = CollectorRegistry()
    metrics = node_metrics(registry)

    def count(generation: str) -> float:
        value = sample_value(registry, f"{GC_PAUSE}_count", generation=generation)
        assert value is not None  # every generation's series exists from the start
        return value

    assert [count(g) for g in ("0", "1", "2")] == [0, 0, 0]
    metrics.watch_gc()
    metrics.watch_gc()  # once per registry
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        metrics.unwatch_gc()
    assert count("2") == 1 and count("0") >= 1
    total = sample_value(registry, f"{GC_PAUSE}_sum", generation="2")
    assert total is not None and 0 < total < 5
    gc.collect(2)
    assert count("2") == 1  # no longer watched


def node_context(tmp_path: Path, interval_ms: int) -> NodeContext:
    config = resolve_section(
        SCHEMA,
        parse_term(
            f"[{{allow_no_listeners, true}}, {{telemetry_gauge_interval_ms, {interval_ms}}}]."
        ),
        {},
        "test",
    )
    node = NodeArgs("gw@127.0.0.1", "test", "x" * 32, CookieSource.ENV, (), "vm.args")
    return NodeContext(config, node, tmp_path, CollectorRegistry())


@actor_test
async def test_the_sampler_samples_every_interval_and_clears_when_it_ends(
    h: Harness, tmp_path: Path
) -> None:
    ctx = node_context(tmp_path, 100)
    sampler = h.create(NodeGauges, gauges_args(ctx), name=NAME)
    registry = ctx.registry
    # The first sample is taken at start.
    assert sample_value(registry, MAILBOX, actor=NAME) == 0
    assert (sample_value(registry, MEMORY, type="rss_anon") or 0) > 0
    assert h.instance(sampler).format_status() == {"interval_s": 0.1, "samples": 1}
    late = h.create(FakeBuffer, None, name=HEARTBEAT_BUFFER)
    await h.wait_until(
        lambda: sample_value(registry, MEMORY, type="heartbeat_buffer") == 4096,
        timeout=1.0,
        what="the next sample",
    )
    assert sample_value(registry, MAILBOX, actor="heartbeat_buffer") == 0
    h.base.kill(late)
    h.base.exit_actor(sampler, SHUTDOWN)
    assert sample_value(registry, MEMORY, type="rss") is None
    assert sample_value(registry, MAILBOX, actor=NAME) is None
    before = sample_value(registry, f"{GC_PAUSE}_count", generation="2")
    gc.collect(2)
    assert sample_value(registry, f"{GC_PAUSE}_count", generation="2") == before
