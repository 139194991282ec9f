"""Keys of registration replay and of held stream-status notifications ("Upstream client
tuning"). The manual gives each a default and "an invalid value falls back to the default
with a warning naming the key", but no bounds: the bounds are ours."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import IntRange, OrUndefined
from gateway.config.schema import Key
from gateway.config.terms import Atom

AREA = "replay"
_START = "upstream client start"
_MS = IntRange(1, 3_600_000)


def _tuning(name: str, default: int, convert: IntRange, doc: str) -> Key[int]:
    return Key(
        name=name,
        default=default,
        convert=convert,
        read_when=_START,
        doc=doc,
        area=AREA,
        our_choices=("valid values",),
    )


REGISTRATION_REPLAY_SESSION_GUARD_MS = _tuning(
    "registration_replay_session_guard_ms",
    10000,
    IntRange(0, 3_600_000),
    "A session younger than this is not replayed. Advice: at least 5000 plus the replay RPC time.",
)
REGISTRATION_REPLAY_QUEUE_MAX = _tuning(
    "registration_replay_queue_max",
    10000,
    IntRange(1, 1_000_000),
    "Cap of the replay queue (caps verdict appends only).",
)
REGISTRATION_REPLAY_SPACING_MS = _tuning(
    "registration_replay_spacing_ms",
    20,
    IntRange(0, 60000),
    "Accepted for compatibility and not used: replays are paced by the replay permits (at a"
    " 20 ms gap a 5,000-session replay would take 100 s, ten times the permits' bound).",
)
REGISTRATION_REPLAY_START_JITTER_MS = _tuning(
    "registration_replay_start_jitter_ms",
    1000,
    IntRange(0, 60000),
    "Upper bound of the random delay before a replay starts.",
)
NOTIFY_PROBE_TIMEOUT_MS = _tuning(
    "notify_probe_timeout_ms",
    15000,
    IntRange(100, 3_600_000),
    "Deadline of the half-open probe. Below about 5000 it kills probes that would have answered.",
)
# The cap on held stream-status notification keys. Its default depends on the agent listeners
# (3 per connection they admit, at least 15,000), so the key holds `undefined` until set and the
# tree resolves it for the upstream actor (gateway/node/children/upstream.py,
# `notify_pending_max`). The upper bound only refuses the absurd: at about 0.9 KB a key, 10
# million keys is 9 GB.
NOTIFY_PENDING_MAX: Key[int | None] = Key(
    name="notify_pending_max",
    default=Atom("undefined"),
    convert=OrUndefined(IntRange(1, 10_000_000)),
    read_when=_START,
    doc="Cap on held stream-status notification keys (about 0.9 KB each). A DISCONNECTED at the"
    " cap evicts the oldest held CONNECTED; anything else new is dropped (at_capacity).",
    area=AREA,
    our_choices=("valid values",),
    default_doc="3 x the sum of the agent listeners' limits.max_connections, at least 15000"
    " (15000 with no agent listener; 180000 for the shipped 60000 connections)",
)
NOTIFY_UNACKED_RETRY_BASE_MS = _tuning(
    "notify_unacked_retry_base_ms",
    1000,
    _MS,
    "First resend delay of a notification the server did not record.",
)
NOTIFY_UNACKED_RETRY_MAX_MS = _tuning(
    "notify_unacked_retry_max_ms", 60000, _MS, "Cap of that resend delay."
)
NOTIFY_UNACKED_SLOW_AFTER_MS = _tuning(
    "notify_unacked_slow_after_ms",
    900000,
    _MS,
    "After this long unrecorded, a CONNECTED notice is resent slowly.",
)
NOTIFY_UNACKED_SLOW_MAX_MS = _tuning(
    "notify_unacked_slow_max_ms", 600000, _MS, "Cap of the slow resend delay."
)
NOTIFY_UNACKED_DISCONNECTED_WINDOW_MS = _tuning(
    "notify_unacked_disconnected_window_ms",
    120000,
    _MS,
    "How long an unrecorded DISCONNECTED notice is resent.",
)

KEYS: tuple[Key[Any], ...] = (
    REGISTRATION_REPLAY_SESSION_GUARD_MS,
    REGISTRATION_REPLAY_QUEUE_MAX,
    REGISTRATION_REPLAY_SPACING_MS,
    REGISTRATION_REPLAY_START_JITTER_MS,
    NOTIFY_PENDING_MAX,
    NOTIFY_PROBE_TIMEOUT_MS,
    NOTIFY_UNACKED_RETRY_BASE_MS,
    NOTIFY_UNACKED_RETRY_MAX_MS,
    NOTIFY_UNACKED_SLOW_AFTER_MS,
    NOTIFY_UNACKED_SLOW_MAX_MS,
    NOTIFY_UNACKED_DISCONNECTED_WINDOW_MS,
)
