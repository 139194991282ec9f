"""The certificate watcher's core: what one refresh of the configured certificate files means
for the pins, the gauges and the log (seed: "Certificate rotation and expiry"; SPEC_INDEX
CW-01..08, MG-11..14).

Pure: the actor reads every file and hands the bytes (or why a read failed) to `observe` with
the wall-clock time; `observe` returns effects. No I/O, no clock.

Rules:

- A file is parsed again only when the SHA-256 of its bytes changed; size and modification
  time are never looked at (a renewed key of the same type has the same size, and cp -p keeps
  the old time).
- Readable means the latest read parsed as PEM certificates. A file that turns unreadable keeps
  its last expiry; a file never readable has no expiry series; a notAfter that cannot be read
  removes the series with one warning and leaves the file readable.
- Several files under one role and name are one series: the earliest notAfter, readable only if
  every file is.
- A `{cert_file, Path}` pin pins the key of the first certificate in the file. A failed read
  keeps the last key read (last known good, no time limit); a file never readable pins nothing
  (fail closed). A different key replacing a previous one is a rotation: its wall time is
  published; the first key read, or the same key re-written, is not.
- A pin that has never resolved (a malformed `{spki_sha256, Hex}`, a pin file never readable)
  adds one to `pin_unresolved` on every refresh, so the alert sees it with or without traffic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import attrs

from actors.core import LogLine
from gateway.config.certs import PemError, certificates, earliest_not_after, spki_sha256
from gateway.config.mgmt_auth_settings import FilePin, Pin, SpkiPin

__all__ = [
    "PIN_ROLE",
    "CertWatch",
    "Effect",
    "PinRotated",
    "PinsUnresolved",
    "PublishPins",
    "ReadFailed",
    "SetGauges",
    "WatchedFile",
]

# The role label of a `{cert_file, Path}` pin; its name label is the path.
PIN_ROLE = "mgmt_peer_pin"


@attrs.frozen
class WatchedFile:
    """A certificate file and the labels it is reported under."""

    role: str
    name: str
    path: str


@attrs.frozen
class ReadFailed:
    """The stat or read of a file failed; `why` names the error, never the contents."""

    why: str


Read = bytes | ReadFailed


@attrs.frozen
class SetGauges:
    """Set the series of one role and name; `expiry` None means no expiry series."""

    role: str
    name: str
    readable: bool
    expiry: float | None


@attrs.frozen
class PublishPins:
    """The pin set the per-stream check reads from now on."""

    pins: frozenset[bytes]


@attrs.frozen
class PinRotated:
    """A pin file's key changed: the Unix time of `yuzu_gw_mgmt_pin_rotated_timestamp_seconds`."""

    at: float


@attrs.frozen
class PinsUnresolved:
    """`n` configured pins have never resolved (add to the counter)."""

    n: int


Effect = SetGauges | PublishPins | PinRotated | PinsUnresolved | LogLine


@attrs.define
class _File:
    """What the watcher knows of one path."""

    digest: bytes | None = None  # SHA-256 of the bytes of the last successful read
    parsed: bool = False  # those bytes parsed as PEM certificates
    problem: str = ""  # why they did not
    readable: bool = False  # the latest read parsed
    expiry: float | None = None  # last known earliest notAfter, kept while unreadable
    key: bytes | None = None  # SPKI hash of the first certificate, last known good
    seen: bool = False  # observed at least once (the first observation logs quietly)


