"""Keys of the cluster: its logical identity and how nodes find each other."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import HostList, HostName, IntRange, Utf8Text
from gateway.config.env import env_comma_list, env_integer, env_utf8_text
from gateway.config.schema import EnvOverride, Key, Refuse

AREA = "cluster"

CLUSTER_ID: Key[str] = Key(
    name="cluster_id",
    default=b"default",
    convert=Utf8Text(),
    read_when="boot",
    doc="Trust-zone/region cluster id stamped on every stream-status notification."
    ' Write non-ASCII names as <<"..."/utf8>> or a string; empty is allowed.',
    area=AREA,
    # Starting under another id pins agents to the wrong trust zone, and an id that cannot be
    # encoded would fail every notification: the manual refuses instead of falling back.
    on_bad=Refuse("invalid_cluster_id", with_source=True),
    env=EnvOverride("YUZU_GW_CLUSTER_ID", env_utf8_text, "UTF-8 text"),
    # The manual: the refusal and the override line never echo the value.
    secret=True,
)

CLUSTER_SEED_DNS_NAME: Key[str] = Key(
    name="cluster_seed_dns_name",
    default=b"gateway",
    convert=HostName(),
    read_when="start of cluster discovery",
    doc="Name whose A records give the peer addresses (IPv4 only).",
    area=AREA,
    env=EnvOverride("YUZU_GW_SEED_DNS_NAME", env_utf8_text, "a host name"),
    our_choices=("valid values", "bad value"),
)

CLUSTER_SEED_NODES: Key[tuple[str, ...]] = Key(
    name="cluster_seed_nodes",
    default=[],
    convert=HostList(),
    read_when="start of cluster discovery",
    doc="Explicit peer addresses; when non-empty they replace DNS discovery (never merged).",
    area=AREA,
    env=EnvOverride("YUZU_GW_SEED_NODES", env_comma_list, "a comma list, e.g. 10.0.0.1,10.0.0.2"),
    our_choices=("valid values", "bad value"),
)

CLUSTER_REDIAL_INTERVAL_MS: Key[int] = Key(
    name="cluster_redial_interval_ms",
    default=5000,
    convert=IntRange(100, 3_600_000),
    read_when="start of cluster discovery",
    doc="Fixed interval of the always-on redial loop (no backoff).",
    area=AREA,
    env=EnvOverride("YUZU_GW_CLUSTER_REDIAL_INTERVAL_MS", env_integer, "an integer"),
    our_choices=("valid values", "bad value"),
)

CLUSTER_MAX_LIFETIME_ADDRS: Key[int] = Key(
    name="cluster_max_lifetime_addrs",
    default=1024,
    convert=IntRange(1),
    read_when="start of cluster discovery",
    doc="Lifetime cap on distinct peer addresses the node takes on, against a seed name that"
    " rotates through fresh addresses forever.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

HASH_RING_VNODES: Key[int] = Key(
    name="hash_ring_vnodes",
    default=256,
    convert=IntRange(1, 65536),
    read_when="start",
    doc="Virtual nodes per physical node on the consistent hash ring.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

KEYS: tuple[Key[Any], ...] = (
    CLUSTER_ID,
    CLUSTER_SEED_DNS_NAME,
    CLUSTER_SEED_NODES,
    CLUSTER_REDIAL_INTERVAL_MS,
    CLUSTER_MAX_LIFETIME_ADDRS,
    HASH_RING_VNODES,
)
