"""The rules about `grpc_listeners` that need more than the list itself: the port variables
and the "some listener must route the AgentService" refusal.

Seed, "Environment overrides for the listeners": `YUZU_GW_AGENT_PORT` rewrites listen.port of
the entry whose service_protos contains agent_pb, `YUZU_GW_MGMT_PORT` that of the entry serving
management_pb. A variable applies only when exactly one entry serves its proto; with none or
several it is logged as a WARNING that names it and ignored. A value that is not an integer
from 0 to 65535 is logged and ignored. On a single combined agent-and-management listener only
`YUZU_GW_AGENT_PORT` applies. An empty variable counts as unset, as for every other key.

Seed, "gRPC listeners": no listener at all, or none whose services map has the key
'yuzu.agent.v1.AgentService', refuses boot unless `allow_no_listeners` is the literal true.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

import attrs

from gateway.config.listener_spec import (
    AGENT_PROTO,
    AGENT_SERVICE,
    MAX_PORT,
    MGMT_PROTO,
    ListenerSpec,
    check_unique,
)
from gateway.config.refusal import BootRefused
from gateway.config.resolve import CONFIG_LOGGER

log = logging.getLogger(CONFIG_LOGGER)

AGENT_PORT_VAR = "YUZU_GW_AGENT_PORT"
MGMT_PORT_VAR = "YUZU_GW_MGMT_PORT"

NO_LISTENERS = "no_listeners"
NO_AGENT_LISTENER = "no_agent_listener"

_DIGITS = re.compile(r"[0-9]+")


def apply_port_overrides(
    specs: tuple[ListenerSpec, ...], env: Mapping[str, str]
) -> tuple[ListenerSpec, ...]:
    """`specs` with the port variables applied; a port made to collide refuses boot."""
    result = specs
    for var, proto in ((AGENT_PORT_VAR, AGENT_PROTO), (MGMT_PORT_VAR, MGMT_PROTO)):
        text = env.get(var, "")
        if not text:
            continue
        port = _port(var, text)
        if port is None:
            continue
        matches = [i for i, s in enumerate(result) if proto in s.service_protos]
        if len(matches) != 1:
            log.warning(
                "ENV override: %s is set but %d grpc_listeners entries serve %s (it applies"
                " only to exactly one); ignoring it",
                var,
                len(matches),
                proto,
            )
            continue
        index = matches[0]
        target = result[index]
        if proto == MGMT_PROTO and AGENT_PROTO in target.service_protos:
            log.warning(
                "ENV override: %s does not apply to the combined agent-and-management"
                " listener %s (only %s does); ignoring it",
                var,
                target.name,
                AGENT_PORT_VAR,
            )
            continue
        log.info(
            "ENV override: %s=%d replaces listen port of grpc_listeners entry %s",
            var,
            port,
            target.name,
        )
        result = (*result[:index], attrs.evolve(target, port=port), *result[index + 1 :])
    if result is not specs:
        check_unique(result)
    return result


def _port(var: str, text: str) -> int | None:
    stripped = text.strip()
    if _DIGITS.fullmatch(stripped) and int(stripped) <= MAX_PORT:
        return int(stripped)
    # Echo the text only when it is a plain number (out of range); anything else may be a
    # mistyped value from somewhere else.
    shown = f"is {stripped}, " if _DIGITS.fullmatch(stripped) else ""
    log.warning("ENV override: %s %snot an integer from 0 to %d; ignoring it", var, shown, MAX_PORT)
    return None


def require_agent_listener(specs: tuple[ListenerSpec, ...], allow_no_listeners: bool) -> None:
    """Refuse a gateway that would start, look healthy and accept no agent."""
    if allow_no_listeners:
        return
    if not specs:
        raise BootRefused(
            NO_LISTENERS,
            "no grpc_listeners are configured (the key is unset or empty, or sits under"
            " grpcbox); the gateway would accept no connection. Add the entries of"
            " sys_config/sys.config.prod ({allow_no_listeners, true} is for lab rigs only)",
        )
    if not any(s.routes_agent for s in specs):
        raise BootRefused(
            NO_AGENT_LISTENER,
            f"no grpc_listeners entry has {AGENT_SERVICE!r} in its services map; no agent"
            " could connect ({allow_no_listeners, true} is for lab rigs only)",
        )
