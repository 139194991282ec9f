"""The heartbeat verdict: what the heartbeat buffer reads in every successful BatchHeartbeat answer.

Rules of this file: which listed session ids are passed to the registration replay, which are
counted and dropped, when the truncated flag is logged, and when the verdict is not cast at all.
Nothing here does I/O or reads a clock: `read` takes `now` and the upstream actor's mailbox length
and returns effects (`Cast`, `Count`, `LogLine`) for the buffer actor.

Theory of operation (seed: "BatchHeartbeat Message"; "What happens when the server restarts" >
"Telling that the reconcile is not converging" and "Details of what these runs showed" (E6);
SPEC_INDEX HB-13, HB-14, RP-01, RP-02, RP-18, K07, K08, K25, K26, L29, L30):

* An id is kept when it is 1 to 64 bytes (UTF-8); any other listed id is counted `malformed`,
  once per occurrence. Only the length is checked: what the server may list is what it got.
* The kept ids are de-duplicated and sorted, and at most 4096 of them are passed on (the
  server's own cap). The ids beyond it are neither passed nor counted: later heartbeats name
  them again.
* `unknown_session_ids_truncated` counts `yuzu_gw_heartbeat_unknown_truncated_total` every time;
  its WARN is logged at most once per 60 s per buffer process and ends with `suppressed N`, the
  occurrences since the last WARN (a new process starts at `suppressed 0`). The truncated flag is
  passed on: it is evidence that the server lost its state (actors/core/replay_queue.py).
* An empty list without the flag changes nothing: an older server's answer looks the same.
* The cast (`HeartbeatVerdict`, to the `upstream` actor) is skipped when that actor's mailbox
  holds more than 100 messages: every passed id is counted `queue_full`, with one DEBUG line. A
  verdict while no upstream actor runs is not cast either (a restart gap; one DEBUG line).

`circuit_open` and `not_local` are the upstream actor's to count (it holds the breaker and knows
which sessions the node holds), as is `queue_full` for a full replay queue.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import attrs

from actors.core import Count, LogLine

__all__ = [
    "DROP_REASONS",
    "MAILBOX_LIMIT",
    "MAX_IDS",
    "MAX_ID_BYTES",
    "TRUNCATED_WARN",
    "TRUNCATED_WARN_S",
    "UNKNOWN_TRUNCATED",
    "VERDICT_DROPPED",
    "Cast",
    "DropReason",
    "HeartbeatVerdict",
    "VerdictEffect",
    "VerdictReader",
    "id_fits",
]

# --- numbers ------------------------------------------------------------------------------------

# K08: a session id the gateway can use is 1 to 64 bytes; the server never lists longer ones.
MAX_ID_BYTES = 64
# K07: the server lists at most 4096 ids an answer; the gateway passes on no more than that.
MAX_IDS = 4096
# K25: a longer upstream mailbox means the upstream actor is behind (a registration storm); a
# verdict would only wait there, and the sessions are listed again by later heartbeats.
MAILBOX_LIMIT = 100
# K26: a recovery of several rounds truncates every flush; one WARN a minute says it.
TRUNCATED_WARN_S = 60.0

# --- families and lines -------------------------------------------------------------------------

VERDICT_DROPPED = "yuzu_gw_heartbeat_verdict_dropped_total"  # M34, label reason
UNKNOWN_TRUNCATED = "yuzu_gw_heartbeat_unknown_truncated_total"  # M35

DropReason = Literal["malformed", "not_local", "circuit_open", "queue_full"]
DROP_REASONS: tuple[DropReason, ...] = ("malformed", "not_local", "circuit_open", "queue_full")

# L30 names the first words and the suffix; the rest is this rebuild's.
TRUNCATED_WARN = (
    "Heartbeat verdict truncated by the server: more than 4096 unknown sessions in one answer;"
    " the rest are listed again by later heartbeats (suppressed {n})"
)
# L29, quoted.
LISTED_DEBUG = "Heartbeat verdict: {n} unknown session(s) listed, {m} malformed"
SKIPPED_DEBUG = (
    "Heartbeat verdict of {n} session(s) not passed on: the upstream mailbox holds {len}"
    " messages (more than 100)"
)
NO_UPSTREAM_DEBUG = "Heartbeat verdict of {n} session(s) not passed on: no upstream process"


# --- records ------------------------------------------------------------------------------------


@attrs.frozen
class HeartbeatVerdict:
    """Cast to the `upstream` actor: the sessions the server does not hold, from a batch of
    `batch` heartbeats (sorted, distinct, at most 4096), and the server's truncated flag."""

    session_ids: tuple[str, ...] = attrs.field(repr=lambda ids: f"<{len(ids)} session ids>")
    batch: int = 0
    truncated: bool = False


