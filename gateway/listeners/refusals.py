"""What a listener does when a client's bytes are refused: one counter per reason and, for a
refused call, at most one log line per reason a second (docs/listeners.md "Hostile input").

The listener ports are unauthenticated, so whatever a client sends wrong must cost the log at
most one line a second per reason however fast it is repeated (the seed's warn limiter, with
the count of lines held back), and never a traceback. The line names the listener, the reason
and the answer, never what the client sent (a header value is the client's text).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from prometheus_client import Counter

from actors.core.warn_limit import WarnLimiter

__all__ = ["Refusals"]

log = logging.getLogger("yuzu_gw.listeners")


class Refusals:
    """The refused calls and failed handshakes of one listener."""

    def __init__(
        self,
        listener: str,
        calls: Mapping[str, Counter],
        handshakes: Mapping[str, Counter],
        clock: Callable[[], float],
    ) -> None:
        self.listener = listener
        self._calls = calls
        self._handshakes = handshakes
        self._clock = clock
        self._limiter = WarnLimiter()

    def call(self, reason: str, answer: str) -> None:
        """A call refused for `reason`, answered with the status named `answer`."""
        self._calls[reason].inc()
        suffix = self._limiter.admit(("call", reason), self._clock())
        if suffix is not None:
            log.info(
                "gRPC listener %s refused a call: %s, answered %s%s",
                self.listener,
                reason,
                answer,
                suffix,
            )

    def handshake(self, reason: str) -> None:
        """A connection closed before HTTP/2 started, for `reason`. Routine on an
        unauthenticated port (scanners, health checks without the PROXY header): counted, and
        logged at DEBUG only."""
        self._handshakes[reason].inc()
        log.debug("gRPC listener %s: connection not set up (%s)", self.listener, reason)
