"""How an actor moves an agent listener and reads its state (the listener actor is
gateway/listeners/listener_actor.py, beside its sockets).

    caller -> listener   Suspend   close the listen socket (connections are untouched)
    caller -> listener   Resume    bind it again, on the same port
    listener -> caller   ListenerState, the state now in force (`error`: why a resume failed)

Each listener actor is registered as `actor_name(listener)` and publishes its `ListenerState`
in its protected table `table_name(listener)`, row `STATE_ROW`, so the readiness check and the
memory shedder read it without a message. The state names are the shedder core's
(actors/core/shedder_marks.py), which compares them.
"""

from __future__ import annotations

from typing import Final, Literal

import attrs

from actors.core.shedder_marks import RUNNING, SUSPENDED

__all__ = [
    "RUNNING",
    "STATE_ROW",
    "SUSPENDED",
    "ListenerState",
    "Resume",
    "State",
    "Suspend",
    "actor_name",
    "table_name",
]

State = Literal["running", "suspended"]
STATE_ROW: Final = "state"


def table_name(listener: str) -> str:
    return f"listener:{listener}"


def actor_name(listener: str) -> str:
    """The registered name of a listener's actor (`runtime.whereis(actor_name("agent"))`)."""
    return f"listener_{listener}"


@attrs.frozen
class Suspend:
    """Close the listen socket; established connections are untouched."""


@attrs.frozen
class Resume:
    """Bind the listen socket again, on the same port."""


@attrs.frozen
class ListenerState:
    """The answer to `Suspend`, `Resume` and `GetState`, and the published table row.
    `error` is the errno name of a failed resume (`eaddrinuse`, `emfile`), else None."""

    name: str
    state: State
    address: tuple[str, int]
    serves_agent: bool
    error: str | None = None
