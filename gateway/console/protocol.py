"""The remote console's wire: what the node and `yuzu-gw` say to each other on the console
socket before (and, for one-shot modes, instead of) an interactive session.

Rules of this file: no I/O and no node state, so the node and the client share it and the
handshake is tested by feeding it bytes.

Theory of operation. Every frame before the session is one JSON object on one line.

1. node   -> client  `{"console": 1, "nonce": "<64 hex>"}`
2. client -> node    `{"mode": "ping" | "eval" | "console", "mac": "<hex>", "source": "..."}`
   where `mac` is HMAC-SHA256 keyed by the cookie over `MAC_LABEL + nonce`; `source` only
   for `eval`.
3. node   -> client  `{"ok": false, "error": "..."}` (refused) and the node closes; or
   `{"ok": true, ...}`: for `ping` (`node`, `pid`) and `eval` (`result`, the value's repr,
   or `raised`, the traceback; and `output`, what the code printed) that line is the whole
   answer and the node closes; for `console` (`node`) the rest of the connection is the
   interactive session as text.

The cookie itself never crosses the socket, and a fresh nonce per connection means a
recorded answer is worth nothing on the next connection.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any, Literal

import attrs

VERSION = 1
Mode = Literal["ping", "eval", "console"]
MODES: frozenset[str] = frozenset({"ping", "eval", "console"})

# 32 random bytes: the same strength the cookie floor asks for (32 characters).
NONCE_BYTES = 32
# Domain separation: an answer computed for this handshake cannot be replayed to any other
# place that may one day key an HMAC with the same cookie (the distribution handshake).
MAC_LABEL = b"yuzu_gw console v1\0"
# One frame holds at most an eval source; 1 MiB is far past any expression typed by hand and
# small enough that a client cannot make the node buffer without bound.
MAX_FRAME_BYTES = 1 << 20


class ProtocolError(Exception):
    """A frame that is not what this step of the handshake expects."""


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def mac(cookie: str, nonce: bytes) -> str:
    return hmac.new(cookie.encode(), MAC_LABEL + nonce, hashlib.sha256).hexdigest()


def verify(cookie: str, nonce: bytes, answer: str) -> bool:
    # compare_digest: the time taken must not tell an attacker how many characters matched.
    return hmac.compare_digest(mac(cookie, nonce), answer)


def encode(frame: dict[str, Any]) -> bytes:
    return json.dumps(frame, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        frame = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        raise ProtocolError("a frame is not JSON") from None
    if not isinstance(frame, dict):
        raise ProtocolError("a frame is not a JSON object")
    return frame


def hello(nonce: bytes) -> bytes:
    return encode({"console": VERSION, "nonce": nonce.hex()})


def read_hello(line: bytes) -> bytes:
    frame = decode(line)
    if frame.get("console") != VERSION:
        raise ProtocolError(f"not a yuzu_gw console (or version {frame.get('console')!r})")
    try:
        return bytes.fromhex(str(frame["nonce"]))
    except (KeyError, ValueError):
        raise ProtocolError("the greeting carries no nonce") from None


@attrs.frozen
class Request:
    mode: Mode
    mac: str
    source: str = ""


def request(cookie: str, nonce: bytes, mode: Mode, source: str = "") -> bytes:
    frame: dict[str, Any] = {"mode": mode, "mac": mac(cookie, nonce)}
    if mode == "eval":
        frame["source"] = source
    return encode(frame)


def read_request(line: bytes) -> Request:
    frame = decode(line)
    mode, answer, source = frame.get("mode"), frame.get("mac"), frame.get("source", "")
    if mode not in MODES:
        raise ProtocolError(f"unknown mode {mode!r}")
    if not isinstance(answer, str) or not isinstance(source, str):
        raise ProtocolError("mac and source must be strings")
    return Request(mode, answer, source)  # type: ignore[arg-type]  (checked against MODES)


def refusal(error: str) -> bytes:
    return encode({"ok": False, "error": error})


def accepted(**fields: Any) -> bytes:
    return encode({"ok": True, **fields})
