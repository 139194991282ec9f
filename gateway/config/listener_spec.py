"""`{grpc_listeners, [...]}`: from the config term to validated, frozen `ListenerSpec`s.

Rules of this module (seed: "gRPC listeners", "Client addresses behind a proxy", "Moving the
agent edge to mutual TLS", "TLS posture (M1)"; seed 001's go-away for `overload_goaway`):

- Every entry is validated before anything is bound, and closed: an entry and each of its
  `listen`, `tls`, `http2`, `limits`, `origin` and `overload_goaway` maps may carry only the
  keys below.
- Every defect refuses boot with a `BootRefused` whose term names it; the detail names the
  entry and the key, never a value that could be a path or a secret.
- This module sees one config term. Rules that need another key (`allow_no_listeners`) or
  the environment (`YUZU_GW_AGENT_PORT`) are in `listener_overrides.py`; rules that need the
  handler objects (`bad_routes` for an unknown module) are in gateway/listeners/tree.py.

Defect terms, checked in this order for each entry:

| term | when |
| --- | --- |
| `config_shape` | grpc_listeners is not a list, or an entry is not a map |
| `legacy_keys` | an entry carries grpcbox-era server keys (`grpc_opts`, `listen_opts`, ...) |
| `unknown_keys` | any other key outside the closed set of the entry or a sub-map |
| `bad_listener` | a value of the wrong type or out of range (the detail names the key) |
| `tls_incomplete` | a `tls` map without all of certfile, keyfile and cacertfile |
| `auth_fun_on_agent_listener` | an `auth_fun` on a listener that serves the agent service |
| `{bad_routes, ...}` | a proto or service the gateway does not know, or not in `service_protos` |
| `bad_origin_mode` | an origin mode other than the three |
| `origin_without_sources` | a proxy mode with no `sources` |
| `bad_origin_source` | a source that is not an address or `{Address, PrefixLen}` |
| `mapped_source_prefix` | an IPv4-mapped source network with a prefix of 96 or less |
| `forwarded_for_with_auth_fun` | `forwarded_for` together with an `auth_fun` |
| `proxied_mgmt_listener` | a management listener off loopback whose origin is not `transport` |
| `overload_goaway_on_mgmt_listener` | `overload_goaway` on a listener serving management |
| `low_watermark_not_below_high` | an `overload_goaway` low_watermark at or above its high one |

and across entries: `duplicate_name`, `duplicate_port` (a fixed port, not 0, used twice).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from typing import Literal

import attrs

from actors.core.overload_goaway import Watermarks, WatermarksRefused
from gateway.config.closed import CONFIG_SHAPE, closed_map
from gateway.config.converters import BadValue, text_of
from gateway.config.origin_sources import IPAddress, IPNetwork, MappedPrefixTooShort, Mode, Sources
from gateway.config.redact import shown_value
from gateway.config.refusal import BootRefused
from gateway.config.terms import Atom, ExternalFun, Term, format_atom

log = logging.getLogger("yuzu_gw.listeners")

AGENT_SERVICE = "yuzu.agent.v1.AgentService"
MGMT_SERVICE = "yuzu.server.v1.ManagementService"
AGENT_PROTO = "agent_pb"
MGMT_PROTO = "management_pb"
# The proto modules a listener can name, and the services each declares.
PROTO_SERVICES: Mapping[str, tuple[str, ...]] = {
    AGENT_PROTO: (AGENT_SERVICE,),
    MGMT_PROTO: (MGMT_SERVICE,),
}

ENTRY_KEYS = frozenset(
    {
        "name",
        "service_protos",
        "services",
        "listen",
        "tls",
        "auth_fun",
        "acceptors",
        "http2",
        "limits",
        "origin",
        "overload_goaway",
    }
)
LISTEN_KEYS = frozenset({"port", "ip"})
TLS_KEYS = frozenset({"certfile", "keyfile", "cacertfile", "verify", "fail_if_no_peer_cert"})
TLS_FILES = ("certfile", "keyfile", "cacertfile")
HTTP2_KEYS = frozenset({"idle_timeout", "max_concurrent_streams", "max_cancel_stream_rate"})
LIMITS_KEYS = frozenset({"max_connections", "max_connection_memory_bytes", "request_timeout_ms"})
ORIGIN_KEYS = frozenset({"mode", "sources", "trusted_hops"})
OVERLOAD_KEYS = frozenset({"high_watermark", "low_watermark"})
# The grpcbox server shape (`{grpcbox, [{servers, [#{grpc_opts => ..., ...}]}]}`) that an
# entry copied from an old config still carries; the upgrade table maps each to a new key.
LEGACY_KEYS = frozenset(
    {"grpc_opts", "listen_opts", "pool_opts", "transport_opts", "server_opts", "chatterbox_opts"}
)

# Defect terms.
LEGACY = "legacy_keys"
BAD_LISTENER = "bad_listener"
TLS_INCOMPLETE = "tls_incomplete"
AUTH_FUN_ON_AGENT = "auth_fun_on_agent_listener"
BAD_ROUTES = "bad_routes"
BAD_ORIGIN_MODE = "bad_origin_mode"
ORIGIN_WITHOUT_SOURCES = "origin_without_sources"
BAD_ORIGIN_SOURCE = "bad_origin_source"
MAPPED_SOURCE_PREFIX = "mapped_source_prefix"
FORWARDED_FOR_WITH_AUTH_FUN = "forwarded_for_with_auth_fun"
PROXIED_MGMT = "proxied_mgmt_listener"
OVERLOAD_ON_MGMT = "overload_goaway_on_mgmt_listener"
LOW_NOT_BELOW_HIGH = "low_watermark_not_below_high"
DUPLICATE_NAME = "duplicate_name"
DUPLICATE_PORT = "duplicate_port"

# -- defaults (docs/listeners.md gives the reasons) ----------------------------------------------
DEFAULT_AGENT_PORT = 50051
DEFAULT_MGMT_PORT = 50063
DEFAULT_IP = "0.0.0.0"
DEFAULT_ACCEPTORS = 32
# The plaintext default, demo and UAT configs of the manual inherit 600 s; the shipped prod
# config sets 180 s on the agent listener.
DEFAULT_IDLE_TIMEOUT_MS = 600_000
DEFAULT_AGENT_STREAMS = 32
DEFAULT_MGMT_STREAMS = 4096
# Cowboy's default: more than 500 streams cancelled by the client in 10 s closes the
# connection (the HTTP/2 "rapid reset" defence).
DEFAULT_CANCEL_RATE = (500, 10_000)
# Seed: 60000 on an agent listener (it assumes about 65536 descriptors), 256 on mgmt.
DEFAULT_AGENT_MAX_CONNECTIONS = 60_000
DEFAULT_MGMT_MAX_CONNECTIONS = 256
# Two requests of the largest size the gateway accepts (4194304-byte inventory reports)
# buffered at once, and no more: a connection past it is killed.
DEFAULT_MAX_CONNECTION_MEMORY_BYTES = 8 * 1024 * 1024
# Long enough for a 4 MiB inventory report over a slow link (about 0.6 Mbit/s), short
# beside the 180 s idle timeout a held connection gets anyway.
DEFAULT_REQUEST_TIMEOUT_MS = 60_000

MAX_PORT = 65535


@attrs.frozen
class TlsSpec:
    certfile: str
    keyfile: str
    cacertfile: str
    # The defaults are strict mutual TLS (the management listener's posture); the agent
    # listener's entry sets verify_none / false.
    verify: Literal["verify_peer", "verify_none"] = "verify_peer"
    fail_if_no_peer_cert: bool = True

    def __repr__(self) -> str:
        # Paths name key files: never in a repr that may reach a crash report or the console.
        return f"TlsSpec(verify={self.verify}, fail_if_no_peer_cert={self.fail_if_no_peer_cert})"


@attrs.frozen
class Http2Spec:
    idle_timeout_ms: int | None = DEFAULT_IDLE_TIMEOUT_MS  # None: infinity
    max_concurrent_streams: int = DEFAULT_AGENT_STREAMS
    max_cancel_stream_rate: tuple[int, int] = DEFAULT_CANCEL_RATE  # (count, period ms)


@attrs.frozen
class LimitsSpec:
    max_connections: int = DEFAULT_AGENT_MAX_CONNECTIONS
    max_connection_memory_bytes: int = DEFAULT_MAX_CONNECTION_MEMORY_BYTES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS


@attrs.frozen
class OriginSpec:
    mode: Mode = Mode.TRANSPORT
    sources: Sources = attrs.field(factory=Sources)
    trusted_hops: int = 0


@attrs.frozen
class ListenerSpec:
    name: str
    service_protos: tuple[str, ...]
    services: tuple[tuple[str, str], ...]  # (gRPC service, module), in config order
    ip: str = DEFAULT_IP
    port: int = DEFAULT_AGENT_PORT
    tls: TlsSpec | None = None
    auth_fun: ExternalFun | None = None
    acceptors: int = DEFAULT_ACCEPTORS
    http2: Http2Spec = attrs.field(factory=Http2Spec)
    limits: LimitsSpec = attrs.field(factory=LimitsSpec)
    origin: OriginSpec = attrs.field(factory=OriginSpec)
    # The overload go-away's marks; None (the default) is off (docs/listeners.md).
    overload_goaway: Watermarks | None = None

    @property
    def routes_agent(self) -> bool:
        """Counts for the "a listener routes the AgentService" rule: the services map has
        the key, whatever service_protos says (seed, "gRPC listeners")."""
        return any(service == AGENT_SERVICE for service, _ in self.services)

    @property
    def serves_agent(self) -> bool:
        """Serves the agent service in any way: agent_pb in the protos or the AgentService
        key (the auth_fun refusal covers both, combined listeners included)."""
        return AGENT_PROTO in self.service_protos or self.routes_agent

    @property
    def serves_mgmt(self) -> bool:
        return MGMT_PROTO in self.service_protos or any(
            service == MGMT_SERVICE for service, _ in self.services
        )


# -- reading terms ------------------------------------------------------------------------------


class _Entry:
    """Where in the config a value sits, for the detail of a refusal."""

    def __init__(self, index: int, name: str | None = None) -> None:
        self.index = index
        self.name = name

    def where(self, *path: str) -> str:
        who = f"entry {self.name}" if self.name else f"entry {self.index + 1}"
        return " ".join(("grpc_listeners", who, *path))

    def bad(self, key: str, term: Term, expected: str) -> BootRefused:
        return BootRefused(
            BAD_LISTENER, f"{self.where()}: {key} is {shown_value(term)}, not {expected}"
        )


def _int(entry: _Entry, key: str, term: Term, low: int, high: int | None = None) -> int:
    if (
        isinstance(term, bool)
        or not isinstance(term, int)
        or term < low
        or (high is not None and term > high)
    ):
        expected = (
            f"an integer from {low} to {high}" if high is not None else f"an integer >= {low}"
        )
        raise entry.bad(key, term, expected)
    return term


def _atom(entry: _Entry, key: str, term: Term) -> str:
    if not isinstance(term, Atom):
        raise entry.bad(key, term, "an atom")
    return term.name


def parse_listeners(term: Term) -> tuple[ListenerSpec, ...]:
    """Every entry, validated, in config order; then the rules across entries."""
    if not isinstance(term, list):
        raise BootRefused(
            CONFIG_SHAPE, f"grpc_listeners must be a list of maps, not {shown_value(term)}"
        )
    specs = tuple(parse_entry(item, index) for index, item in enumerate(term))
    check_unique(specs)
    return specs


def check_unique(specs: tuple[ListenerSpec, ...]) -> None:
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise BootRefused(
            DUPLICATE_NAME, f"grpc_listeners: the name {format_atom(twice[0])} is used twice"
        )
    # Port 0 asks the kernel for a free port; only a fixed port can collide.
    ports = [s.port for s in specs if s.port != 0]
    clash = sorted({p for p in ports if ports.count(p) > 1})
    if clash:
        raise BootRefused(DUPLICATE_PORT, f"grpc_listeners: port {clash[0]} is used twice")


def parse_entry(term: Term, index: int) -> ListenerSpec:
    entry = _Entry(index)
    if not isinstance(term, dict):
        raise BootRefused(
            CONFIG_SHAPE, f"{entry.where()} must be a map #{{...}}, not {shown_value(term)}"
        )
    legacy = sorted(k.name for k in term if isinstance(k, Atom) and k.name in LEGACY_KEYS)
    if legacy:
        raise BootRefused(
            LEGACY,
            f"{entry.where()} carries grpcbox-era keys ({', '.join(legacy)}); move them to"
            " name, services, listen, tls and http2 (docs/listeners.md 'Moving an old config')",
        )
    keys = closed_map(term, ENTRY_KEYS, entry.where())
    if "name" not in keys:
        raise BootRefused(BAD_LISTENER, f"{entry.where()} has no name")
    entry.name = _atom(entry, "name", keys["name"])

    protos = _protos(entry, keys.get("service_protos", []))
    services = _services(entry, keys.get("services", {}), protos)
    auth_fun = keys.get("auth_fun")
    if auth_fun is not None and not (isinstance(auth_fun, ExternalFun) and auth_fun.arity == 1):
        raise entry.bad("auth_fun", auth_fun, "fun Module:Function/1")
    agent_facing = AGENT_PROTO in protos or any(s == AGENT_SERVICE for s, _ in services)
    mgmt_facing = MGMT_PROTO in protos or any(s == MGMT_SERVICE for s, _ in services)
    ip, port = _listen(entry, keys.get("listen", {}), agent_facing, mgmt_facing)
    tls = _tls(entry, keys["tls"]) if "tls" in keys else None
    if auth_fun is not None and agent_facing:
        # It would refuse every agent without a certificate, and agents that have not
        # enrolled have none: agent bootstrap would be cut fleet-wide.
        raise BootRefused(
            AUTH_FUN_ON_AGENT,
            f"{entry.where()} serves the agent service and has an auth_fun; remove it"
            " (docs/listeners.md 'Moving the agent edge to mutual TLS')",
        )
    origin = _origin(entry, keys.get("origin", {}))
    if origin.mode is Mode.FORWARDED_FOR and auth_fun is not None:
        raise BootRefused(
            FORWARDED_FOR_WITH_AUTH_FUN,
            f"{entry.where()}: forwarded_for with an auth_fun; the router terminates TLS, so"
            " the certificate checked would be the router's, never the agent's",
        )
    if (
        mgmt_facing
        and origin.mode is not Mode.TRANSPORT
        and not ipaddress.ip_address(ip).is_loopback
    ):
        raise BootRefused(
            PROXIED_MGMT,
            f"{entry.where()} serves the management service on a network address with origin"
            f" {origin.mode.value}; the management listener is never proxied",
        )
    limits = _limits(entry, keys.get("limits", {}), agent_facing)
    overload = None
    if "overload_goaway" in keys:
        if mgmt_facing:
            # The server replicas hold these connections: sending them away cuts the operator
            # plane, and they would only dial back (seed 001: peers are never sent away).
            raise BootRefused(
                OVERLOAD_ON_MGMT,
                f"{entry.where()} serves the management service and has overload_goaway;"
                " it is for agent-only listeners",
            )
        overload = _overload(entry, keys["overload_goaway"], limits.max_connections)
    return ListenerSpec(
        name=entry.name,
        service_protos=protos,
        services=services,
        ip=ip,
        port=port,
        tls=tls,
        auth_fun=auth_fun,
        acceptors=_int(entry, "acceptors", keys.get("acceptors", DEFAULT_ACCEPTORS), 1, 1024),
        http2=_http2(entry, keys.get("http2", {}), agent_facing),
        limits=limits,
        origin=origin,
        overload_goaway=overload,
    )


def _protos(entry: _Entry, term: Term) -> tuple[str, ...]:
    if not isinstance(term, list):
        raise entry.bad("service_protos", term, "a list of proto module atoms")
    protos = tuple(_atom(entry, "service_protos", p) for p in term)
    for proto in protos:
        if proto not in PROTO_SERVICES:
            raise BootRefused(
                BAD_ROUTES,
                f"{entry.where()}: service_protos names {format_atom(proto)}, which this"
                f" gateway does not have (known: {', '.join(PROTO_SERVICES)})",
                context=(f"{{unknown_proto,{format_atom(proto)}}}",),
            )
    return protos


def _services(entry: _Entry, term: Term, protos: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    if not isinstance(term, dict):
        raise entry.bad("services", term, "a map of gRPC service to module")
    declared = {s for p in protos for s in PROTO_SERVICES[p]}
    services: list[tuple[str, str]] = []
    for key, value in term.items():
        service = _atom(entry, "services", key)
        module = _atom(entry, f"services {format_atom(service)}", value)
        if service not in declared:
            # Without its proto the layer has no method table for it: nothing could route.
            raise BootRefused(
                BAD_ROUTES,
                f"{entry.where()}: services names {format_atom(service)}, which no proto in"
                " service_protos declares",
                context=(f"{{service_not_in_protos,{format_atom(service)}}}",),
            )
        services.append((service, module))
    return tuple(services)


def _ip(entry: _Entry, term: Term) -> str:
    if isinstance(term, tuple) and len(term) in (4, 8):
        high = 255 if len(term) == 4 else 65535
        if all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= high for v in term):
            return str(_address(term))
    raise entry.bad("listen ip", term, "an address tuple {A,B,C,D} or {A,B,C,D,E,F,G,H}")


def _address(term: tuple[int, ...]) -> IPAddress:
    if len(term) == 4:
        return ipaddress.IPv4Address(bytes(term))
    return ipaddress.IPv6Address(b"".join(v.to_bytes(2, "big") for v in term))


def _listen(entry: _Entry, term: Term, agent: bool, mgmt: bool) -> tuple[str, int]:
    keys = closed_map(term, LISTEN_KEYS, entry.where("listen"))
    ip = _ip(entry, keys["ip"]) if "ip" in keys else DEFAULT_IP
    default_port = DEFAULT_MGMT_PORT if mgmt and not agent else DEFAULT_AGENT_PORT
    port = _int(entry, "listen port", keys.get("port", default_port), 0, MAX_PORT)
    return ip, port


def _path(entry: _Entry, key: str, term: Term) -> str:
    try:
        path = text_of(term, "a path")
    except BadValue:
        # Never the value: it is a path to a key file.
        raise BootRefused(
            BAD_LISTENER, f"{entry.where('tls')}: {key} is not a path (a string or a binary)"
        ) from None
    if not path:
        raise BootRefused(TLS_INCOMPLETE, f"{entry.where('tls')}: {key} is empty")
    return path


def _tls(entry: _Entry, term: Term) -> TlsSpec:
    keys = closed_map(term, TLS_KEYS, entry.where("tls"))
    missing = [k for k in TLS_FILES if k not in keys]
    if missing:
        raise BootRefused(
            TLS_INCOMPLETE,
            f"{entry.where('tls')} lacks {', '.join(missing)}; a tls map needs certfile,"
            " keyfile and cacertfile (remove the map for a plaintext listener)",
        )
    verify = keys.get("verify", Atom("verify_peer"))
    if verify not in (Atom("verify_peer"), Atom("verify_none")):
        raise entry.bad("tls verify", verify, "verify_peer or verify_none")
    fail = keys.get("fail_if_no_peer_cert", True)
    if not isinstance(fail, bool):
        raise entry.bad("tls fail_if_no_peer_cert", fail, "true or false")
    assert isinstance(verify, Atom)
    if verify.name == "verify_none" and fail:
        # Erlang's ssl refuses this pair too: a certificate cannot be required unasked.
        raise BootRefused(
            BAD_LISTENER,
            f"{entry.where('tls')}: fail_if_no_peer_cert true needs verify_peer"
            " (one-way TLS is verify_none with fail_if_no_peer_cert false)",
        )
    return TlsSpec(
        certfile=_path(entry, "certfile", keys["certfile"]),
        keyfile=_path(entry, "keyfile", keys["keyfile"]),
        cacertfile=_path(entry, "cacertfile", keys["cacertfile"]),
        verify="verify_peer" if verify.name == "verify_peer" else "verify_none",
        fail_if_no_peer_cert=fail,
    )


def _http2(entry: _Entry, term: Term, agent: bool) -> Http2Spec:
    keys = closed_map(term, HTTP2_KEYS, entry.where("http2"))
    idle = keys.get("idle_timeout", DEFAULT_IDLE_TIMEOUT_MS)
    idle_ms = None if idle == Atom("infinity") else _int(entry, "http2 idle_timeout", idle, 1000)
    streams_default = DEFAULT_AGENT_STREAMS if agent else DEFAULT_MGMT_STREAMS
    streams = _int(
        entry,
        "http2 max_concurrent_streams",
        keys.get("max_concurrent_streams", streams_default),
        1,
        2**31 - 1,
    )
    rate = keys.get("max_cancel_stream_rate", DEFAULT_CANCEL_RATE)
    if not (isinstance(rate, tuple) and len(rate) == 2):
        raise entry.bad("http2 max_cancel_stream_rate", rate, "{Count, PeriodMs}")
    count = _int(entry, "http2 max_cancel_stream_rate count", rate[0], 1)
    period = _int(entry, "http2 max_cancel_stream_rate period", rate[1], 1)
    return Http2Spec(idle_ms, streams, (count, period))


def _limits(entry: _Entry, term: Term, agent: bool) -> LimitsSpec:
    keys = closed_map(term, LIMITS_KEYS, entry.where("limits"))
    default_max = DEFAULT_AGENT_MAX_CONNECTIONS if agent else DEFAULT_MGMT_MAX_CONNECTIONS
    return LimitsSpec(
        max_connections=_int(
            entry, "limits max_connections", keys.get("max_connections", default_max), 1
        ),
        # Below one HTTP/2 frame plus a message prefix, no request could be received at all.
        max_connection_memory_bytes=_int(
            entry,
            "limits max_connection_memory_bytes",
            keys.get("max_connection_memory_bytes", DEFAULT_MAX_CONNECTION_MEMORY_BYTES),
            65_536,
        ),
        request_timeout_ms=_int(
            entry,
            "limits request_timeout_ms",
            keys.get("request_timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS),
            100,
            3_600_000,
        ),
    )


def _overload(entry: _Entry, term: Term, max_connections: int) -> Watermarks:
    keys = closed_map(term, OVERLOAD_KEYS, entry.where("overload_goaway"))
    # Above max_connections the mark is never reached: the listener stops accepting there.
    high = _int(
        entry,
        "overload_goaway high_watermark",
        keys.get("high_watermark", max_connections),
        1,
        max_connections,
    )
    low = keys.get("low_watermark")
    if low is not None:
        low = _int(entry, "overload_goaway low_watermark", low, 0)
    try:
        return Watermarks.of(high, low)
    except WatermarksRefused as refused:
        raise BootRefused(
            LOW_NOT_BELOW_HIGH,
            f"{entry.where('overload_goaway')}: {refused}; leave low_watermark unset for 15%"
            " below the high one",
        ) from None


def _origin(entry: _Entry, term: Term) -> OriginSpec:
    keys = closed_map(term, ORIGIN_KEYS, entry.where("origin"))
    mode_term = keys.get("mode", Atom("transport"))
    modes = {m.value: m for m in Mode}
    if not (isinstance(mode_term, Atom) and mode_term.name in modes):
        raise BootRefused(
            BAD_ORIGIN_MODE,
            f"{entry.where('origin')}: mode is {shown_value(mode_term)}, not transport,"
            " proxy_protocol or forwarded_for",
        )
    mode = modes[mode_term.name]
    sources = _sources(entry, keys.get("sources", []))
    hops = _int(entry, "origin trusted_hops", keys.get("trusted_hops", 0), 0, 64)
    if mode is not Mode.TRANSPORT and not len(sources):
        raise BootRefused(
            ORIGIN_WITHOUT_SOURCES,
            f"{entry.where('origin')}: mode {mode.value} needs sources, the proxies whose"
            " claims the gateway may believe",
        )
    if mode is Mode.TRANSPORT and len(sources):
        log.warning("%s: sources has no effect in mode transport", entry.where("origin"))
    if mode is not Mode.FORWARDED_FOR and "trusted_hops" in keys:
        log.warning("%s: trusted_hops has no effect in mode %s", entry.where("origin"), mode.value)
    return OriginSpec(mode, sources, hops)


def _sources(entry: _Entry, term: Term) -> Sources:
    where = entry.where("origin sources")
    if not isinstance(term, list):
        raise BootRefused(BAD_ORIGIN_SOURCE, f"{where} must be a list")
    items: list[IPAddress | IPNetwork] = []
    for item in term:
        items.append(_source(where, item))
    try:
        return Sources.of(items)
    except MappedPrefixTooShort:
        raise BootRefused(
            MAPPED_SOURCE_PREFIX,
            f"{where}: an IPv4-mapped network with a prefix of 96 or less trusts every IPv4"
            " address; write the IPv4 network instead",
        ) from None


def _is_address(term: Term) -> bool:
    if not (isinstance(term, tuple) and len(term) in (4, 8)):
        return False
    high = 255 if len(term) == 4 else 65535
    return all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= high for v in term)


def _source(where: str, item: Term) -> IPAddress | IPNetwork:
    if _is_address(item):
        assert isinstance(item, tuple)
        return _address(item)
    if isinstance(item, tuple) and len(item) == 2 and _is_address(item[0]):
        address = _address(item[0])  # type: ignore[arg-type]
        prefix = item[1]
        limit = 32 if address.version == 4 else 128
        if isinstance(prefix, int) and not isinstance(prefix, bool) and 0 <= prefix <= limit:
            # Host bits set ({{10,1,0,5},24}) are masked, as the network is meant.
            return ipaddress.ip_network((address, prefix), strict=False)
    raise BootRefused(
        BAD_ORIGIN_SOURCE,
        f"{where}: {shown_value(item)} is not an address tuple or {{Address, PrefixLen}}",
    )
