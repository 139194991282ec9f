"""The numbers and the restart budget of owner-crash recovery (seed: "When an agent's owner
process crashes"; docs/owner-recovery.md).

Rules of this file: when a restarted owner gives up, when its session is superseded by a newer
one of its agent (decided by the registry with `superseded`), and what each restart counts as.
Pure: the restart history is a tuple of loop-clock times carried in the session's owner-table
row (it survives the owner and agent_sup), and `now` comes in. The steps themselves (send the
predecessor's DISCONNECTED, wait for it to settle, re-register, present the session, announce
CONNECTED) are phases of the owner lifecycle (actors/core/owner_lifecycle.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

__all__ = [
    "GAVE_UP_LOG",
    "MAX_RESTARTS",
    "NOT_RECOVERED_LOG",
    "RECOVERED_LOG",
    "RECOVERY_DEADLINE_S",
    "RESTART_OUTCOMES",
    "RESTART_WINDOW_S",
    "RestartOutcome",
    "record_restart",
    "superseded",
]

# Seed, step 4: one owner may be restarted at most 3 times within 60 s; the next restart gives up.
MAX_RESTARTS: Final = 3
RESTART_WINDOW_S: Final = 60.0
# Seed, step 4, quoted; the argument is the agent id (cut and cleaned by log_text).
GAVE_UP_LOG: Final = "Agent %s: owner process restarted more than 3 times in 60 s; giving up"
# The seed bounds only the stream's wait for the re-attach (5 s, K32). A recovery whose
# DISCONNECTED cannot settle or whose server does not answer ends the session after this long
# (this rebuild's choice: twice the default upstream_rpc_timeout_ms); heartbeats stay admitted
# meanwhile, so the agent loses nothing by the wait.
RECOVERY_DEADLINE_S: Final = 10.0

# `recovered`: the session is CONNECTED again with its stream home id and the agent kept its
# stream. `disconnected_only`: the predecessor's DISCONNECTED went (or had gone) but the session
# could not be recovered (the stream was gone, a step failed); the agent registers again.
# `gave_up`: the crash loop's limit.
RestartOutcome = Literal["recovered", "disconnected_only", "gave_up"]
RESTART_OUTCOMES: tuple[RestartOutcome, ...] = ("recovered", "disconnected_only", "gave_up")

# "Each restart writes the usual crash or supervisor report ... and one line naming the
# outcome": the give-up's is the seed's WARN above; the other two texts are this rebuild's. Each
# takes the agent id (never the session id).
RECOVERED_LOG: Final = "Agent %s: owner process restarted; session recovered on the same stream"
NOT_RECOVERED_LOG: Final = (
    "Agent %s: owner process restarted; session not recovered (disconnected_only),"
    " the agent registers again"
)


def record_restart(history: tuple[float, ...], now: float) -> tuple[tuple[float, ...], bool]:
    """This restart added to the `history` of earlier ones (the times still inside the window),
    and whether it is one too many: the restarts before it within 60 s already number 3."""
    recent = tuple(t for t in history if now - t < RESTART_WINDOW_S)
    return (*recent, now), len(recent) >= MAX_RESTARTS


def superseded(since: float, others: Iterable[float], registering: bool) -> bool:
    """Whether a restarted owner's session, first registered at `since` (loop clock), has been
    superseded by a newer session of its agent, so it must not be registered or presented
    again (seed, step 3: "the agent registered a newer session meanwhile"). `others`: when each
    other live session of the agent was first registered; `registering`: the agent has another
    session whose owner has not registered it yet (a committed Register, or its Subscribe's
    owner starting). An agent registers again only once it has given up its stream, so any such
    session is newer; an older live session (an agent that registered again while its old
    stream was still open, and this is the newer one) is not."""
    return registering or any(t > since for t in others)
