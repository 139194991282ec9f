"""docs/metrics.md carries the catalogue a node's registry renders (drift test), and the
catalogue accounts for every family the seed names (SPEC_INDEX section 5)."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.node.metrics_docs import (
    DOCS_PATH,
    NOT_YET_EXPORTED,
    RENAMED,
    SEED_FAMILIES,
    SUPERSEDED,
    Family,
    families,
    generated_block,
    node_families,
    replace_block,
)

# Label names that would carry one agent, one session or one peer: never a label (issue 10).
IDENTIFYING_LABELS = re.compile(r"agent|session|addr|peer|^ip$|host|port", re.IGNORECASE)


@pytest.fixture(scope="module")
def exported() -> list[Family]:
    return node_families()


def names(found: list[Family]) -> set[str]:
    return {f.name for f in found}


def test_docs_carry_the_rendered_catalogue(exported: list[Family]) -> None:
    document = DOCS_PATH.read_text(encoding="utf-8")
    assert generated_block(exported) in document, (
        "docs/metrics.md is stale: run `python -m gateway.node.metrics_docs --write`"
    )


def test_every_seed_family_is_exported_or_listed_as_not_yet(exported: list[Family]) -> None:
    present = names(exported)
    assert set(SEED_FAMILIES) <= present
    assert {new for new, _ in RENAMED.values()} <= present
    assert not set(RENAMED) & present
    # When the behaviour lands, its family must leave the "not yet" list (and the docs follow).
    assert not set(NOT_YET_EXPORTED) & present
    assert not set(SUPERSEDED) & present


def test_every_family_has_help_and_no_identifying_label(exported: list[Family]) -> None:
    assert len(exported) >= len(SEED_FAMILIES)
    for family in exported:
        assert family.help.strip(), family.name
        assert not [label for label in family.labels if IDENTIFYING_LABELS.search(label)], family


def test_families_read_labels_types_and_the_series_present_at_start() -> None:
    registry = CollectorRegistry()
    seeded = Counter("yuzu_gw_x", "Seeded.", ("reason",), registry=registry)
    seeded.labels("a")
    seeded.labels("b")
    Gauge("yuzu_gw_y", "No series yet.", ("role", "name"), registry=registry)
    Histogram("yuzu_gw_z_seconds", "A histogram.", registry=registry)
    Counter("other_total", "Not ours.", registry=registry)
    found = {f.name: f for f in families(registry)}
    assert set(found) == {"yuzu_gw_x_total", "yuzu_gw_y", "yuzu_gw_z_seconds"}
    x = found["yuzu_gw_x_total"]
    assert (x.type, x.labels, x.series_at_start) == ("counter", ("reason",), 2)
    assert x.values_at_start == (("reason", ("a", "b")),)
    y = found["yuzu_gw_y"]
    assert (y.labels, y.series_at_start) == (("role", "name"), 0)
    z = found["yuzu_gw_z_seconds"]
    assert z.series_names == {
        "yuzu_gw_z_seconds_bucket",
        "yuzu_gw_z_seconds_sum",
        "yuzu_gw_z_seconds_count",
    }
    assert z.series_at_start == 1


def test_replace_block_rewrites_only_the_block(exported: list[Family]) -> None:
    stale = generated_block(exported[:1])
    document = f"intro\n{stale}\noutro\n"
    assert replace_block(document, exported) == f"intro\n{generated_block(exported)}\noutro\n"


# The series the seed says exist at 0 from start (SPEC_INDEX section 5, "Pre-seeded 0").
SEED_PRESEEDED = {
    "yuzu_gw_heartbeat_rejected_total": {
        "reason": {"unknown_session", "no_connection", "registry_unavailable"}
    },
    "yuzu_gw_heartbeat_session_mismatch_total": {"event": {"security"}},
    "yuzu_gw_inventory_rejected_total": {
        "reason": {
            "unknown_session",
            "no_connection",
            "registry_unavailable",
            "connection_mismatch",
        }
    },
    "yuzu_gw_upstream_rpc_errors_total": {
        "code": {"encode", "exception"},
        "rpc_name": {"register", "inventory", "notify_stream", "guardian", "batch_heartbeat"},
    },
    "yuzu_gw_upstream_notify_dropped_total": {"reason": {"at_capacity", "unknown"}},
    "yuzu_gw_grpc_origin_ignored_total": {
        "mode": {"proxy_protocol", "forwarded_for"},
        "reason": {"untrusted_source", "no_claim", "bad_claim"},
    },
    "yuzu_gw_mgmt_pin_rotated_timestamp_seconds": {},
}


def test_the_series_the_seed_pre_seeds_exist_at_start(exported: list[Family]) -> None:
    by_name = {f.name: f for f in exported}
    for name, labels in SEED_PRESEEDED.items():
        family = by_name[name]
        assert family.series_at_start > 0, name
        present = dict(family.values_at_start)
        for label, values in labels.items():
            assert values <= set(present[label]), (name, label)
