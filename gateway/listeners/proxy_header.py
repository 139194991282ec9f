"""The PROXY protocol header (HAProxy's proxy-protocol.txt, versions 1 and 2), parsed and
written. Pure: no sockets, no clock.

Theory of operation. A proxied connection starts with exactly one header, before any TLS or
HTTP/2 byte. `server.py` reads it without reading past it (version 2 says its length; a
version 1 line ends at its CRLF, found by peeking), then hands the whole header to `parse`.

What a header means for attribution (`claim`):

| header                                   | claim            |
| ---------------------------------------- | ---------------- |
| PROXY command, TCP4/TCP6 (v1), INET/INET6 | the source address |
| LOCAL command (v2; a proxy's health check) | `no_claim`      |
| v1 UNKNOWN, v2 UNSPEC or UNIX family     | `bad_claim` (no address to use) |

A header that is not well formed is a `ProxyHeaderError`: the connection is closed, because
nothing after it can be framed.
"""

from __future__ import annotations

import enum
import ipaddress
import struct

import attrs

from gateway.config.origin_sources import IPAddress, fold
from gateway.listeners.origin import Claim, Ignored

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED = 16  # signature, version/command, family/transport, 16-bit length
# proxy-protocol.txt: "a receiver may reject an incomplete line which does not contain the
# CRLF sequence in the first 107 characters".
V1_MAX = 107
V1_PREFIX = b"PROXY "

_V2_VERSION = 0x2
_V2_INET_LEN = 12  # 4 + 4 + 2 + 2
_V2_INET6_LEN = 36  # 16 + 16 + 2 + 2
_V2_UNIX_LEN = 216  # 108 + 108


class ProxyHeaderError(ValueError):
    """Not a well-formed PROXY header."""


class Command(enum.Enum):
    LOCAL = 0x0
    PROXY = 0x1


class Family(enum.Enum):
    UNSPEC = 0x0
    INET = 0x1
    INET6 = 0x2
    UNIX = 0x3


@attrs.frozen
class ProxyHeader:
    version: int
    command: Command
    family: Family
    source: IPAddress | None = None
    destination: IPAddress | None = None
    source_port: int = 0
    destination_port: int = 0

    def claim(self) -> Claim:
        if self.command is Command.LOCAL:
            return Ignored.NO_CLAIM
        if self.source is None:
            return Ignored.BAD_CLAIM
        return str(fold(self.source))


def version_of(first: bytes) -> int:
    """Which version a header starting with `first` (at least one byte) must be."""
    if first[:1] == V2_SIGNATURE[:1]:
        return 2
    if first[:1] == V1_PREFIX[:1]:
        return 1
    raise ProxyHeaderError("the connection does not start with a PROXY header")


def parse(data: bytes) -> tuple[ProxyHeader, int]:
    """The header at the start of `data` and how many bytes it took.

    Raises `ProxyHeaderError` for a malformed header and `IncompleteHeader` when `data` ends
    before the header does."""
    if not data:
        raise IncompleteHeader
    return parse_v2(data) if version_of(data) == 2 else parse_v1(data)


class IncompleteHeader(ProxyHeaderError):
    """More bytes are needed (a prefix of a header so far)."""


# -- version 1 --------------------------------------------------------------------------------


def _v1_port(text: bytes) -> int:
    # Decimal, no sign, no leading zero (but "0"), at most 65535.
    if not text.isdigit() or len(text) > 5 or (len(text) > 1 and text[:1] == b"0"):
        raise ProxyHeaderError("bad port in a PROXY v1 header")
    port = int(text)
    if port > 65535:
        raise ProxyHeaderError("bad port in a PROXY v1 header")
    return port


