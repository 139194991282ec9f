"""Origin attribution, pure: PROXY v1/v2 headers, x-forwarded-for, sources, the decision."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.origin_sources import MappedPrefixTooShort, Sources, fold
from gateway.listeners.origin import (
    MAX_XFF_ENTRY_BYTES,
    Attribution,
    Ignored,
    attribute,
    bare_ip,
    forwarded_claim,
    peer_address,
)
from gateway.listeners.proxy_header import (
    V2_SIGNATURE,
    Command,
    Family,
    IncompleteHeader,
    ProxyHeader,
    ProxyHeaderError,
    encode_v1,
    encode_v2,
    parse,
)

ipv4 = st.builds(ipaddress.IPv4Address, st.integers(0, 2**32 - 1))
ipv6 = st.builds(ipaddress.IPv6Address, st.integers(0, 2**128 - 1))
ports = st.integers(0, 65535)


@st.composite
def proxied(draw: st.DrawFn) -> ProxyHeader:
    family = draw(st.sampled_from([Family.INET, Family.INET6]))
    addresses = ipv4 if family is Family.INET else ipv6
    return ProxyHeader(
        draw(st.sampled_from([1, 2])),
        Command.PROXY,
        family,
        draw(addresses),
        draw(addresses),
        draw(ports),
        draw(ports),
    )


# -- PROXY headers ------------------------------------------------------------------------------


@given(proxied(), st.binary(max_size=64))
def test_v1_round_trip_and_nothing_past_the_header_is_taken(
    header: ProxyHeader, tail: bytes
) -> None:
    data = encode_v1(header)
    parsed, used = parse(data + tail)
    assert used == len(data)
    assert parsed == ProxyHeader(1, *_fields(header))
    assert parsed.claim() == str(fold(header.source))  # type: ignore[arg-type]


@given(proxied(), st.binary(max_size=40), st.binary(max_size=64))
def test_v2_round_trip_with_tlvs_and_trailing_bytes(
    header: ProxyHeader, tlvs: bytes, tail: bytes
) -> None:
    data = encode_v2(header, tlvs)
    parsed, used = parse(data + tail)
    assert used == len(data)
    assert parsed == ProxyHeader(2, *_fields(header))


def _fields(header: ProxyHeader) -> tuple[object, ...]:
    return (
        header.command,
        header.family,
        header.source,
        header.destination,
        header.source_port,
        header.destination_port,
    )


@given(proxied(), st.data())
def test_every_proper_prefix_is_incomplete(header: ProxyHeader, data: st.DataObject) -> None:
    encoded = encode_v2(header) if header.version == 2 else encode_v1(header)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(IncompleteHeader):
        parse(encoded[:cut])


@given(st.binary(min_size=1, max_size=200))
def test_arbitrary_bytes_never_crash_the_parser(data: bytes) -> None:
    try:
        header, used = parse(data)
    except ProxyHeaderError:
        return
    assert 0 < used <= len(data)
    assert isinstance(header.claim(), str | Ignored)


def test_v1_ipv4_mapped_source_is_folded() -> None:
    header, _ = parse(b"PROXY TCP6 ::ffff:10.1.2.3 ::1 5000 443\r\n")
    assert header.claim() == "10.1.2.3"


@pytest.mark.parametrize(
    ("data", "claim"),
    [
        (b"PROXY UNKNOWN\r\n", Ignored.BAD_CLAIM),
        (b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n", Ignored.BAD_CLAIM),
        (encode_v2(ProxyHeader(2, Command.LOCAL, Family.UNSPEC)), Ignored.NO_CLAIM),
        # LOCAL: a health check of the proxy itself; its addresses are ignored.
        (
            encode_v2(
                ProxyHeader(
                    2,
                    Command.LOCAL,
                    Family.INET,
                    ipaddress.IPv4Address("1.2.3.4"),
                    ipaddress.IPv4Address("5.6.7.8"),
                    1,
                    2,
                )
            ),
            Ignored.NO_CLAIM,
        ),
        (encode_v2(ProxyHeader(2, Command.PROXY, Family.UNSPEC)), Ignored.BAD_CLAIM),
        (encode_v2(ProxyHeader(2, Command.PROXY, Family.UNIX)), Ignored.BAD_CLAIM),
    ],
)
def test_headers_without_a_usable_address(data: bytes, claim: Ignored) -> None:
    header, used = parse(data)
    assert used == len(data)
    assert header.claim() is claim


@pytest.mark.parametrize(
    "data",
    [
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n",  # LF without CR
        b"PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n",  # short form
        b"PROXY TCP4 ::1 ::1 1 2\r\n",  # family mismatch
        b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",  # leading zero
        b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
        b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n",  # double space
        b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
        b"PROXY " + b"A" * 120,  # no CRLF within 107 bytes
        b"GET / HTTP/1.1\r\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"\x16\x03\x01\x02\x00",  # a TLS ClientHello
        V2_SIGNATURE + bytes([0x11, 0x11, 0, 4]) + b"\0" * 4,  # INET body too short
        V2_SIGNATURE + bytes([0x31, 0x11, 0, 12]) + b"\0" * 12,  # version 3
        V2_SIGNATURE + bytes([0x22, 0x11, 0, 12]) + b"\0" * 12,  # command 2
        V2_SIGNATURE + bytes([0x21, 0x41, 0, 12]) + b"\0" * 12,  # family 4
        V2_SIGNATURE + bytes([0x21, 0x13, 0, 12]) + b"\0" * 12,  # transport 3
        b"\r\n\r\n\x00\r\nQUIX\n" + b"\0" * 4,
    ],
)
def test_malformed_headers_are_errors(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError) as caught:
        parse(data)
    assert not isinstance(caught.value, IncompleteHeader)


# -- x-forwarded-for ------------------------------------------------------------------------------

ip_text = st.one_of(ipv4.map(str), ipv6.map(str))
junk = st.text(alphabet=st.characters(blacklist_characters=","), max_size=300)


@given(st.lists(st.one_of(ip_text, junk), max_size=6), ip_text, st.integers(0, 5), st.data())
def test_the_entry_trusted_hops_from_the_right_is_the_claim(
    left: list[str], chosen: str, hops: int, data: st.DataObject
) -> None:
    right = data.draw(st.lists(ip_text, min_size=hops, max_size=hops))
    entries = [*left, f" \t{chosen}\t ", *right]
    # However the proxies split the entries over repeated lines, the claim is the same.
    cuts = (
        sorted(data.draw(st.sets(st.integers(1, len(entries) - 1), max_size=3)))
        if len(entries) > 1
        else []
    )
    lines = [",".join(entries[a:b]) for a, b in zip([0, *cuts], [*cuts, len(entries)], strict=True)]
    assert forwarded_claim(lines, hops) == str(fold(ipaddress.ip_address(chosen)))


@given(st.lists(ip_text, max_size=4), st.integers(0, 6))
def test_fewer_entries_than_hops_plus_one_is_bad_claim(entries: list[str], hops: int) -> None:
    claim = forwarded_claim([",".join(entries)] if entries else [], hops)
    if not entries:
        assert claim is Ignored.NO_CLAIM
    elif len(entries) < hops + 1:
        assert claim is Ignored.BAD_CLAIM
    else:
        assert isinstance(claim, str)


@pytest.mark.parametrize(
    ("entry", "result"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("  203.0.113.9\t", None),  # bare_ip itself does not trim; forwarded_claim does
        ("2001:db8::1", "2001:db8::1"),
        ("2001:DB8:0:0::1", "2001:db8::1"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("fe80::1%eth0", "fe80::1"),
        ("fe80::1%", None),
        ("10.0.0.1%eth0", None),
        ("203.0.113.9:443", None),
        ("[2001:db8::1]", None),
        ("[2001:db8::1]:443", None),
        ("1.2.3", None),
        ("01.2.3.4", None),
        ("unknown", None),
        ("", None),
        ("_hidden", None),
    ],
)
def test_bare_ip(entry: str, result: str | None) -> None:
    assert bare_ip(entry) == result


def test_an_entry_over_64_bytes_is_bad_however_valid() -> None:
    long_zone = "fe80::1%" + "e" * (MAX_XFF_ENTRY_BYTES - 8)
    assert bare_ip(long_zone) == "fe80::1"
    assert bare_ip(long_zone + "e") is None
    assert forwarded_claim([f"1.1.1.1, {long_zone}e"], 0) is Ignored.BAD_CLAIM


def test_a_huge_left_part_is_never_examined() -> None:
    assert forwarded_claim(["x" * 100_000 + ",,,," + ", 192.0.2.7"], 0) == "192.0.2.7"
    assert forwarded_claim(["192.0.2.7,"], 0) is Ignored.BAD_CLAIM


# -- sources and the decision ---------------------------------------------------------------------


def test_sources_match_addresses_and_networks_after_folding() -> None:
    sources = Sources.of(
        [
            ipaddress.ip_address("10.0.0.5"),
            ipaddress.ip_network("10.1.0.0/24"),
            ipaddress.ip_network("2001:db8::/32"),
            ipaddress.ip_network("::ffff:10.2.0.0/112"),
            ipaddress.ip_address("::ffff:10.3.0.1"),
        ]
    )
    for peer in ("10.0.0.5", "10.1.0.9", "2001:db8::77", "10.2.3.4", "10.3.0.1", "::ffff:10.0.0.5"):
        assert sources.trusts(peer), peer
    for peer in ("10.0.0.6", "10.1.1.1", "2001:db9::1", "not an ip", ""):
        assert not sources.trusts(peer), peer
    assert len(sources) == 5


@pytest.mark.parametrize("network", ["::ffff:0:0/96", "::/80", "::/64", "::/0"])
def test_mapped_networks_of_prefix_96_or_less_are_refused(network: str) -> None:
    with pytest.raises(MappedPrefixTooShort):
        Sources.of([ipaddress.ip_network(network)])


def test_peer_address_is_bare_and_folded() -> None:
    assert peer_address("::ffff:127.0.0.1") == "127.0.0.1"
    assert peer_address("fe80::1%lo") == "fe80::1"
    assert peer_address("/tmp/sock") == "/tmp/sock"


@pytest.mark.parametrize(
    ("trusted", "claim", "expected"),
    [
        # who connected decides: an untrusted peer's claim is ignored, the call served
        (False, "198.51.100.4", Attribution("10.9.9.9", Ignored.UNTRUSTED_SOURCE)),
        (False, Ignored.BAD_CLAIM, Attribution("10.9.9.9", Ignored.UNTRUSTED_SOURCE)),
        (False, Ignored.NO_CLAIM, Attribution("10.9.9.9", Ignored.UNTRUSTED_SOURCE)),
        (False, None, Attribution("10.9.9.9")),
        # a trusted proxy: its claim, or "not observed", never its own address
        (True, "198.51.100.4", Attribution("198.51.100.4")),
        (True, Ignored.BAD_CLAIM, Attribution("", Ignored.BAD_CLAIM)),
        (True, Ignored.NO_CLAIM, Attribution("", Ignored.NO_CLAIM)),
        (True, None, Attribution("", Ignored.NO_CLAIM)),
    ],
)
def test_the_decision_table(
    trusted: bool, claim: str | Ignored | None, expected: Attribution
) -> None:
    assert attribute("10.9.9.9", trusted, claim) == expected
