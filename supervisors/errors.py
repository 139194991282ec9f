"""Errors the runtime raises to callers."""

from __future__ import annotations

from supervisors.reason import ExitReason


class InitFailed(Exception):
    """`init` of a new actor raised: the actor never existed (OTP's `{error, Reason}`
    from `start_link`)."""

    def __init__(self, reason: ExitReason) -> None:
        super().__init__(str(reason))
        self.reason = reason


class NoProc(Exception):
    """The addressed actor is not alive."""


class ActorExited(Exception):
    """The actor an `ask` waited on ended before it answered."""

    def __init__(self, reason: ExitReason) -> None:
        super().__init__(str(reason))
        self.reason = reason


class TableGone(Exception):
    """The table's owner ended, and the table with it."""
