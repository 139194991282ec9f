"""The live summary line of `yuzu-gw-ctl send` on a terminal: one line, redrawn in place
(carriage return, erase to the end of the line) as answers come, at most every
`REDRAW_S`, so thousands of answers a second cost a few writes. Only on a terminal: a pipe or
a file gets the answers alone, as before."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from gateway.ctl.render import SendProgress

__all__ = ["REDRAW_S", "LiveSummary"]

REDRAW_S = 0.1
ERASE = "\r\x1b[K"


class LiveSummary:
    def __init__(
        self,
        stream: TextIO,
        enabled: bool,
        clock: Callable[[], float] = time.monotonic,
        redraw_s: float = REDRAW_S,
    ) -> None:
        self.stream = stream
        self.enabled = enabled
        self.clock = clock
        self.redraw_s = redraw_s
        self._drawn = False
        self._last = float("-inf")

    def update(self, progress: SendProgress, force: bool = False) -> None:
        now = self.clock()
        if not self.enabled or (not force and now - self._last < self.redraw_s):
            return
        self._last = now
        self.stream.write(ERASE + progress.line())
        self.stream.flush()
        self._drawn = True

    def clear(self) -> None:
        """Before a line of output: the summary is redrawn under it at the next update."""
        if self._drawn:
            self.stream.write(ERASE)
            self._drawn = False
            # The next update redraws at once, so the line is never missing for long.
            self._last = float("-inf")
