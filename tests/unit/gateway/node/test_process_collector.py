"""The gateway's process collector (gateway/node/process_collector.py): the library's families, with
the open-descriptor count read from the size of /proc/self/fd instead of a listing."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry

from gateway.node import process_collector
from gateway.node.boot import node_registry
from gateway.node.process_collector import ProcessCollector, open_fds

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")


def samples(collector: Any) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)
    return {s.name: s.value for m in registry.collect() for s in m.samples}


def test_the_families_are_the_librarys_and_the_count_follows_open_sockets() -> None:
    library = samples(prometheus_client.ProcessCollector(registry=None))
    ours = samples(ProcessCollector(registry=None))
    assert sorted(ours) == sorted(library)
    assert ours["process_max_fds"] == library["process_max_fds"]
    # The library's listing counts the descriptor of the directory it lists.
    assert (
        library["process_open_fds"] - 1 <= ours["process_open_fds"] <= library["process_open_fds"]
    )
    held = [socket.socket() for _ in range(50)]
    try:
        assert samples(ProcessCollector(registry=None))["process_open_fds"] >= (
            ours["process_open_fds"] + 50
        )
    finally:
        for sock in held:
            sock.close()


def test_a_kernel_that_reports_no_size_gets_the_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    real_stat = os.stat

    def sizeless(path: str) -> Any:
        return os.stat_result((*real_stat(path)[:6], 0, *real_stat(path)[7:]))

    listed = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(process_collector.os, "stat", sizeless)
    assert open_fds("/proc/self/fd") in (listed - 1, listed, listed + 1)


def test_every_node_registry_uses_it() -> None:
    collectors = node_registry()._collector_to_names
    assert any(type(c) is ProcessCollector for c in collectors)
    assert not any(type(c) is prometheus_client.ProcessCollector for c in collectors)
