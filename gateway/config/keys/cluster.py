"""Keys of the cluster: its logical identity and how nodes find each other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from gateway.config.cluster_seeds import DEFAULT_CLUSTER_PORT, parse_seed
from gateway.config.cluster_tls import ClusterTls, check_complete
from gateway.config.converters import BadValue, HostList, HostName, IntRange, Utf8Text, text_of
from gateway.config.env import env_comma_list, env_integer, env_utf8_text
from gateway.config.schema import EnvOverride, Key, NameOrigin, Refuse
from gateway.config.section import Check
from gateway.config.terms import Atom, Term

if TYPE_CHECKING:
    from gateway.config.config import Config

AREA = "cluster"


@attrs.frozen
class SeedList:
    """`cluster_seed_nodes`: HostList's entries, each of which may also carry a port."""

    expected: str = (
        "a list of peer addresses host or host:port (binaries, strings or {A,B,C,D}),"
        " the host a name or an IPv4 address"
    )

    def __call__(self, term: Term) -> tuple[str, ...]:
        if not isinstance(term, list):
            raise BadValue(self.expected)
        entries: list[str] = []
        for item in term:
            if isinstance(item, tuple):  # {A,B,C,D}
                entries.extend(HostList(self.expected)([item]))
                continue
            text = text_of(item, self.expected)
            HostName(self.expected)(text.partition(":")[0])
            try:
                parse_seed(text, DEFAULT_CLUSTER_PORT)
            except ValueError:
                raise BadValue(self.expected) from None
            entries.append(text)
        return tuple(entries)


@attrs.frozen
class FileOrUndefined:
    """A file path as a string or binary, or the atom `undefined` (read as None)."""

    expected: str = "a file path (string or binary), or undefined"

    def __call__(self, term: Term) -> str | None:
        if term == Atom("undefined"):
            return None
        path = text_of(term, self.expected)
        if not path:
            raise BadValue(self.expected)
        return path


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
    convert=SeedList(),
    read_when="start of cluster discovery",
    doc="Explicit peer addresses, each host or host:port (the port defaults to cluster_port);"
    " when non-empty they replace DNS discovery (never merged).",
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

CLUSTER_PORT: Key[int] = Key(
    name="cluster_port",
    default=DEFAULT_CLUSTER_PORT,
    convert=IntRange(0, 65535),
    read_when="start of cluster discovery",
    doc="TCP port of the inter-node transport, bound on the node name's host only (the"
    " advertise address); also the port of a seed entry or DNS record that names none."
    " 0 asks for a free port (tests).",
    area=AREA,
    origin=NameOrigin.OURS,
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


def _tls_file(role: str, doc: str) -> Key[str | None]:
    return Key(
        name=f"cluster_tls_{role}",
        default=Atom("undefined"),
        convert=FileOrUndefined(),
        read_when="boot",
        doc=doc + " Set all three cluster_tls_* keys for mutual TLS on the cluster links, or"
        " none for plaintext links (the development posture; docs/cluster.md).",
        area=AREA,
        # A mistyped path must not quietly fall back to plaintext links.
        on_bad=Refuse(f"invalid_cluster_tls_{role}"),
        origin=NameOrigin.OURS,
        default_doc="undefined (plaintext links, with a WARNING at boot)",
    )


CLUSTER_TLS_CERTFILE = _tls_file(
    "certfile", "PEM certificate (chain) of this node's leaf, presented on both ends of a link."
)
CLUSTER_TLS_KEYFILE = _tls_file("keyfile", "PEM private key of cluster_tls_certfile.")
CLUSTER_TLS_CACERTFILE = _tls_file(
    "cacertfile", "PEM install CA: a peer's leaf must chain to it, both ways."
)


def cluster_tls(config: Config) -> ClusterTls:
    return ClusterTls(
        config[CLUSTER_TLS_CERTFILE], config[CLUSTER_TLS_KEYFILE], config[CLUSTER_TLS_CACERTFILE]
    )


def check_cluster_tls(config: Config, env: Mapping[str, str]) -> Config:
    """All three cluster_tls_* files or none, before anything starts; the files are read
    when the cluster child starts (gateway/config/cluster_tls.py)."""
    check_complete(cluster_tls(config))
    return config


KEYS: tuple[Key[Any], ...] = (
    CLUSTER_ID,
    CLUSTER_SEED_DNS_NAME,
    CLUSTER_SEED_NODES,
    CLUSTER_REDIAL_INTERVAL_MS,
    CLUSTER_MAX_LIFETIME_ADDRS,
    CLUSTER_PORT,
    HASH_RING_VNODES,
    CLUSTER_TLS_CERTFILE,
    CLUSTER_TLS_KEYFILE,
    CLUSTER_TLS_CACERTFILE,
)

CHECKS: tuple[Check, ...] = (check_cluster_tls,)
