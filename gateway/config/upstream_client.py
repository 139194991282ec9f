"""The `upstream_client` term: from the config file to frozen channel and endpoint specs.

    {upstream_client, #{channels => [
        {default_channel,
         [{https, "yuzu-server.example.com", 50055, [{cacertfile, ...}, {verify, verify_peer}]}],
         #{pool_size => 1}}
    ]}}

Rules of this module (seed, "The upstream client" and "Bad values replaced by defaults";
SPEC_INDEX C19-C25, B16, B20, L41). It only reads the term: no files, no environment, no log.

* A shape it cannot use refuses boot with the shape of the first defect, never the value,
  because SSL options name key files: `bad_client_config` (the map), `bad_channel` (a channel
  tuple, its name, endpoint list or options map; two channels of one name), `bad_endpoint` (an
  endpoint tuple, scheme, port, its SSL options or its fifth map), `bad_host`,
  `bad_socket_options`.
* One channel is one scheme: http and https together is `mixed_upstream_endpoints` (calls go
  round robin over every connection, so some would travel unencrypted). No override.
* A channel option with a bad value (pool_size, connect_timeout, max_receive_message_bytes) is
  replaced by its default with one WARNING each (`ChannelSpec.notes`), the value printed only
  when it is an integer or an atom. A typo in a tuning option must not stop every gateway
  sharing the file at its next restart.
* balancer, encoding and sync_start (grpcbox era) are accepted and ignored; any other option
  key is not read and nothing is logged (the seed's rule: it is not a bad value).

What needs the file system or the environment (TLS files, the unverified-TLS override, the
default_channel requirement) is `boot_check.py`.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from actors.core import LogLine
from gateway.config.converters import BadValue, text_of
from gateway.config.endpoint_options import (
    BadShape,
    SocketOptions,
    TlsOptions,
    parse_socket_options,
    parse_tls_options,
)
from gateway.config.redact import shown_value
from gateway.config.refusal import BootRefused
from gateway.config.terms import Atom, Term

__all__ = [
    "BAD_CHANNEL",
    "BAD_CLIENT_CONFIG",
    "BAD_ENDPOINT",
    "BAD_HOST",
    "BAD_SOCKET_OPTIONS",
    "MIXED_UPSTREAM_ENDPOINTS",
    "ChannelSpec",
    "ClientConfigConverter",
    "ClientSpec",
    "EndpointSpec",
    "parse_client_config",
]

BAD_CLIENT_CONFIG: Final = "bad_client_config"
BAD_CHANNEL: Final = "bad_channel"
BAD_ENDPOINT: Final = "bad_endpoint"
BAD_HOST: Final = "bad_host"
BAD_SOCKET_OPTIONS: Final = "bad_socket_options"
MIXED_UPSTREAM_ENDPOINTS: Final = "mixed_upstream_endpoints"

DOCS_REF: Final = "docs/upstream-channel.md"

# Channel option bounds. The seed gives pool_size 1..64 and the connect_timeout default; it
# states no bounds for the other two, so these are ours: a timeout up to an hour, and a
# message of at most 2 GiB - 1 (gRPC's length prefix and every gRPC stack's int limit).
POOL_SIZE_DEFAULT: Final = 1
POOL_SIZE_RANGE: Final = (1, 64)
CONNECT_TIMEOUT_MS_DEFAULT: Final = 5000
CONNECT_TIMEOUT_MS_RANGE: Final = (1, 3_600_000)
# gRPC's usual default for a received message (grpc-core, grpc-java, grpc-go): 4 MiB.
MAX_RECEIVE_DEFAULT: Final = 4 * 1024 * 1024
MAX_RECEIVE_RANGE: Final = (1, 2**31 - 1)
IGNORED_GRPCBOX_OPTIONS: Final = ("balancer", "encoding", "sync_start")

_SCHEMES: Final = ("http", "https")
_PORT_RANGE: Final = (1, 65535)
_HOST_MAX: Final = 253  # the longest DNS name


@attrs.frozen
class EndpointSpec:
    scheme: str  # "http" | "https"
    host: str
    port: int
    # Read for https; the SSL options of an http endpoint are not used.
    tls: TlsOptions = attrs.field(factory=TlsOptions)
    socket: SocketOptions = attrs.field(factory=SocketOptions)

    @property
    def label(self) -> str:
        """`host:port`, as log lines name an endpoint."""
        return f"{self.host}:{self.port}"

    @property
    def is_tls(self) -> bool:
        return self.scheme == "https"


@attrs.frozen
class ChannelSpec:
    """One channel. `notes` are the lines its parsing produced (bad values replaced by
    defaults, ignored options), logged once at boot by `boot_check`."""

    name: str
    endpoints: tuple[EndpointSpec, ...]
    pool_size: int = POOL_SIZE_DEFAULT
    connect_timeout_ms: int | None = CONNECT_TIMEOUT_MS_DEFAULT  # None: infinity
    max_receive_message_bytes: int = MAX_RECEIVE_DEFAULT
    notes: tuple[LogLine, ...] = attrs.field(default=(), eq=False)

    @property
    def connect_timeout_s(self) -> float | None:
        return None if self.connect_timeout_ms is None else self.connect_timeout_ms / 1000

    @property
    def is_tls(self) -> bool:
        return self.endpoints[0].is_tls

    @property
    def connections(self) -> int:
        return self.pool_size * len(self.endpoints)


@attrs.frozen
class ClientSpec:
    channels: tuple[ChannelSpec, ...]

    def channel(self, name: str) -> ChannelSpec | None:
        for channel in self.channels:
            if channel.name == name:
                return channel
        return None


def _refuse(defect: str, detail: str) -> BootRefused:
    return BootRefused(defect, f"upstream_client: {detail}")


def parse_client_config(term: Term) -> ClientSpec | None:
    """The channels of `term`; None for `undefined` (no upstream client configured)."""
    if term == Atom("undefined"):
        return None
    if not isinstance(term, dict):
        raise _refuse(BAD_CLIENT_CONFIG, f"is {shown_value(term)}, not #{{channels => [...]}}")
    strangers = [k for k in term if k != Atom("channels")]
    if strangers:
        names = ", ".join(sorted(shown_value(k) for k in strangers))
        raise _refuse(BAD_CLIENT_CONFIG, f"has keys other than channels: {names}")
    channels = term.get(Atom("channels"))
    if channels is None:
        raise _refuse(BAD_CLIENT_CONFIG, "has no channels => [...] entry")
    if not isinstance(channels, list):
        raise _refuse(BAD_CLIENT_CONFIG, f"channels is {shown_value(channels)}, not a list")
    specs = tuple(_channel(item, position) for position, item in enumerate(channels, 1))
    names = [c.name for c in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise _refuse(BAD_CHANNEL, f"more than one channel is named {', '.join(twice)}")
    return ClientSpec(specs)


def _channel(item: Term, position: int) -> ChannelSpec:
    where = f"channel #{position}"
    if not (isinstance(item, tuple) and len(item) == 3):
        raise _refuse(BAD_CHANNEL, f"{where} is {shown_value(item)}, not {{Name, Endpoints, Opts}}")
    name_term, endpoints_term, options_term = item
    if not isinstance(name_term, Atom):
        raise _refuse(BAD_CHANNEL, f"the name of {where} is {shown_value(name_term)}, not an atom")
    name = name_term.name
    where = f"channel {name}"
    if not isinstance(endpoints_term, list) or not endpoints_term:
        raise _refuse(BAD_CHANNEL, f"the endpoints of {where} are not a non-empty list")
    if not isinstance(options_term, dict):
        raise _refuse(
            BAD_CHANNEL, f"the options of {where} are {shown_value(options_term)}, not a map"
        )
    endpoints = tuple(
        _endpoint(endpoint, f"endpoint #{n} of {where}")
        for n, endpoint in enumerate(endpoints_term, 1)
    )
    if len({e.scheme for e in endpoints}) > 1:
        raise BootRefused(
            MIXED_UPSTREAM_ENDPOINTS,
            f"the upstream channel {name} lists both plaintext (http) and TLS (https)"
            " endpoints. Calls go round robin over every connection, so some would travel"
            " unencrypted; give the channel one scheme",
        )
    return _with_options(name, endpoints, options_term)


def _endpoint(item: Term, where: str) -> EndpointSpec:
    if not (isinstance(item, tuple) and len(item) in (4, 5)):
        raise _refuse(
            BAD_ENDPOINT, f"{where} is {shown_value(item)}, not {{Scheme, Host, Port, SslOpts}}"
        )
    scheme_term, host_term, port_term, ssl_term = item[:4]
    if not (isinstance(scheme_term, Atom) and scheme_term.name in _SCHEMES):
        raise _refuse(BAD_ENDPOINT, f"the scheme of {where} is not http or https")
    if (
        isinstance(port_term, bool)
        or not isinstance(port_term, int)
        or not _PORT_RANGE[0] <= port_term <= _PORT_RANGE[1]
    ):
        raise _refuse(BAD_ENDPOINT, f"the port of {where} is not an integer from 1 to 65535")
    host = _host(host_term, where)
    try:
        tls = parse_tls_options(ssl_term, f"the SSL options of {where}")
    except BadShape as bad:
        raise _refuse(BAD_ENDPOINT, str(bad)) from None
    socket = SocketOptions()
    if len(item) == 5:
        socket = _fifth(item[4], where)
    return EndpointSpec(scheme_term.name, host, port_term, tls, socket)


def _host(term: Term, where: str) -> str:
    """A host name or address as text, an atom (`localhost`) or an address tuple.

    Only what can never be dialled is refused. "::1" and "[::1]" pass, as in the Erlang
    gateway, where they fail name resolution at each dial (see docs: two limits of the
    endpoint)."""
    if isinstance(term, Atom):
        text = term.name
    elif isinstance(term, tuple) and len(term) in (4, 8):
        return _address_tuple(term, where)
    else:
        try:
            text = text_of(term, "a host")
        except BadValue:
            raise _refuse(BAD_HOST, f"the host of {where} is not a string") from None
    if (
        not text
        or len(text) > _HOST_MAX
        or any(ch.isspace() or ord(ch) < 0x20 or ch in ",/" for ch in text)
    ):
        raise _refuse(BAD_HOST, f"the host of {where} is not a host name or address")
    return text


def _address_tuple(term: tuple[Any, ...], where: str) -> str:
    top = 255 if len(term) == 4 else 65535
    if not all(isinstance(p, int) and not isinstance(p, bool) and 0 <= p <= top for p in term):
        raise _refuse(BAD_HOST, f"the host of {where} is not an address tuple")
    if len(term) == 4:
        return ".".join(str(p) for p in term)
    return ":".join(f"{p:x}" for p in term)


def _fifth(term: Term, where: str) -> SocketOptions:
    if not isinstance(term, dict) or any(k != Atom("socket_options") for k in term):
        raise _refuse(
            BAD_ENDPOINT, f"the fifth element of {where} is not #{{socket_options => [...]}}"
        )
    if Atom("socket_options") not in term:
        return SocketOptions()
    try:
        return parse_socket_options(term[Atom("socket_options")], f"the socket options of {where}")
    except BadShape as bad:
        raise _refuse(BAD_SOCKET_OPTIONS, str(bad)) from None


# --- channel options: bad values replaced by defaults -----------------------------------------


def _bad_value(channel: str, key: str, term: Term, expected: str, default: str) -> LogLine:
    return LogLine(
        "warning",
        f"Upstream channel {channel}: {key} is {shown_value(term)}, not {expected}; the default"
        f" {default} is used instead ({DOCS_REF} 'Bad values replaced by defaults').",
    )


def _int_in(term: Term, bounds: tuple[int, int]) -> bool:
    return isinstance(term, int) and not isinstance(term, bool) and bounds[0] <= term <= bounds[1]


def _with_options(
    name: str, endpoints: tuple[EndpointSpec, ...], options: dict[Term, Term]
) -> ChannelSpec:
    notes: list[LogLine] = []
    read = {k.name: v for k, v in options.items() if isinstance(k, Atom)}

    pool_size = POOL_SIZE_DEFAULT
    if "pool_size" in read:
        if _int_in(read["pool_size"], POOL_SIZE_RANGE):
            pool_size = read["pool_size"]  # type: ignore[assignment]
        else:
            notes.append(
                _bad_value(name, "pool_size", read["pool_size"], "an integer from 1 to 64", "1")
            )

    connect_timeout: int | None = CONNECT_TIMEOUT_MS_DEFAULT
    if "connect_timeout" in read:
        value = read["connect_timeout"]
        if value == Atom("infinity"):
            connect_timeout = None
        elif _int_in(value, CONNECT_TIMEOUT_MS_RANGE):
            connect_timeout = value  # type: ignore[assignment]
        else:
            low, high = CONNECT_TIMEOUT_MS_RANGE
            notes.append(
                _bad_value(
                    name,
                    "connect_timeout",
                    value,
                    f"an integer from {low} to {high} or infinity",
                    str(CONNECT_TIMEOUT_MS_DEFAULT),
                )
            )

    max_receive = MAX_RECEIVE_DEFAULT
    if "max_receive_message_bytes" in read:
        value = read["max_receive_message_bytes"]
        if _int_in(value, MAX_RECEIVE_RANGE):
            max_receive = value  # type: ignore[assignment]
        else:
            low, high = MAX_RECEIVE_RANGE
            notes.append(
                _bad_value(
                    name,
                    "max_receive_message_bytes",
                    value,
                    f"an integer from {low} to {high}",
                    str(MAX_RECEIVE_DEFAULT),
                )
            )

    grpcbox = [k for k in IGNORED_GRPCBOX_OPTIONS if k in read]
    if grpcbox:
        notes.append(
            LogLine(
                "info",
                f"Upstream channel {name}: {', '.join(grpcbox)} (grpcbox-era options) accepted"
                " and ignored",
            )
        )
    return ChannelSpec(
        name=name,
        endpoints=endpoints,
        pool_size=pool_size,
        connect_timeout_ms=connect_timeout,
        max_receive_message_bytes=max_receive,
        notes=tuple(notes),
    )


@attrs.frozen
class ClientConfigConverter:
    """The converter of the `upstream_client` key (see `gateway/config/keys/upstream.py`).
    It raises `BootRefused` itself: every defect has a name of its own."""

    expected: str = "#{channels => [{Name, Endpoints, Opts}, ...]} or undefined"

    def __call__(self, term: Term) -> ClientSpec | None:
        return parse_client_config(term)
