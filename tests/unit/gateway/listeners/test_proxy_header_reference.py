"""The PROXY header parser (gateway/listeners/proxy_header.py) against an implementation the
project did not write: the `proxy-protocol` package (PyPI; `proxyprotocol`), on generated
headers. Headers it writes are parsed here to the same addresses and ports, the headers
written here are read by it the same way, and a version 1 line accepted here is one it
accepts too (this parser is the stricter: no leading zeros in a port, families match)."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.listeners.proxy_header import (
    Command,
    Family,
    ProxyHeader,
    ProxyHeaderError,
    encode_v1,
    encode_v2,
    parse,
)

proxyprotocol = pytest.importorskip("proxyprotocol")
from proxyprotocol import ProxyProtocolSyntaxError  # noqa: E402
from proxyprotocol.result import (  # noqa: E402
    ProxyResult,
    ProxyResultIPv4,
    ProxyResultIPv6,
    ProxyResultLocal,
    ProxyResultUnknown,
)
from proxyprotocol.v1 import ProxyProtocolV1  # noqa: E402
from proxyprotocol.v2 import ProxyProtocolV2  # noqa: E402

V1, V2 = ProxyProtocolV1(), ProxyProtocolV2()

ports = st.integers(0, 65535)
v4 = st.builds(ipaddress.IPv4Address, st.integers(0, 2**32 - 1))
v6 = st.builds(ipaddress.IPv6Address, st.integers(0, 2**128 - 1))


@st.composite
def proxied(draw: st.DrawFn) -> ProxyResult:
    address = v4 if draw(st.booleans()) else v6
    kind = ProxyResultIPv4 if address is v4 else ProxyResultIPv6
    source, dest = (draw(address), draw(ports)), (draw(address), draw(ports))
    protocol = draw(st.sampled_from([socket.SOCK_STREAM, socket.SOCK_DGRAM, None]))
    return kind(source, dest, protocol=protocol)  # type: ignore[arg-type]


def _fields(header: ProxyHeader) -> tuple[object, ...]:
    return (header.source, header.source_port, header.destination, header.destination_port)


def _their_fields(result: ProxyResult) -> tuple[object, ...]:
    (src, sport), (dst, dport) = result.source, result.dest  # type: ignore[misc]
    return (src, sport, dst, dport)


def _as_ours(result: ProxyResult) -> ProxyHeader:
    (src, sport), (dst, dport) = result.source, result.dest  # type: ignore[misc]
    family = Family.INET if src.version == 4 else Family.INET6
    return ProxyHeader(2, Command.PROXY, family, src, dst, sport, dport)


@given(proxied(), st.binary(max_size=16))
def test_their_v1_lines_parse_to_the_same_addresses(result: ProxyResult, rest: bytes) -> None:
    line = V1.pack(result)
    header, used = parse(line + rest)
    assert used == len(line)
    assert header.version == 1 and header.command is Command.PROXY
    assert _fields(header) == _their_fields(result)
    # Byte for byte the line this module writes for the same connection.
    assert encode_v1(header) == line


def test_their_v1_unknown_is_a_proxied_connection_without_an_address() -> None:
    header, _ = parse(V1.pack(ProxyResultUnknown()))
    assert (header.command, header.family, header.source) == (Command.PROXY, Family.UNSPEC, None)


@given(proxied())
def test_their_v2_headers_with_a_checksum_tlv_parse_to_the_same_addresses(
    result: ProxyResult,
) -> None:
    # Their writer appends a CRC32C TLV: a TLV this parser must skip by the announced length.
    data = V2.pack(result)
    header, used = parse(data + b"\x16\x03\x01")
    assert used == len(data)
    assert header.version == 2 and header.command is Command.PROXY
    assert _fields(header) == _their_fields(result)


def test_their_v2_local_is_no_claim() -> None:
    header, used = parse(V2.pack(ProxyResultLocal()))
    assert header.command is Command.LOCAL
    assert header.claim().name == "NO_CLAIM"  # type: ignore[union-attr]
    assert used == len(V2.pack(ProxyResultLocal()))


@given(proxied())
def test_our_headers_read_the_same_with_theirs(result: ProxyResult) -> None:
    ours = _as_ours(result)
    for encoded, reader in ((encode_v2(ours), V2), (encode_v1(ours), V1)):
        theirs = reader.unpack(encoded)
        assert _their_fields(theirs) == _fields(ours)


tokens = st.sampled_from(
    [b"TCP4", b"TCP6", b"UDP4", b"1.2.3.4", b"::1", b"01", b"1", b"65535", b"65536", b"",
     b"-1", b"10.0.0.300", b"fe80::1%eth0", b"UNKNOWN"]
)  # fmt: skip


@given(st.lists(tokens, min_size=1, max_size=6))
def test_a_v1_line_accepted_here_is_accepted_there_alike(parts: list[bytes]) -> None:
    line = b"PROXY " + b" ".join(parts) + b"\r\n"
    try:
        header, _ = parse(line)
    except ProxyHeaderError:
        return
    try:
        theirs = V1.unpack(line)
    except (ProxyProtocolSyntaxError, ValueError) as exc:
        raise AssertionError(f"accepted here, refused by the reference: {line!r}") from exc
    if header.family is Family.UNSPEC:
        assert isinstance(theirs, ProxyResultUnknown)
    else:
        assert _fields(header) == _their_fields(theirs)
