"""Exit reasons, as OTP spells them.

A crash reason keeps only the exception's class and the frame that raised it: never
the exception's message, arguments or the actor's state, because those are exactly
where enrolment tokens, certificates and command parameters would leak into a crash
report (seed: "Known limits", crash redaction).
"""

from __future__ import annotations

import traceback
from pathlib import PurePath

import attrs

NORMAL_KINDS = frozenset({"normal", "shutdown"})


@attrs.frozen
class ExitReason:
    """Why an actor ended: `normal`, `shutdown`, `killed`, `noproc`, `crash` or a named
    reason such as `reached_max_restart_intensity`."""

    kind: str
    exc_class: str = ""
    frame: str = ""
    # A name that says where, e.g. the id of the child that failed to start.
    detail: str = ""

    @classmethod
    def crash(cls, exc: BaseException) -> ExitReason:
        carried = getattr(exc, "exit_reason", None)
        if isinstance(carried, ExitReason):
            return carried
        frames = traceback.extract_tb(exc.__traceback__)
        frame = ""
        if frames:
            top = frames[-1]
            frame = f"{PurePath(top.filename).name}:{top.lineno} in {top.name}"
        return cls("crash", type(exc).__qualname__, frame)

    @property
    def is_normal(self) -> bool:
        """`normal` and `shutdown` end a transient child for good (OTP's rule)."""
        return self.kind in NORMAL_KINDS

    def __str__(self) -> str:
        text = self.kind
        if self.detail:
            text = f"{text} {self.detail}"
        if self.exc_class:
            text = f"{text}: {self.exc_class} at {self.frame or '?'}"
        return text


NORMAL = ExitReason("normal")
SHUTDOWN = ExitReason("shutdown")
KILLED = ExitReason("killed")
NOPROC = ExitReason("noproc")
REACHED_MAX_RESTART_INTENSITY = ExitReason("reached_max_restart_intensity")