@attrs.frozen
class Cast:
    """Send `verdict` to the upstream actor."""

    verdict: HeartbeatVerdict


VerdictEffect = Cast | Count | LogLine


def id_fits(session_id: str) -> bool:
    """1 to 64 bytes. `surrogatepass`: a test may hand over any str; the length is what counts."""
    return 0 < len(session_id.encode("utf-8", "surrogatepass")) <= MAX_ID_BYTES


def _dropped(reason: DropReason, n: int) -> Count:
    return Count(VERDICT_DROPPED, (("reason", reason),), n)


@attrs.define
class VerdictReader:
    """One per heartbeat buffer process: the truncated WARN's limiter lives here, so a restarted
    buffer starts again at `suppressed 0`."""

    warn_interval_s: float = TRUNCATED_WARN_S
    mailbox_limit: int = MAILBOX_LIMIT
    max_ids: int = MAX_IDS
    # Counts for the buffer's status.
    read_count: int = 0
    cast_count: int = 0
    skipped_count: int = 0
    truncated_count: int = 0
    _warned_at: float | None = None
    _suppressed: int = 0

    def read(
        self,
        listed: Iterable[str],
        truncated: bool,
        batch: int,
        now: float,
        upstream_mailbox: int | None,
    ) -> list[VerdictEffect]:
        """One successful answer's verdict. `upstream_mailbox`: the upstream actor's mailbox
        length, None when it is not running."""
        kept: set[str] = set()
        malformed = 0
        for session_id in listed:
            if id_fits(session_id):
                kept.add(session_id)
            else:
                malformed += 1
        if not kept and not malformed and not truncated:
            return []  # RP-01: nothing unknown, or an older server
        self.read_count += 1
        ids = tuple(sorted(kept)[: self.max_ids])
        effects: list[VerdictEffect] = [
            LogLine("debug", LISTED_DEBUG.format(n=len(ids), m=malformed))
        ]
        if malformed:
            effects.append(_dropped("malformed", malformed))
        if truncated:
            effects.extend(self._truncated(now))
        if not ids and not truncated:
            return effects
        if upstream_mailbox is None:
            self.skipped_count += 1
            effects.append(LogLine("debug", NO_UPSTREAM_DEBUG.format(n=len(ids))))
            return effects
        if upstream_mailbox > self.mailbox_limit:
            self.skipped_count += 1
            if ids:
                effects.append(_dropped("queue_full", len(ids)))
            text = SKIPPED_DEBUG.format(n=len(ids), len=upstream_mailbox)
            effects.append(LogLine("debug", text))
            return effects
        self.cast_count += 1
        effects.append(Cast(HeartbeatVerdict(ids, batch, truncated)))
        return effects

    def _truncated(self, now: float) -> list[VerdictEffect]:
        self.truncated_count += 1
        effects: list[VerdictEffect] = [Count(UNKNOWN_TRUNCATED)]
        if self._warned_at is not None and now - self._warned_at < self.warn_interval_s:
            self._suppressed += 1
            return effects
        effects.append(LogLine("warning", TRUNCATED_WARN.format(n=self._suppressed)))
        self._warned_at, self._suppressed = now, 0
        return effects

    def status(self) -> dict[str, int]:
        """Counts only."""
        return {
            "verdicts_read": self.read_count,
            "verdicts_cast": self.cast_count,
            "verdicts_skipped": self.skipped_count,
            "verdicts_truncated": self.truncated_count,
        }
