"""The two option lists of an upstream endpoint: its SSL options and its socket options.

Both are Erlang lists an operator of the Erlang gateway already has: `SslOptions` were Erlang
`ssl` client options and `socket_options` were `gen_tcp` options. This module reads the ones
that have a meaning for Python's `ssl` and `socket` modules into frozen records and names the
rest, which are accepted and ignored (one INFO line at boot lists their names, never their
values: SSL options sit beside key paths and passphrases).

A list that is not a list of atoms and `{Key, Value}` pairs, or a known option whose value has
the wrong type, is a shape defect: `BadShape`, which the channel parser turns into
`bad_endpoint` (SSL options) or `bad_socket_options`. The message names the option, never the
value.
"""

from __future__ import annotations

import ssl

import attrs

from gateway.config.converters import BadValue, text_of
from gateway.config.terms import Atom, Term

__all__ = ["BadShape", "SocketOptions", "TlsOptions", "parse_socket_options", "parse_tls_options"]


class BadShape(Exception):
    """The list or one option in it has the wrong shape; the message has no value in it."""


# Erlang `versions` names -> Python's TLS versions. TLS 1.0 and 1.1 are not offered: OpenSSL 3
# refuses them at its default security level, so a config asking for them could never connect.
_VERSIONS = {"tlsv1.2": ssl.TLSVersion.TLSv1_2, "tlsv1.3": ssl.TLSVersion.TLSv1_3}


@attrs.frozen
class TlsOptions:
    """What the gateway uses of an endpoint's SslOptions.

    `server_name`: the name sent as SNI and checked against the server's certificate; None
    means the endpoint's host, `False` means `{server_name_indication, disable}` (no SNI and no
    host name check, as Erlang's ssl does)."""

    cacertfile: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    cacerts: tuple[bytes, ...] = ()
    verify: str | None = None  # "verify_peer" | "verify_none" | None (not set)
    server_name: str | bool | None = None
    password: str | None = attrs.field(default=None, repr=False)
    versions: tuple[ssl.TLSVersion, ...] = ()
    ignored: tuple[str, ...] = ()

    @property
    def verify_peer(self) -> bool:
        return self.verify == "verify_peer"

    @property
    def own_ca(self) -> bool:
        """A CA of the endpoint's own, rather than the operating system's store."""
        return self.cacertfile is not None or bool(self.cacerts)

    @property
    def verified(self) -> bool:
        """The seed's production rule: {verify, verify_peer} and a CA of its own."""
        return self.verify_peer and self.own_ca

    @property
    def client_certificate(self) -> bool:
        return self.certfile is not None and self.keyfile is not None

    def files(self) -> list[tuple[str, str]]:
        """(option name, path) of every file option set, in a fixed order."""
        named = (
            ("cacertfile", self.cacertfile),
            ("certfile", self.certfile),
            ("keyfile", self.keyfile),
        )
        return [(name, path) for name, path in named if path is not None]


@attrs.frozen
class SocketOptions:
    """What the gateway uses of an endpoint's `socket_options`.

    `inet6`: dial IPv6 (Erlang's `inet6`); the default is IPv4 only, as gen_tcp's.
    `nodelay`: an explicit `{nodelay, Bool}` on this endpoint, which wins over
    `upstream_tcp_nodelay`; None leaves it to that key."""

    inet6: bool = False
    nodelay: bool | None = None
    keepalive: bool | None = None
    recbuf: int | None = None
    sndbuf: int | None = None
    ignored: tuple[str, ...] = ()


def _pairs(options: Term, what: str) -> list[tuple[str, Term | None]]:
    """Atoms as `(name, None)`, pairs as `(name, value)`; anything else is a shape defect."""
    if not isinstance(options, list):
        raise BadShape(f"{what} is not a list")
    items: list[tuple[str, Term | None]] = []
    for position, item in enumerate(options, 1):
        if isinstance(item, Atom):
            items.append((item.name, None))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Atom):
            items.append((item[0].name, item[1]))
        else:
            raise BadShape(f"item #{position} of {what} is neither an atom nor {{Key, Value}}")
    return items


