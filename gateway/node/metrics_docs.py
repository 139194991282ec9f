"""The metrics catalogue of docs/metrics.md, rendered from the families a node registers.

    python -m gateway.node.metrics_docs            print the generated block
    python -m gateway.node.metrics_docs --write    replace it in docs/metrics.md

The families are read from a real node's registry: `node_families` boots one in this process
(sys_config/test.config: free ports, no upstream channel) and reads the registry right after the
tree has started, before any message or timer ran, so the series present at start are the same
on every run. The block sits between two marker comments; a test fails when the file's block
differs from what the registry renders, so the catalogue cannot drift from the code.

The families the manual names are marked in the catalogue, with those exported under another
name and those never exported.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

import attrs
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from gateway.config.loader import PROJECT_ROOT
from gateway.node.boot import prepare
from gateway.node.node import Node

__all__ = [
    "BEGIN_MARKER",
    "DOCS_PATH",
    "END_MARKER",
    "NOT_YET_EXPORTED",
    "PREFIX",
    "RENAMED",
    "SEED_FAMILIES",
    "Family",
    "families",
    "generated_block",
    "node_families",
    "render_catalogue",
    "replace_block",
]

BEGIN_MARKER: Final = (
    "<!-- BEGIN generated: metrics catalogue (python -m gateway.node.metrics_docs --write) -->"
)
END_MARKER: Final = "<!-- END generated: metrics catalogue -->"
DOCS_PATH: Final = PROJECT_ROOT / "docs" / "metrics.md"
BOOT_CONFIG: Final = PROJECT_ROOT / "sys_config" / "test.config"
BOOT_VM_ARGS: Final = PROJECT_ROOT / "sys_config" / "vm.args"
PREFIX: Final = "yuzu_gw_"

# The families the manual names ("Prometheus Metrics" and the sections of the features they
# measure); every other family is this gateway's own.
SEED_FAMILIES: Final[frozenset[str]] = frozenset(
    {
        "yuzu_gw_heartbeat_coalesced_total",
        "yuzu_gw_heartbeat_buffer_dropped_total",
        "yuzu_gw_heartbeat_rejected_total",
        "yuzu_gw_heartbeat_session_mismatch_total",
        "yuzu_gw_inventory_rejected_total",
        "yuzu_gw_agents_current",
        "yuzu_gw_agents_connected_total",
        "yuzu_gw_register_refused_total",
        "yuzu_gw_upstream_permit_refused_total",
        "yuzu_gw_upstream_calls_dropped_total",
        "yuzu_gw_upstream_permit_wait_seconds",
        "yuzu_gw_upstream_permits_held",
        "yuzu_gw_upstream_permits_waiting",
        "yuzu_gw_upstream_server_max_streams",
        "yuzu_gw_upstream_permit_limit",
        "yuzu_gw_upstream_rpc_errors_total",
        "yuzu_gw_upstream_tls_handshake_failures_total",
        "yuzu_gw_upstream_slow",
        "yuzu_gw_upstream_notify_pending",
        "yuzu_gw_upstream_notify_inflight",
        "yuzu_gw_upstream_notify_pending_hwm",
        "yuzu_gw_upstream_notify_pending_max",
        "yuzu_gw_upstream_notify_coalesced_total",
        "yuzu_gw_upstream_notify_requeued_total",
        "yuzu_gw_upstream_notify_dropped_total",
        "yuzu_gw_upstream_notify_lost_total",
        "yuzu_gw_upstream_notify_unacknowledged_total",
        "yuzu_gw_upstream_notify_unacked_keys",
        "yuzu_gw_upstream_notify_unacked_slow_keys",
        "yuzu_gw_upstream_notify_unacked_ended_total",
        "yuzu_gw_registration_replay_triggered_total",
        "yuzu_gw_registration_replay_total",
        "yuzu_gw_registration_replay_queue_depth",
        "yuzu_gw_heartbeat_verdict_dropped_total",
        "yuzu_gw_heartbeat_unknown_truncated_total",
        "yuzu_gw_memory_shedding_active",
        "yuzu_gw_memory_shedding_suspensions_total",
        "yuzu_gw_memory_shedding_transition_failures_total",
        "yuzu_gw_memory_shedding_transition_failing",
        "yuzu_gw_memory_shedding_high_water_bytes",
        "yuzu_gw_memory_shedding_low_water_bytes",
        "yuzu_gw_memory_shedding_inactive",
        "yuzu_gw_process_memory_bytes",
        "yuzu_gw_grpc_connection_killed_total",
        "yuzu_gw_grpc_recv_timeout_total",
        "yuzu_gw_grpc_origin_ignored_total",
        "yuzu_gw_grpc_dropped_data_bytes_total",
        "yuzu_gw_mgmt_auth_rejected_total",
        "yuzu_gw_mgmt_auth_admitted_total",
        "yuzu_gw_mgmt_auth_pin_unresolved_total",
        "yuzu_gw_mgmt_pin_rotated_timestamp_seconds",
        "yuzu_gw_cert_expiry_timestamp_seconds",
        "yuzu_gw_cert_file_readable",
        "yuzu_gw_agent_owner_restarts_total",
        "yuzu_gw_cluster_peers_resolved",
        "yuzu_gw_cluster_peers_connected",
    }
)
# Names of the manual this gateway exports under another name, and why.
RENAMED: Final[Mapping[str, tuple[str, str]]] = {
    "yuzu_gw_beam_memory_bytes": (
        "yuzu_gw_process_memory_bytes",
        "there is no BEAM: the process's memory by kind (actors/node/metrics.py)",
    ),
}
# Families the manual names whose behaviour does not exist yet: (ref, what brings it).
NOT_YET_EXPORTED: Final[Mapping[str, tuple[str, str]]] = {}
# Families whose label values name the running build (they differ between machines).
BUILD_LABELS: Final[frozenset[str]] = frozenset({"yuzu_gw_build_info"})
# Named by the manual as planned and superseded; never to be exported.
SUPERSEDED: Final[Mapping[str, str]] = {
    "yuzu_gw_cluster_nodes": "superseded by yuzu_gw_cluster_peers_connected (size = it + 1)",
}


@attrs.frozen
class Family:
    """One metric family as a scrape shows it."""

    name: str  # the exposition name: a counter's ends in _total
    type: str
    labels: tuple[str, ...]
    help: str
    # The label values of the series present at start, per label (empty: no series).
    values_at_start: tuple[tuple[str, tuple[str, ...]], ...]
    series_at_start: int

    @property
    def series_names(self) -> frozenset[str]:
        """The sample names a scrape carries (what a PromQL selector names)."""
        if self.type == "histogram":
            return frozenset(f"{self.name}{s}" for s in ("_bucket", "_sum", "_count"))
        if self.type == "summary":
            return frozenset({self.name, f"{self.name}_sum", f"{self.name}_count"})
        return frozenset({self.name})


def _exposition_name(name: str, kind: str) -> str:
    return f"{name}_total" if kind == "counter" else name


# The sample of a family that stands for one series (a counter's _created and a histogram's
# buckets repeat each series).
_SERIES_SUFFIX: Final = {"counter": "_total", "histogram": "_count", "summary": "_count"}


def _family(
    name: str, kind: str, labels: Iterable[str], doc: str, samples: Iterable[object]
) -> Family:
    suffix = _SERIES_SUFFIX.get(kind, "")
    series = [
        s.labels  # type: ignore[attr-defined]
        for s in samples
        if s.name == name + suffix  # type: ignore[attr-defined]
    ]
    label_names = tuple(labels)
    values = tuple((label, tuple(sorted({s[label] for s in series}))) for label in label_names)
    return Family(_exposition_name(name, kind), kind, label_names, doc, values, len(series))


def _from_collector(collector: Collector) -> Iterator[Family]:
    if isinstance(collector, MetricWrapperBase):
        # A wrapper keeps its label names even while it has no series.
        wrapper = collector
        for metric in wrapper.collect():
            yield _family(
                metric.name,
                metric.type,
                wrapper._labelnames,  # no public accessor
                metric.documentation,
                metric.samples,
            )
        return
    for metric in collector.collect():
        labels = getattr(metric, "_labelnames", None)
        if labels is None:
            labels = sorted({k for s in metric.samples for k in s.labels if k != "le"})
        yield _family(metric.name, metric.type, labels, metric.documentation, metric.samples)


def families(registry: CollectorRegistry, prefix: str = PREFIX) -> list[Family]:
    """The registry's families whose name starts with `prefix`, by name."""
    # prometheus-client offers no public list of a registry's collectors.
    collectors = list(registry._collector_to_names)
    found = [f for c in collectors for f in _from_collector(c) if f.name.startswith(prefix)]
    return sorted(found, key=lambda f: f.name)


