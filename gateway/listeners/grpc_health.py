"""`grpc.health.v1.Health` and opt-in server reflection on the gRPC listeners (docs/health.md).

Every listener serves grpclib's own `grpclib.health.service.Health`, so load balancers and
Kubernetes gRPC probes can ask the listener itself. Its answer is tied to the `/readyz` checks,
per service the listener routes:

- `""` (the server as a whole) and `yuzu.agent.v1.AgentService`: SERVING when every readiness
  check passes (the `/readyz` verdict, which is what guards the agents' balancer);
- `yuzu.server.v1.ManagementService`: SERVING when `registry`, `sessions_index`, `agent_sup` and
  `router` pass (what commands and listings need; memory shedding and the upstream do not stop
  them);

and in every case NOT_SERVING once a planned stop has begun its drain (`ServingBoard.stop_serving`,
told by the first listener that gets the planned stop's `Drain`). A service the listener does not
route is NOT_FOUND (`Check`) or SERVICE_UNKNOWN (`Watch`). While memory is shed the
`memory_shedding` check fails, so `""` and the AgentService read NOT_SERVING and the
ManagementService stays SERVING. `Watch` streams hear a change within `WATCH_POLL_S` (the checks
are read, never pushed) and at once when the drain begins.

On a management listener the Health service is answered before the peer authorisation (the gate
guards only the ManagementService and reflection): a probe holds no server certificate. It tells
nothing a TCP connect does not already: one word per service name the caller already knows, no
agent, no count, no configuration.

Reflection (`grpclib.reflection`: the v1 and v1alpha services) is served only by the listeners
named in `grpc_reflection` (default none, none in sys.config.prod). It lists the listener's
services and Health and describes them from the protobuf descriptor pool; on a judged management
listener it is guarded by the peer authorisation like the ManagementService.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Iterable
from typing import Any, Final

from grpclib.health.check import CheckBase
from grpclib.health.service import OVERALL, Health
from grpclib.reflection.service import ServerReflection

from actors.agents.api import AGENT_SUP_NAME
from actors.node.api import Readiness
from actors.registry.api import REGISTRY_NAME, SESSIONS_INDEX
from actors.router.api import ROUTER_NAME
from gateway.config.listener_spec import AGENT_SERVICE, MGMT_SERVICE, ListenerSpec
from gateway.listeners.server import Routes

__all__ = [
    "HEALTH_SERVICE",
    "MGMT_CHECKS",
    "REFLECTION_PREFIXES",
    "WATCH_POLL_S",
    "ReadinessCheck",
    "ServingBoard",
    "health_routes",
    "reflection_routes",
]

log = logging.getLogger("yuzu_gw.listeners")

HEALTH_SERVICE: Final = "grpc.health.v1.Health"
REFLECTION_PREFIXES: Final = (
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
)
# The checks the ManagementService needs (module doc); None: every check.
MGMT_CHECKS: Final = (REGISTRY_NAME, SESSIONS_INDEX, AGENT_SUP_NAME, ROUTER_NAME)
_SERVICE_CHECKS: Final[dict[str, tuple[str, ...] | None]] = {
    AGENT_SERVICE: None,
    MGMT_SERVICE: MGMT_CHECKS,
}
# How often an open Watch re-reads the checks.
WATCH_POLL_S: Final = 1.0


class ServingBoard:
    """One per node: the readiness checks and whether a planned stop has begun, read by every
    listener's Health service; the one poll task of the node's Watch streams."""

    def __init__(self, readiness: Readiness, poll_s: float = WATCH_POLL_S) -> None:
        self.readiness = readiness
        self.poll_s = poll_s
        self.stopping = False
        # Each Watch's wake-up, with its check and the status it last saw.
        self._watchers: dict[asyncio.Event, tuple[ReadinessCheck, bool]] = {}
        self._poll: asyncio.Task[None] | None = None

    def serving(self, checks: Collection[str] | None) -> bool:
        """Whether a service needing `checks` (None: all of them) is serving now."""
        if self.stopping:
            return False
        results = self.readiness.evaluate()
        names = results if checks is None else [name for name in checks if name in results]
        return all(results[name] for name in names)

    def stop_serving(self) -> None:
        """The planned stop's drain has begun: NOT_SERVING from now on, every Watch told."""
        if not self.stopping:
            self.stopping = True
            self._recheck()

    # -- Watch --------------------------------------------------------------------------------

    def subscribe(self, check: ReadinessCheck) -> asyncio.Event:
        event = asyncio.Event()
        self._watchers[event] = (check, check.__status__())
        if self._poll is None:
            self._poll = asyncio.get_running_loop().create_task(self._run())
        return event

    async def unsubscribe(self, event: asyncio.Event) -> None:
        self._watchers.pop(event, None)
        if not self._watchers and self._poll is not None:
            poll, self._poll = self._poll, None
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poll

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            self._recheck()

    def _recheck(self) -> None:
        for event, (check, seen) in list(self._watchers.items()):
            now = check.__status__()
            if now != seen:
                self._watchers[event] = (check, now)
                event.set()


class ReadinessCheck(CheckBase):
    """grpclib's check interface over the board, for one service (None: the whole server)."""

    def __init__(self, board: ServingBoard, checks: tuple[str, ...] | None) -> None:
        self.board = board
        self.checks = checks

    def __status__(self) -> bool:
        return self.board.serving(self.checks)

    async def __check__(self) -> bool:
        return self.__status__()

    async def __subscribe__(self) -> asyncio.Event:
        return self.board.subscribe(self)

    async def __unsubscribe__(self, event: asyncio.Event) -> None:
        await self.board.unsubscribe(event)


class _Named:
    """A servable that only names its service (what grpclib reads a service's name from)."""

    def __init__(self, service: str) -> None:
        self.service = service

    def __mapping__(self) -> dict[str, Any]:
        return {f"/{self.service}/": None}


def _routes(servables: Iterable[Any]) -> tuple[Routes, ...]:
    return tuple(Routes(servable.__mapping__()) for servable in servables)


def health_routes(spec: ListenerSpec, board: ServingBoard) -> Routes:
    """The Health service of one listener: its own services and the whole server."""
    checks: dict[Any, list[CheckBase]] = {OVERALL: [ReadinessCheck(board, None)]}
    for service, _module in spec.services:
        if service in _SERVICE_CHECKS:
            checks[_Named(service)] = [ReadinessCheck(board, _SERVICE_CHECKS[service])]
    return Routes(Health(checks).__mapping__())


def reflection_routes(spec: ListenerSpec) -> tuple[Routes, ...]:
    """The reflection services of one listener, listing its services and Health."""
    names = [service for service, _module in spec.services] + [HEALTH_SERVICE]
    reflection = ServerReflection.extend([_Named(name) for name in names])[len(names) :]
    return _routes(reflection)


def warn_unknown_reflection(names: Collection[str], specs: Iterable[ListenerSpec]) -> None:
    """One WARNING per grpc_reflection name that no listener has (a typo serves nothing)."""
    known = {spec.name for spec in specs}
    for name in sorted(set(names) - known):
        log.warning(
            "grpc_reflection names %s, which is not a grpc_listeners entry: no listener serves"
            " reflection for it",
            name,
        )
