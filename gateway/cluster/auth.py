"""Mutual authentication of two nodes from the shared cookie (docs/cluster.md, "Transport").

A link starts with a challenge: the dialling node sends a fresh nonce `cn`; the dialled node
answers its own fresh nonce `sn`, its node id and `HMAC(cookie, "server"|cn|sn|node)`. The
dialler checks that proof (so it knows the dialled node has the cookie, for this link only:
`cn` is new). The answer also carries the cluster ports of the dialled node's host, `first+count`
(gateway/cluster/hosts.py), under a proof of their own, `HMAC(cookie, "host"|cn|sn|node|ports)`:
a dialler from before adverts checks the server proof alone, as it always did, and ignores them;
a dialler that reads them refuses the link when that proof is wrong. The dialler then signs
every call on the link with `HMAC(cookie, "call"|sn|seq|method)` and a sequence number; the
dialled node accepts a `(sn, seq)` once (`ReplayWindow`), so a captured call cannot be played
again. The cookie itself never crosses the wire.

A link's command stream (gateway/cluster/commands.py) is opened by one such signed call; each
of its frames is then sealed on its own: `HMAC(key, direction|kind|seq|id|body)` under a key
derived from that call's `(sn, seq)` (`stream_key`), with a sequence number per direction that
must be exactly the previous one plus one (`Opener`). A frame cannot be forged without the
cookie, altered, replayed, dropped, reordered, moved to another stream or link, or reflected
back to its sender; answers are sealed as commands are.

Pure: no sockets, no clock. HMAC-SHA256, compared in constant time.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
import struct

__all__ = [
    "MAX_LINKS",
    "MAX_SERVER_NONCES",
    "REPLAY_WINDOW",
    "UNAUTHENTICATED_DETAILS",
    "Opener",
    "ReplayWindow",
    "Sealer",
    "ServerNonces",
    "call_proof",
    "host_proof",
    "new_nonce",
    "parse_call_auth",
    "server_proof",
    "stream_key",
    "verify",
]

# The details of every UNAUTHENTICATED refusal (it says nothing of what was wrong).
UNAUTHENTICATED_DETAILS = "cluster authentication failed"
# 128-bit nonces: never repeated in practice, so a proof is never valid for another link.
NONCE_BYTES = 16
# Calls of one link may reach the handler slightly out of order (HTTP/2 streams are started in
# order, their tasks are not); a sequence number this far behind the highest seen is refused.
REPLAY_WINDOW = 4096
# Challenges answered but not yet used by a signed call; anyone can ask for one (Challenge is
# unauthenticated), so past this the oldest PENDING one is forgotten (its dialler's next call is
# refused UNAUTHENTICATED and it challenges again at its next round), never an established link.
MAX_SERVER_NONCES = 1024
# Established links (a nonce a call signed with the cookie has used): only a cookie holder can
# add one, so a flood of challenges or of badly signed calls never evicts a live link.
MAX_LINKS = 1024
# A sealed frame: kind (1 byte), sequence number and command id (8 bytes each), then the MAC.
FRAME_HEAD = struct.Struct(">cQQ")
MAC_BYTES = hashlib.sha256().digest_size


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def _mac(cookie: str, *parts: str) -> str:
    return hmac.new(cookie.encode(), "|".join(parts).encode(), hashlib.sha256).hexdigest()


def server_proof(cookie: str, client_nonce: str, server_nonce: str, node_id: str) -> str:
    return _mac(cookie, "server", client_nonce, server_nonce, node_id)


def host_proof(cookie: str, client_nonce: str, server_nonce: str, node_id: str, ports: str) -> str:
    """The proof of the host's ports (`HostAdvert.encode`) a challenge answer carries."""
    return _mac(cookie, "host", client_nonce, server_nonce, node_id, ports)


def call_proof(cookie: str, server_nonce: str, seq: int, method: str) -> str:
    return _mac(cookie, "call", server_nonce, str(seq), method)


def verify(expected: str, given: str) -> bool:
    return hmac.compare_digest(expected.encode(), given.encode())


