"""The `yuzu_gw` schema: every key of every area, in documentation order.

An area module declares its keys as constants (for `config[KEY]`) and lists them in `KEYS`;
this package joins the areas into one closed `Schema`. A new area is one import and one
entry in `AREAS`.
"""

from __future__ import annotations

from types import ModuleType

from gateway.config.keys import (
    breaker,
    cluster,
    heartbeat,
    listeners,
    mgmt,
    node,
    replay,
    router,
    sessions,
    shedder,
    upstream,
)
from gateway.config.section import DeadKeys, Schema

SECTION = "yuzu_gw"

AREAS: tuple[ModuleType, ...] = (
    node,
    listeners,
    upstream,
    breaker,
    replay,
    heartbeat,
    router,
    sessions,
    cluster,
    mgmt,
    shedder,
)

# Keys old configs carry that nothing has read for several releases; the manual says they are
# "left alone", so they must not trip the closed-set refusal.
DEAD_KEYS = DeadKeys(
    names=frozenset({"tls"}),
    prefixes=("agent_listen_", "mgmt_listen_"),
    doc="`agent_listen_*` and `mgmt_listen_*` (replaced by grpc_listeners) and `tls` (removed"
    " in PKI PR5)",
)

SCHEMA = Schema(
    section=SECTION,
    keys=tuple(key for area in AREAS for key in area.KEYS),
    dead=DEAD_KEYS,
    no_effect_env=upstream.NO_EFFECT_ENV,
    # Whole-config rules of the listeners: the port variables, then no gateway without a
    # listener routing the AgentService (unless allow_no_listeners is the literal true); then
    # the memory shedder's marks, resolved against the memory limit read once here; then the
    # management peer authorisation (it reads the final listener list); then the cluster links'
    # TLS files.
    checks=listeners.CHECKS + shedder.CHECKS + mgmt.CHECKS + cluster.CHECKS,
)