def _path(name: str, value: Term | None, what: str) -> str:
    try:
        text = text_of(value, "a path") if value is not None else ""
    except BadValue:
        text = ""
    if not text:
        raise BadShape(f"{{{name}, _}} of {what} is not a file path")
    return text


def _flag(name: str, value: Term | None, what: str) -> bool:
    if not isinstance(value, bool):
        raise BadShape(f"{{{name}, _}} of {what} is not true or false")
    return value


def _size(name: str, value: Term | None, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise BadShape(f"{{{name}, _}} of {what} is not a positive integer")
    return value


def parse_tls_options(options: Term, what: str) -> TlsOptions:
    """The SSL options of one endpoint. The first occurrence of an option wins, as Erlang's
    `proplists:get_value/2` reads it."""
    fields: dict[str, object] = {}
    ignored: list[str] = []
    seen: set[str] = set()
    for name, value in _pairs(options, what):
        if name in seen:
            continue
        seen.add(name)
        if name in ("cacertfile", "certfile", "keyfile"):
            fields[name] = _path(name, value, what)
        elif name == "cacerts":
            if not (isinstance(value, list) and all(isinstance(c, bytes) for c in value)):
                raise BadShape(f"{{cacerts, _}} of {what} is not a list of binaries")
            fields["cacerts"] = tuple(value)  # type: ignore[arg-type]
        elif name == "verify":
            if value not in (Atom("verify_peer"), Atom("verify_none")):
                raise BadShape(f"{{verify, _}} of {what} is not verify_peer or verify_none")
            assert isinstance(value, Atom)
            fields["verify"] = value.name
        elif name == "server_name_indication":
            fields["server_name"] = False if value == Atom("disable") else _path(name, value, what)
        elif name == "password":
            fields["password"] = _path(name, value, what)
        elif name == "versions":
            fields["versions"] = _versions(value, what)
        else:
            # depth, ciphers, alpn_advertised_protocols, verify_fun, reuse_sessions, ...:
            # Erlang ssl tuning with no Python equivalent the gateway needs. h2 is always
            # offered by ALPN, and Python's ssl defaults are at least as strict.
            ignored.append(name)
    return TlsOptions(**fields, ignored=tuple(ignored))  # type: ignore[arg-type]


def _versions(value: Term | None, what: str) -> tuple[ssl.TLSVersion, ...]:
    names = [v.name for v in value if isinstance(v, Atom)] if isinstance(value, list) else []
    if not names or not isinstance(value, list) or len(names) != len(value):
        raise BadShape(f"{{versions, _}} of {what} is not a list of TLS versions")
    unknown = [n for n in names if n not in _VERSIONS]
    if unknown:
        raise BadShape(
            f"{{versions, _}} of {what} names {', '.join(unknown)}; this gateway offers"
            f" {' and '.join(_VERSIONS)}"
        )
    return tuple(sorted({_VERSIONS[n] for n in names}))


def parse_socket_options(options: Term, what: str) -> SocketOptions:
    fields: dict[str, object] = {}
    ignored: list[str] = []
    for name, value in _pairs(options, what):
        if value is None and name in ("inet", "inet6"):
            fields["inet6"] = name == "inet6"  # the last one wins, as in gen_tcp
        elif name in ("nodelay", "keepalive") and value is not None:
            fields[name] = _flag(name, value, what)
        elif name in ("recbuf", "sndbuf") and value is not None:
            fields[name] = _size(name, value, what)
        else:
            # binary, active, reuseaddr, {ip, _}, {port, _}, ...: gen_tcp options the gateway's
            # socket handling has no use for (a source address or port is not supported).
            ignored.append(name)
    return SocketOptions(**fields, ignored=tuple(ignored))  # type: ignore[arg-type]
