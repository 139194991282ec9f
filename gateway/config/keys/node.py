"""Keys of the node itself: its name, its HTTP endpoints, the metrics cadence, the stop, the
log's format and which gRPC listeners serve server reflection."""

from __future__ import annotations

from typing import Any

import attrs

from gateway.config.converters import BadValue, IntRange, NodeName, text_of
from gateway.config.schema import EnvOverride, Key, NameOrigin, Refuse
from gateway.config.terms import Atom, Term

# The values of log_format.
TEXT = "text"
JSON = "json"


@attrs.frozen
class LogFormat:
    """`text` or `json`: an atom, a string or a binary (the variable's text arrives as one)."""

    expected: str = "text or json"

    def __call__(self, term: Term) -> str:
        name = term.name if isinstance(term, Atom) else text_of(term, self.expected)
        if name not in (TEXT, JSON):
            raise BadValue(self.expected)
        return name


@attrs.frozen
class ListenerNames:
    """A list of grpc_listeners names, as atoms; a name no entry has serves nothing (the
    listeners' tree warns about it at boot)."""

    expected: str = "a list of grpc_listeners names (atoms)"

    def __call__(self, term: Term) -> frozenset[str]:
        if not isinstance(term, list) or not all(isinstance(item, Atom) for item in term):
            raise BadValue(self.expected)
        return frozenset(item.name for item in term)


def _env_text(text: str) -> Term:
    return Atom(text.strip().lower())


AREA = "node"

# 0 is allowed so a test can ask the kernel for a free port and read back the one it got.
PORT = IntRange(0, 65535, note="0 picks a free port")

NODE_NAME: Key[str | None] = Key(
    name="node_name",
    default=Atom("undefined"),
    convert=NodeName(),
    read_when="boot",
    doc="This node's name, name@host; sent upstream as gateway_node. Wins over vm.args.",
    area=AREA,
    # A node that starts under a name it was not given joins the wrong cluster identity and
    # reports the wrong gateway_node upstream; refuse rather than guess.
    on_bad=Refuse("invalid_node_name"),
    origin=NameOrigin.OURS,
    default_doc="the -name (or -sname) of vm.args",
)

HEALTH_PORT: Key[int] = Key(
    name="health_port",
    default=8081,
    convert=PORT,
    read_when="boot, when the health endpoint starts",
    doc="HTTP port of /healthz and /readyz (fixed in the Erlang gateway, a setting here).",
    area=AREA,
    origin=NameOrigin.OURS,
)

PROMETHEUS_PORT: Key[int] = Key(
    name="prometheus_port",
    default=9568,
    convert=PORT,
    read_when="boot, when the metrics endpoint starts",
    doc="HTTP port of the Prometheus /metrics endpoint.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

TELEMETRY_GAUGE_INTERVAL_MS: Key[int] = Key(
    name="telemetry_gauge_interval_ms",
    default=10000,
    convert=IntRange(100, 3_600_000),
    read_when="start of the gauge process",
    doc="Agent gauge emission interval; also the cadence of the heartbeat-rejection summary line.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

SHUTDOWN_FLUSH_BUDGET_MS: Key[int] = Key(
    name="shutdown_flush_budget_ms",
    default=20000,
    convert=IntRange(1, 3_600_000),
    read_when="at a planned stop",
    doc="Time a planned stop spends telling the server about the sessions it gives up. Must"
    " fit inside the stop timeout (compose stop_grace_period 40s, systemd TimeoutStopSec=40)."
    "",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

LOG_FORMAT: Key[str] = Key(
    name="log_format",
    default=Atom(TEXT),
    convert=LogFormat(),
    read_when="boot, once the file is read (the variable: from the first line)",
    doc="The log's shape on stderr: text (`<time> <LEVEL> <logger>: <message>`) or json (one"
    " object a line: time, level, logger, message; docs/runbook.md 'Reading the log').",
    area=AREA,
    env=EnvOverride("YUZU_GW_LOG_FORMAT", _env_text, "text or json", NameOrigin.OURS),
    origin=NameOrigin.OURS,
)

GRPC_REFLECTION: Key[frozenset[str]] = Key(
    name="grpc_reflection",
    default=[],
    convert=ListenerNames(),
    read_when="boot, when the listeners' routes are assembled",
    doc="The grpc_listeners entries (by name) that also serve gRPC server reflection, so"
    " grpcurl can list and describe their services (docs/health.md). Off by default and in"
    " sys.config.prod.",
    area=AREA,
    origin=NameOrigin.OURS,
    default_doc="[] (no listener)",
)

KEYS: tuple[Key[Any], ...] = (
    NODE_NAME,
    HEALTH_PORT,
    PROMETHEUS_PORT,
    TELEMETRY_GAUGE_INTERVAL_MS,
    SHUTDOWN_FLUSH_BUDGET_MS,
    LOG_FORMAT,
    GRPC_REFLECTION,
)
