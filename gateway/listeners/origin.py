"""Which address a call is attributed to: the pure rules of the `origin` option.

Rules of this module (seed: "Client addresses behind a proxy"):

- The decision is made by who connected, never by whether a claim matches the connection: a
  claim (a PROXY header, an x-forwarded-for entry) is believed only when the TCP peer is one
  of the listener's `sources`.
- A trusted peer whose claim is absent or unusable gives "not observed" (the empty string),
  never the proxy's own address, and the outcome `no_claim` / `bad_claim` is counted.
- A claim from a peer that is not a source is ignored, not refused: the call is served and
  attributed to the TCP peer, and `untrusted_source` is counted.
- Addresses are bare IPs (no port, no brackets); IPv4-mapped IPv6 addresses are folded to
  IPv4, in peers, claims and `sources` alike (the option's values, `Mode` and `Sources`, are
  gateway/config/origin_sources.py).

Nothing here does I/O or reads a clock; `protocol.py` calls `attribute` once per RPC stream.
"""

from __future__ import annotations

import enum
import ipaddress

import attrs

from gateway.config.origin_sources import fold

# Seed: a selected x-forwarded-for entry over 64 bytes is bad_claim "however valid it is".
MAX_XFF_ENTRY_BYTES = 64
XFF_HEADER = "x-forwarded-for"


class Ignored(enum.Enum):
    """Why a claim was not used: the `reason` label of yuzu_gw_grpc_origin_ignored_total."""

    UNTRUSTED_SOURCE = "untrusted_source"
    NO_CLAIM = "no_claim"
    BAD_CLAIM = "bad_claim"


# A claim as read from the wire: a usable address, or why there is none.
Claim = str | Ignored


def peer_address(host: str) -> str:
    """The TCP peer as the bare, folded IP text; a zone (`%eth0`) is dropped."""
    try:
        return str(fold(ipaddress.ip_address(host.partition("%")[0])))
    except ValueError:
        # Not an IP socket address (a unix socket in a test): keep it as the kernel gave it.
        return host


# -- x-forwarded-for ----------------------------------------------------------------------


def bare_ip(text: str) -> str | None:
    """`text` as a bare IP address in canonical form, or None.

    Strict on purpose (seed, "forwarded_for"): no port, no brackets, no leading zeros, no
    short forms such as 1.2.3; Python's parser refuses all of those. A scoped IPv6 entry
    (fe80::1%eth0) is read without its zone, as Erlang's address parser reads it."""
    if len(text.encode("utf-8", "surrogateescape")) > MAX_XFF_ENTRY_BYTES:
        return None
    host, percent, zone = text.partition("%")
    if percent and (not zone or ":" not in host):
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return str(fold(address))


def forwarded_claim(values: list[str], trusted_hops: int) -> Claim:
    """The claim of the x-forwarded-for lines of one request.

    Repeated lines are joined with `,` in order, so the entry the nearest proxy added is the
    last one. Only the entry `trusted_hops` places from the right is examined; everything to
    its left is ignored whatever its length, count or bytes (`rsplit` with a bound never
    looks at it), so a client cannot spoil the claim with a long or malformed header."""
    if not values:
        return Ignored.NO_CLAIM
    joined = ",".join(values)
    parts = joined.rsplit(",", trusted_hops + 1)
    if len(parts) < trusted_hops + 1:
        return Ignored.BAD_CLAIM
    entry = parts[-(trusted_hops + 1)].strip(" \t")
    address = bare_ip(entry)
    return Ignored.BAD_CLAIM if address is None else address


# -- the decision ---------------------------------------------------------------------------


@attrs.frozen
class Attribution:
    """`address` is what the server is told: a bare IP, or "" for "not observed";
    `ignored` is the counter's reason when a claim was not used."""

    address: str
    ignored: Ignored | None = None


def attribute(peer: str, trusted: bool, claim: Claim | None) -> Attribution:
    """The seed's table "What the server is told, by who connected".

    `claim` None means the request carried no claim at all (no x-forwarded-for line); a PROXY
    header is always a claim, `Ignored.NO_CLAIM` for a LOCAL one."""
    if not trusted:
        return Attribution(peer, Ignored.UNTRUSTED_SOURCE if claim is not None else None)
    if claim is None:
        return Attribution("", Ignored.NO_CLAIM)
    if isinstance(claim, Ignored):
        return Attribution("", claim)
    return Attribution(claim)