async def _boot_and_read() -> list[Family]:
    with tempfile.TemporaryDirectory(prefix="yuzu-gw-metrics-docs-") as run_dir:
        env = {
            "YUZU_GW_CONFIG": str(BOOT_CONFIG),
            "YUZU_GW_VM_ARGS": str(BOOT_VM_ARGS),
            "YUZU_GW_COOKIE": secrets.token_hex(32),
            "YUZU_GW_RUN_DIR": run_dir,
        }
        node = Node(prepare(env))
        await node.start()
        try:
            # Read before anything else runs on the loop: what every node has at start.
            return families(node.ctx.registry)
        finally:
            await node.stop()


def node_families() -> list[Family]:
    """Boot a node in this process (a loop of its own), read its families, stop it."""
    return asyncio.run(_boot_and_read())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _at_start(family: Family) -> str:
    if family.series_at_start == 0:
        return "none"
    if not family.labels:
        return "yes"
    if family.name in BUILD_LABELS:
        return f"{family.series_at_start}: the running build's"
    values = "; ".join(f"`{label}`: {', '.join(v)}" for label, v in family.values_at_start)
    return f"{family.series_at_start}: {values}"


def _seed_ref(name: str) -> str:
    return "yes" if name in SEED_FAMILIES else "ours"


def render_catalogue(found: Iterable[Family]) -> str:
    found = list(found)
    lines = [
        f"{len(found)} families. *Series at start*: the series a node has as soon as its tree"
        " has started (none: the first event or sample creates them).",
        "",
        "| Family | Type | Labels | Series at start | In the manual | Help |",
        "|---|---|---|---|---|---|",
    ]
    for f in found:
        labels = ", ".join(f"`{label}`" for label in f.labels) or "—"
        cells = (f"`{f.name}`", f.type, labels, _at_start(f), _seed_ref(f.name), f.help)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += ["", "Families the manual names, exported under another name:", ""]
    lines += [f"- `{old}`: `{new}` ({why})." for old, (new, why) in RENAMED.items()]
    lines += ["", "Not yet exported (the behaviour behind them does not exist yet):", ""]
    lines += [f"- `{n}` ({ref}): {what}." for n, (ref, what) in NOT_YET_EXPORTED.items()] or [
        "- none."
    ]
    lines += ["", "Never exported:", ""]
    lines += [f"- `{n}`: {why}." for n, why in SUPERSEDED.items()]
    return "\n".join(lines) + "\n"


def generated_block(found: Iterable[Family]) -> str:
    return f"{BEGIN_MARKER}\n{render_catalogue(found)}{END_MARKER}"


def replace_block(document: str, found: Iterable[Family]) -> str:
    start = document.index(BEGIN_MARKER)
    end = document.index(END_MARKER) + len(END_MARKER)
    return document[:start] + generated_block(found) + document[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"update {DOCS_PATH}")
    args = parser.parse_args(argv)
    # The node's boot lines are not the output.
    logging.disable(logging.CRITICAL)
    found = node_families()
    if args.write:
        document = DOCS_PATH.read_text(encoding="utf-8")
        DOCS_PATH.write_text(replace_block(document, found), "utf-8")
    else:
        sys.stdout.write(generated_block(found) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