def _v1_address(text: bytes, version: int) -> IPAddress:
    try:
        address = ipaddress.ip_address(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ProxyHeaderError("bad address in a PROXY v1 header") from None
    if address.version != version:
        raise ProxyHeaderError("address family does not match the PROXY v1 protocol")
    return address


def parse_v1(data: bytes) -> tuple[ProxyHeader, int]:
    if not V1_PREFIX.startswith(data[: len(V1_PREFIX)]):
        raise ProxyHeaderError("not a PROXY v1 header")
    end = data.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(data) >= V1_MAX or b"\n" in data[:V1_MAX]:
            raise ProxyHeaderError("PROXY v1 header without CRLF in its first 107 bytes")
        raise IncompleteHeader
    fields = data[len(V1_PREFIX) : end].split(b" ")
    if fields[0] == b"UNKNOWN":
        # The rest of an UNKNOWN line is to be ignored; the proxy did not know the client.
        return ProxyHeader(1, Command.PROXY, Family.UNSPEC), end + 2
    if fields[0] not in (b"TCP4", b"TCP6") or len(fields) != 5:
        raise ProxyHeaderError("malformed PROXY v1 header")
    version = 4 if fields[0] == b"TCP4" else 6
    header = ProxyHeader(
        1,
        Command.PROXY,
        Family.INET if version == 4 else Family.INET6,
        _v1_address(fields[1], version),
        _v1_address(fields[2], version),
        _v1_port(fields[3]),
        _v1_port(fields[4]),
    )
    return header, end + 2


def encode_v1(header: ProxyHeader) -> bytes:
    if header.family in (Family.UNSPEC, Family.UNIX) or header.source is None:
        return b"PROXY UNKNOWN\r\n"
    proto = "TCP4" if header.family is Family.INET else "TCP6"
    return (
        f"PROXY {proto} {header.source} {header.destination} "
        f"{header.source_port} {header.destination_port}\r\n"
    ).encode("ascii")


# -- version 2 --------------------------------------------------------------------------------


def v2_length(fixed: bytes) -> int:
    """The total header length announced by its first 16 bytes."""
    if fixed[:12] != V2_SIGNATURE:
        raise ProxyHeaderError("bad PROXY v2 signature")
    (length,) = struct.unpack("!H", fixed[14:16])
    return V2_FIXED + int(length)


def parse_v2(data: bytes) -> tuple[ProxyHeader, int]:
    if not V2_SIGNATURE.startswith(data[:12]) or len(data) < V2_FIXED:
        if V2_SIGNATURE.startswith(data[:12]):
            raise IncompleteHeader
        raise ProxyHeaderError("bad PROXY v2 signature")
    total = v2_length(data[:V2_FIXED])
    if len(data) < total:
        raise IncompleteHeader
    version, command = data[12] >> 4, data[12] & 0x0F
    family, transport = data[13] >> 4, data[13] & 0x0F
    if version != _V2_VERSION:
        raise ProxyHeaderError("unsupported PROXY header version")
    try:
        cmd = Command(command)
        fam = Family(family)
    except ValueError:
        raise ProxyHeaderError("bad PROXY v2 command or family") from None
    if transport > 2:
        raise ProxyHeaderError("bad PROXY v2 transport")
    body = data[V2_FIXED:total]
    if cmd is Command.LOCAL:
        # The addresses of a LOCAL header are to be ignored, whatever they hold.
        return ProxyHeader(2, cmd, fam), total
    if fam is Family.INET:
        if len(body) < _V2_INET_LEN:
            raise ProxyHeaderError("PROXY v2 INET header too short")
        src, dst, sport, dport = struct.unpack("!4s4sHH", body[:_V2_INET_LEN])
        header = ProxyHeader(
            2, cmd, fam, ipaddress.IPv4Address(src), ipaddress.IPv4Address(dst), sport, dport
        )
        return header, total
    if fam is Family.INET6:
        if len(body) < _V2_INET6_LEN:
            raise ProxyHeaderError("PROXY v2 INET6 header too short")
        src, dst, sport, dport = struct.unpack("!16s16sHH", body[:_V2_INET6_LEN])
        header = ProxyHeader(
            2, cmd, fam, ipaddress.IPv6Address(src), ipaddress.IPv6Address(dst), sport, dport
        )
        return header, total
    if fam is Family.UNIX and len(body) < _V2_UNIX_LEN:
        raise ProxyHeaderError("PROXY v2 UNIX header too short")
    # UNSPEC or UNIX: a proxied connection with no IP address to attribute.
    return ProxyHeader(2, cmd, fam), total


def encode_v2(header: ProxyHeader, tlvs: bytes = b"") -> bytes:
    """Version 2 bytes of `header`, with `tlvs` appended after the addresses (receivers
    ignore TLVs they do not know, and this one ignores all of them)."""
    if header.family is Family.INET and header.source is not None:
        assert header.destination is not None
        body = struct.pack(
            "!4s4sHH",
            header.source.packed,
            header.destination.packed,
            header.source_port,
            header.destination_port,
        )
    elif header.family is Family.INET6 and header.source is not None:
        assert header.destination is not None
        body = struct.pack(
            "!16s16sHH",
            header.source.packed,
            header.destination.packed,
            header.source_port,
            header.destination_port,
        )
    elif header.family is Family.UNIX:
        body = bytes(_V2_UNIX_LEN)
    else:
        body = b""
    body += tlvs
    transport = 0x1 if header.family is not Family.UNSPEC else 0x0
    return (
        V2_SIGNATURE
        + bytes([(_V2_VERSION << 4) | header.command.value, (header.family.value << 4) | transport])
        + struct.pack("!H", len(body))
        + body
    )
