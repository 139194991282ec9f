"""Crash redaction: the log filter that keeps registrations and commands out of crash reports
(seed: "Known limits", the crash redaction entry; the Erlang yuzu_gw_crash_redact).

The runtime's own reports are redacted by construction: a crash, a failed init or terminate and a
supervisor's child report name the actor and an `ExitReason` (exception class and top frame,
supervisors/reason.py), never the message, the state or the exception's text. This filter is
the second layer, for whatever does not go through those lines:

* **Crash and supervisor reports** (`supervisors.crash`, `supervisors.supervisor`) that name a
  covered actor: each argument that is not a name, a number, an address or an `ExitReason` is
  replaced by its type name, and any traceback is reduced (below).
* **A record carrying a traceback** (`exc_info`, `exc_text`, `stack_info`) for a covered
  actor's work: logged while a covered actor handles a message, or whose exception (or one it
  chains) passed through a covered module. The traceback goes; the line keeps the exception's
  class and top frame. Arguments are reduced as above; a library's (grpclib's) string
  arguments too, since only our own lines promise that theirs hold no secret.
* **asyncio's reports**, always ("Exception in callback", "Task exception was never
  retrieved", ...): asyncio writes the callback with its argument list, or the task with its
  exception's text, into the message itself, and which actor's work a callback was is not
  known. The message is cut to its fixed head; the exception to its class and top frame.

Covered: the five actors that hold a registration or a command (`registry`, `upstream`, every
agent owner, `router`, `heartbeat_buffer`) and the modules that hand them one (the agent and
management handlers, the upstream call path). Every other record passes unchanged. If the
filter itself fails, the record is kept with a fixed text that names no data.

Python's logging has no primary filter: a filter on a logger does not see its children's
records, and one on a handler misses handlers added later. `install` therefore runs the filter
in the log record factory, which every record of every logger passes through once, before any
handler sees it. The node installs it at start, once per process, and it stays: a task of a
covered actor that is collected after the stop still reports through asyncio. A stopped node
only takes its runtime back (`release`).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

import attrs

from actors.agents.owner import AgentOwner
from actors.heartbeat.api import NAME as HEARTBEAT_BUFFER
from actors.heartbeat.buffer import HeartbeatBufferActor
from actors.registry.actor import Registry
from actors.registry.api import REGISTRY_NAME
from actors.router.actor import Router
from actors.router.api import ROUTER_NAME
from actors.upstream.actor import Upstream
from actors.upstream.api import UPSTREAM_NAME as UPSTREAM
from supervisors.address import Address
from supervisors.reason import ExitReason
from supervisors.runtime import LoopSystemBase

__all__ = [
    "ASYNCIO_HEADS",
    "COVERED_ACTORS",
    "COVERED_MODULES",
    "REPORT_LOGGERS",
    "WITHHELD",
    "CrashRedaction",
    "install",
    "uninstall",
]

# Registered names and classes: a crash report names an actor by its name, else its class (the
# owners have no name); a supervisor report names the child's id and class.
COVERED_ACTORS = frozenset(
    {
        REGISTRY_NAME,
        UPSTREAM,
        ROUTER_NAME,
        HEARTBEAT_BUFFER,
        *(cls.__name__ for cls in (Registry, Upstream, AgentOwner, Router, HeartbeatBufferActor)),
    }
)
# Module-name prefixes of the covered actors, their policies and the code that hands them a
# request (a frame in one of these makes a traceback the covered actors' work).
COVERED_MODULES = (
    "actors.registry.",
    "actors.upstream.",
    "actors.agents.",
    "actors.router.",
    "actors.heartbeat.",
    "actors.core.",
    "gateway.upstream.",
    "gateway.agent.",
    "gateway.mgmt.command",
)
# The runtime's crash and supervisor report lines (supervisors/runtime.py, supervisor.py).
REPORT_LOGGERS = frozenset({"supervisors.crash", "supervisors.supervisor"})
_OWN_LOGGERS = ("yuzu_gw", "supervisors")
_ASYNCIO = "asyncio"
# The fixed first words of asyncio's reports; what follows them is a repr with arguments.
ASYNCIO_HEADS = (
    "Exception in callback",
    "Task exception was never retrieved",
    "Future exception was never retrieved",
    "Task was destroyed but it is pending",
    "Unhandled error in exception handler",
    "Exception in default exception handler",
    "Fatal error on",
    "Fatal write error on",
    "Fatal read error on",
    "Error on reading from the event loop self pipe",
    "Executing",
)
_ASYNCIO_FALLBACK = "asyncio report (redacted)"
WITHHELD = "a log record was withheld: crash redaction failed on it"
# How far along __cause__ / __context__ a traceback is searched for a covered frame.
_MAX_CHAIN = 8

_SAFE_TYPES = (ExitReason, Address, int, float, type(None), enum.Enum)  # bool is an int
# Our own loggers' text is safe too (only our own lines promise that theirs hold no secret).
_SAFE_OWN_TYPES = (str, *_SAFE_TYPES)


class CrashRedaction(logging.Filter):
    """The filter (module doc). `runtime` tells which actor is handling a message; without one,
    only reports and tracebacks are looked at."""

    def __init__(self, runtime: LoopSystemBase | None = None) -> None:
        super().__init__()
        self.runtime = runtime

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self._redact(record)
        except Exception:
            _withhold(record)
        return True

    def _redact(self, record: logging.LogRecord) -> None:
        if record.name == _ASYNCIO:
            _reduce_asyncio(record)
            return
        report = record.name in REPORT_LOGGERS and _names_covered(record.args)
        traced = bool(record.exc_info or record.exc_text or record.stack_info)
        if not report and not (traced and (self._in_covered_actor() or _covered_trace(record))):
            return
        own = record.name.startswith(_OWN_LOGGERS)
        record.args = _safe_args(record.args, keep_text=own)
        if traced:
            _strip_trace(record, record.getMessage())

    def release(self, runtime: LoopSystemBase) -> None:
        """A node that stopped lets go of its runtime (the filter stays installed)."""
        if self.runtime is runtime:
            self.runtime = None

    def _in_covered_actor(self) -> bool:
        current = self.runtime.current if self.runtime is not None else None
        return current is not None and (
            current.globalName in COVERED_ACTORS
            or type(current.instance).__name__ in COVERED_ACTORS
        )


@attrs.define
class _Installed:
    redaction: CrashRedaction
    factory: Callable[..., logging.LogRecord]
    previous: Callable[..., logging.LogRecord]


_installed: _Installed | None = None


def install(runtime: LoopSystemBase | None = None) -> CrashRedaction:
    """Run the process's `CrashRedaction` on every record from now on (module doc), looking at
    `runtime`'s actors. Installed once; a second call only points it at the new runtime."""
    global _installed  # noqa: PLW0603 - one record factory per process, like logging's own
    if _installed is None:
        redaction = CrashRedaction()
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            redaction.filter(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = _Installed(redaction, factory, previous)
    _installed.redaction.runtime = runtime
    return _installed.redaction


def uninstall() -> None:
    """Take the filter out again (tests and tools; a node never does). Only when no other
    record factory was set on top of it since."""
    global _installed  # noqa: PLW0603
    if _installed is not None and logging.getLogRecordFactory() is _installed.factory:
        logging.setLogRecordFactory(_installed.previous)
        _installed = None


# -- the rules ------------------------------------------------------------------------------


def _names_covered(args: Any) -> bool:
    # Every record passes here and in `_safe_args` (the factory runs on each): the tuple of a
    # %-format is looked for before the slower Mapping ABC check.
    if isinstance(args, tuple):
        values = args
    else:
        values = args.values() if isinstance(args, Mapping) else args or ()
    return not COVERED_ACTORS.isdisjoint([value for value in values if isinstance(value, str)])


def _covered_trace(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return any(
        str(tb.tb_frame.f_globals.get("__name__", "")).startswith(COVERED_MODULES)
        for tb in _tracebacks(exc)
    )


def _tracebacks(exc: BaseException | None) -> Iterator[TracebackType]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            yield tb
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__


def _safe_args(args: Any, *, keep_text: bool) -> Any:
    if isinstance(args, tuple):
        return tuple([_safe(value, keep_text) for value in args])
    if isinstance(args, Mapping):
        return {key: _safe(value, keep_text) for key, value in args.items()}
    return args


def _safe(value: object, keep_text: bool) -> object:
    if isinstance(value, _SAFE_OWN_TYPES if keep_text else _SAFE_TYPES):
        return value
    return f"<{type(value).__name__}>"


def _strip_trace(record: logging.LogRecord, message: str) -> None:
    """The message as it is, then the exception's class and top frame; no traceback."""
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None:
        reason = ExitReason.crash(exc)
        message = f"{message} [{reason.exc_class} at {reason.frame or '?'}; traceback redacted]"
    else:
        message = f"{message} [traceback redacted]"
    record.msg, record.args = message, None
    record.exc_info = record.exc_text = record.stack_info = None


def _reduce_asyncio(record: logging.LogRecord) -> None:
    if record.args:
        record.args = _safe_args(record.args, keep_text=False)
        message = record.getMessage()
    else:
        first = str(record.msg).split("\n", 1)[0]
        message = next((head for head in ASYNCIO_HEADS if first.startswith(head)), None) or (
            _ASYNCIO_FALLBACK
        )
    if record.exc_info or record.exc_text or record.stack_info:
        _strip_trace(record, message)
    else:
        record.msg, record.args = message, None


def _withhold(record: logging.LogRecord) -> None:
    record.msg, record.args = WITHHELD, None
    record.exc_info = record.exc_text = record.stack_info = None
