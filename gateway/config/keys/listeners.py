"""Keys of the gRPC listeners: the `grpc_listeners` list and the lab-rig acknowledgement.

The list's own validation is `gateway.config.listener_spec`; the rules that need another key or the
environment are the schema checks in `CHECKS` (the port variables, then the refusal of a
gateway with no listener routing the AgentService)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from gateway.config.converters import IntRange, LiteralTrue
from gateway.config.listener_overrides import apply_port_overrides, require_agent_listener
from gateway.config.listener_spec import ListenerSpec, parse_listeners
from gateway.config.schema import Key, NameOrigin, Refuse
from gateway.config.section import Check
from gateway.config.terms import Term

if TYPE_CHECKING:
    from gateway.config.config import Config

AREA = "listeners"


@attrs.frozen
class Listeners:
    """The converter of `grpc_listeners`. It raises `BootRefused` itself, naming each defect
    by its own term (docs/listeners.md has the table)."""

    expected: str = "a list of listener maps (docs/listeners.md)"

    def __call__(self, term: Term) -> tuple[ListenerSpec, ...]:
        return parse_listeners(term)


GRPC_LISTENERS: Key[tuple[ListenerSpec, ...]] = Key(
    name="grpc_listeners",
    default=[],
    convert=Listeners(),
    read_when="boot, before anything is bound; each listener reads its TLS files when it starts",
    doc="The agent and management gRPC listeners, one map per listener; every key, default"
    " and refusal is in docs/listeners.md. YUZU_GW_AGENT_PORT / YUZU_GW_MGMT_PORT rewrite the"
    " listen port of the one entry serving agent_pb / management_pb.",
    area=AREA,
    on_bad=Refuse("config_shape"),
    default_doc="none (the shipped prod config has agent and mgmt)",
    bad_doc="refuse boot, naming the defect (docs/listeners.md)",
)

ALLOW_NO_LISTENERS: Key[bool] = Key(
    name="allow_no_listeners",
    default=False,
    convert=LiteralTrue(),
    read_when="boot",
    doc="Lab-rig acknowledgement: boot with no listener routing the AgentService. Never in a"
    " deployment.",
    area=AREA,
    default_doc="unset",
    bad_doc="any value but `true` counts as unset",
)

LISTENER_HANDSHAKE_TIMEOUT_MS: Key[int] = Key(
    name="listener_handshake_timeout_ms",
    default=10000,
    convert=IntRange(100, 60_000),
    read_when="start of each gRPC listener",
    doc="How long an accepted connection of a gRPC listener may take to start HTTP/2: its PROXY"
    " header (at most 1 s of it), its TLS handshake and the client's HTTP/2 preface and first"
    " SETTINGS. Past it the connection is closed and counted in"
    " yuzu_gw_listener_handshake_failed_total (docs/listeners.md 'Hostile input').",
    area=AREA,
    origin=NameOrigin.OURS,
)


def listener_port_overrides(config: Config, env: Mapping[str, str]) -> Config:
    """YUZU_GW_AGENT_PORT / YUZU_GW_MGMT_PORT rewrite a listen port inside the list."""
    specs = config[GRPC_LISTENERS]
    updated = apply_port_overrides(specs, env)
    if updated is specs:
        return config
    return config.with_value(GRPC_LISTENERS, updated, config.source_of(GRPC_LISTENERS))


def listeners_route_agents(config: Config, env: Mapping[str, str]) -> Config:
    require_agent_listener(config[GRPC_LISTENERS], config[ALLOW_NO_LISTENERS])
    return config


KEYS: tuple[Key[Any], ...] = (GRPC_LISTENERS, ALLOW_NO_LISTENERS, LISTENER_HANDSHAKE_TIMEOUT_MS)

# Order matters: the override may move a port, and the refusal reads the final list.
CHECKS: tuple[Check, ...] = (listener_port_overrides, listeners_route_agents)