def parse_call_auth(value: str) -> tuple[str, int, str] | None:
    """`sn.seq.mac` -> its parts, or None when malformed."""
    parts = value.split(".")
    if len(parts) != 3 or not parts[1].isdigit() or len(parts[1]) > 18:
        return None
    return parts[0], int(parts[1]), parts[2]


class ReplayWindow:
    """The sequence numbers of one link accepted so far (each at most once)."""

    __slots__ = ("_high", "_seen")

    def __init__(self) -> None:
        self._high = 0
        self._seen: set[int] = set()

    def accept(self, seq: int) -> bool:
        if seq <= 0 or seq <= self._high - REPLAY_WINDOW or seq in self._seen:
            return False
        self._seen.add(seq)
        self._high = max(self._high, seq)
        if len(self._seen) > 2 * REPLAY_WINDOW:
            floor = self._high - REPLAY_WINDOW
            self._seen = {s for s in self._seen if s > floor}
        return True


class ServerNonces:
    """The challenges this node answered: pending ones (at most `cap`, newest last) and the
    established links, those a correctly signed call has used (at most `links`)."""

    def __init__(self, cap: int = MAX_SERVER_NONCES, links: int = MAX_LINKS) -> None:
        self._cap = cap
        self._links_cap = links
        self._pending: collections.OrderedDict[str, ReplayWindow] = collections.OrderedDict()
        self._links: collections.OrderedDict[str, ReplayWindow] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._pending) + len(self._links)

    def issue(self) -> str:
        nonce = new_nonce()
        self._pending[nonce] = ReplayWindow()
        while len(self._pending) > self._cap:
            self._pending.popitem(last=False)
        return nonce

    def check(self, cookie: str, value: str, method: str) -> bool:
        """A call's `x-yuzu-cluster-auth` value: signed for `method` on a live challenge, and
        its sequence number not seen before. The first such call establishes the link."""
        parsed = parse_call_auth(value)
        if parsed is None:
            return False
        nonce, seq, mac = parsed
        window = self._links.get(nonce) or self._pending.get(nonce)
        if window is None or not verify(call_proof(cookie, nonce, seq, method), mac):
            return False
        if not window.accept(seq):
            return False
        if self._pending.pop(nonce, None) is not None:
            self._links[nonce] = window
            # Only cookie holders get here: their redials retire their own old links.
            while len(self._links) > self._links_cap:
                self._links.popitem(last=False)
        return True


def stream_key(cookie: str, server_nonce: str, seq: int) -> bytes:
    """The key of the command stream a signed call `(server_nonce, seq)` opened."""
    return hmac.digest(cookie.encode(), f"stream|{server_nonce}|{seq}".encode(), "sha256")


class Sealer:
    """Seals the frames one side sends on a command stream, numbered from 1."""

    __slots__ = ("_direction", "_key", "_seq")

    def __init__(self, key: bytes, direction: bytes) -> None:
        self._key = key
        self._direction = direction
        self._seq = 0

    def seal(self, kind: bytes, command_id: int, body: bytes) -> bytes:
        self._seq += 1
        head = FRAME_HEAD.pack(kind, self._seq, command_id)
        return head + hmac.digest(self._key, self._direction + head + body, "sha256") + body


class Opener:
    """Opens the frames one side receives: each sealed for this direction and numbered exactly
    one past the last one opened, else refused (None) and the stream is not to be trusted."""

    __slots__ = ("_direction", "_key", "_seq")

    def __init__(self, key: bytes, direction: bytes) -> None:
        self._key = key
        self._direction = direction
        self._seq = 0

    def open(self, data: bytes) -> tuple[bytes, int, bytes] | None:
        """(kind, command id, body), or None."""
        start = FRAME_HEAD.size + MAC_BYTES
        if len(data) < start:
            return None
        head, mac, body = data[: FRAME_HEAD.size], data[FRAME_HEAD.size : start], data[start:]
        kind, seq, command_id = FRAME_HEAD.unpack(head)
        expected = hmac.digest(self._key, self._direction + head + body, "sha256")
        if seq != self._seq + 1 or not hmac.compare_digest(expected, mac):
            return None
        self._seq = seq
        return kind, command_id, body