@attrs.define
class CertWatch:
    """The state of every watched file across refreshes. It outlives a restarted watcher
    actor (gateway_sup creates it), so the last known good key survives the restart."""

    pins: tuple[Pin, ...]
    files: tuple[WatchedFile, ...] = ()  # the other certificate files (listeners, upstream)
    _state: dict[str, _File] = attrs.field(init=False, factory=dict)
    _warned_literals: bool = attrs.field(init=False, default=False)

    @property
    def watched(self) -> tuple[WatchedFile, ...]:
        pin_files = tuple(WatchedFile(PIN_ROLE, p.path, p.path) for p in self._file_pins())
        return tuple(dict.fromkeys(pin_files + self.files))

    def paths(self) -> tuple[str, ...]:
        """Every path to read on a refresh, each once."""
        return tuple(dict.fromkeys(w.path for w in self.watched))

    def observe(self, reads: Mapping[str, Read], wall: float) -> list[Effect]:
        """One refresh: `reads` holds the outcome of reading each of `paths()`."""
        effects: list[Effect] = []
        pin_paths = {p.path for p in self._file_pins()}
        for path in self.paths():
            effects += self._observe_file(path, reads[path], wall, path in pin_paths)
        effects += self._gauges()
        effects.append(PublishPins(self.resolved()))
        if not self._warned_literals:
            self._warned_literals = True
            effects += [
                LogLine(
                    "warning",
                    f"mgmt_peer_pins entry {index} ({{spki_sha256, ...}}) is not 64 hex digits:"
                    " it pins nothing",
                )
                for index, pin in enumerate(self.pins, 1)
                if isinstance(pin, SpkiPin) and pin.digest is None
            ]
        unresolved = self.unresolved()
        if unresolved:
            effects.append(PinsUnresolved(unresolved))
        return effects

    def resolved(self) -> frozenset[bytes]:
        """The keys pinned now: the literal pins and each pin file's last known good key."""
        keys = {p.digest for p in self.pins if isinstance(p, SpkiPin) and p.digest is not None}
        for pin in self._file_pins():
            known = self._state.get(pin.path)
            if known is not None and known.key is not None:
                keys.add(known.key)
        return frozenset(keys)

    def unresolved(self) -> int:
        count = 0
        for pin in self.pins:
            if isinstance(pin, SpkiPin):
                count += pin.digest is None
            else:
                known = self._state.get(pin.path)
                count += known is None or known.key is None
        return count

    # -- one file -------------------------------------------------------------------------

    def _file_pins(self) -> list[FilePin]:
        return [p for p in self.pins if isinstance(p, FilePin)]

    def _observe_file(self, path: str, read: Read, wall: float, pin: bool) -> list[Effect]:
        state = self._state.setdefault(path, _File())
        was_readable, first, old_key = state.readable, not state.seen, state.key
        state.seen = True
        effects: list[Effect] = []
        if isinstance(read, ReadFailed):
            state.readable, state.problem = False, read.why
        else:
            digest = hashlib.sha256(read).digest()
            if digest != state.digest:
                state.digest = digest
                effects += self._parse(path, read, state)
            state.readable = state.parsed
        if pin:
            effects += _pin_lines(
                path, state, first=first, was_readable=was_readable, old_key=old_key, wall=wall
            )
        return effects

    def _parse(self, path: str, data: bytes, state: _File) -> list[Effect]:
        try:
            certs = certificates(data)
            key = spki_sha256(certs[0])
        except (PemError, ValueError) as exc:
            state.parsed, state.problem = False, str(exc) or "not a PEM certificate"
            return []
        state.parsed, state.problem, state.key = True, "", key
        state.expiry = earliest_not_after(certs)
        if state.expiry is None:
            return [
                LogLine(
                    "warning",
                    f"certificate file {path}: a notAfter cannot be read, so its expiry is not"
                    " reported; check that certificate's expiry by hand",
                )
            ]
        return []

    def _gauges(self) -> list[Effect]:
        series: dict[tuple[str, str], list[_File]] = {}
        for watched in self.watched:
            series.setdefault((watched.role, watched.name), []).append(self._state[watched.path])
        effects: list[Effect] = []
        for (role, name), states in series.items():
            expiries = [s.expiry for s in states if s.expiry is not None]
            effects.append(
                SetGauges(
                    role,
                    name,
                    all(s.readable for s in states),
                    min(expiries) if expiries else None,
                )
            )
        return effects


def _pin_lines(
    path: str, state: _File, *, first: bool, was_readable: bool, old_key: bytes | None, wall: float
) -> list[Effect]:
    where = f"management pin file {path}"
    if not state.readable:
        if not first and not was_readable:
            return []  # still unreadable: said once
        if state.key is not None:
            return [
                LogLine(
                    "warning",
                    f"{where} cannot be read ({state.problem}); the key last read from it stays"
                    " pinned and is still admitted. Fix the file: until it is readable again a"
                    " rotation of the server's key is refused",
                )
            ]
        return [
            LogLine(
                "warning",
                f"{where} cannot be read ({state.problem}) and has not been since the gateway"
                " started: it pins nothing",
            )
        ]
    effects: list[Effect] = []
    if old_key is not None and state.key != old_key:
        effects.append(PinRotated(wall))
        effects.append(
            LogLine(
                "info", f"{where}: a new key is pinned; the previous one is refused from now on"
            )
        )
    elif not first and not was_readable:
        effects.append(LogLine("info", f"{where} is readable again"))
    return effects
