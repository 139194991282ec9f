"""`yuzu_gw_mgmt_pins`: the actor that reads the configured certificate files every
`mgmt_pin_refresh_ms` and publishes the management pins (seed: "Certificate rotation and
expiry"). What a refresh means is the core's (watch.py); this module does the reading, the
timer and the effects:

- the first read happens in `init`, before the listeners start (they come after it in
  gateway_sup), so the pins are published before the first management stream can arrive;
- every later read runs in a worker thread (a file on a stalled mount must not stall the
  loop), one at a time: the next refresh is scheduled when the read is done;
- `PublishPins` replaces the `PinBoard`'s attribute that the per-stream check reads; gauges,
  counters and log lines go where they belong. `format_status` shows counts only.

The core and the board belong to gateway_sup's tree (gateway/mgmt/auth/tree.py), so a
restarted watcher keeps every last known good key.

With `reload`, each refresh also reads every TLS listener's and upstream endpoint's
certificate, key and CA files, and a changed, complete set is loaded for new handshakes
(tls_reload.py); that part of the refresh runs on the loop, after the thread's reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
from thespian.actors import WakeupMessage

from actors.core import LogLine
from actors.effects import log_line
from gateway.mgmt.auth.gate import PinBoard
from gateway.mgmt.auth.metrics import MgmtAuthMetrics
from gateway.mgmt.auth.tls_reload import SetRead, TlsReload, TlsSet, read_sets
from gateway.mgmt.auth.watch import (
    CertWatch,
    Effect,
    PinRotated,
    PinsUnresolved,
    PublishPins,
    Read,
    ReadFailed,
    SetGauges,
)
from supervisors.address import Address
from supervisors.messages import WorkerDone
from supervisors.process import Process

__all__ = ["NAME", "PinWatcher", "WatcherArgs", "read_files"]

NAME = "yuzu_gw_mgmt_pins"
log = logging.getLogger("yuzu_gw.mgmt_auth")

_REFRESH = "refresh"
# A certificate file is a few kilobytes; a path pointing at something far larger is not one,
# and must not cost a large read every interval.
MAX_FILE_BYTES = 1024 * 1024


def read_file(path: str) -> bytes:
    with Path(path).open("rb") as file:
        data = file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise OSError(f"larger than {MAX_FILE_BYTES} bytes, not a certificate file")
    return data


def read_files(paths: tuple[str, ...], read: Callable[[str], bytes] = read_file) -> dict[str, Read]:
    """Each path's bytes, or why it could not be read (the error's text, never contents)."""
    reads: dict[str, Read] = {}
    for path in paths:
        try:
            reads[path] = read(path)
        except OSError as exc:
            reads[path] = ReadFailed(exc.strerror or str(exc) or type(exc).__name__)
    return reads


@attrs.frozen(eq=False)
class WatcherArgs:
    watch: CertWatch
    board: PinBoard
    metrics: MgmtAuthMetrics
    refresh_s: float
    wall: Callable[[], float] = time.time
    read: Callable[[str], bytes] = read_file
    reload: TlsReload | None = None


def _read_all(
    paths: tuple[str, ...], args: WatcherArgs
) -> tuple[dict[str, Read], dict[TlsSet, SetRead]]:
    sets = read_sets(args.reload.sets, args.read) if args.reload is not None else {}
    return read_files(paths, args.read), sets


class PinWatcher(Process):
    def init(self, args: WatcherArgs) -> None:
        self.args = args
        self.paths = args.watch.paths()
        reads, sets = _read_all(self.paths, args)
        self._apply(args.watch.observe(reads, args.wall()))
        if args.reload is not None:
            args.reload.first(sets)
        if self.paths:
            self.wakeupAfter(args.refresh_s, _REFRESH)

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case WakeupMessage(payload=payload) if payload == _REFRESH:
                self.run_worker(asyncio.to_thread(_read_all, self.paths, self.args), _REFRESH)
            case WorkerDone(tag=tag) if tag == _REFRESH:
                self._refreshed(msg)

    def _refreshed(self, done: WorkerDone) -> None:
        if done.ok:
            reads: Mapping[str, Read]
            reads, sets = done.result
            self._apply(self.args.watch.observe(reads, self.args.wall()))
            if self.args.reload is not None:
                self._apply(list(self.args.reload.apply(sets)))
        else:
            log.error(
                "certificate watcher: a refresh failed (%s); retrying in %g s",
                type(done.error).__name__,
                self.args.refresh_s,
            )
        self.wakeupAfter(self.args.refresh_s, _REFRESH)

    def _apply(self, effects: list[Effect]) -> None:
        metrics = self.args.metrics
        for effect in effects:
            match effect:
                case PublishPins(pins=pins):
                    self.args.board.pins = pins
                case SetGauges():
                    metrics.set_gauges(effect)
                case PinRotated(at=at):
                    metrics.pin_rotated.set(at)
                case PinsUnresolved(n=n):
                    metrics.pin_unresolved.inc(n)
                case LogLine():
                    log_line(log, effect)

    def format_status(self) -> Mapping[str, Any]:
        return {
            "files": len(self.paths),
            "pins_published": len(self.args.board.pins),
            "pins_unresolved": self.args.watch.unresolved(),
        }
