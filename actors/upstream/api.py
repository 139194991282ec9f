"""The upstream feature's leaf: its registered names, its messages, the channel table and the
contracts between the upstream actors and the gateway's call path.

The registered names: `upstream` (actors/upstream/actor.py), `upstream_regulator`
(actors/upstream/regulator.py), `slow_server` (actors/upstream/slow_sampler.py) and
`upstream_channel`, the actor in gateway/upstream/channel_actor.py that publishes the channels
in the `upstream_channels` table (`upstream_channel` reads it).

Messages the `upstream` actor takes from the agent plane (tell, fire and forget).

What a restarted agent owner asks of the `upstream` actor while it recovers its session, and
the answers (seed: "When an agent's owner process crashes", step 3; docs/owner-recovery.md).

    owner -> upstream   SettleDisconnected(notify)    the predecessor's DISCONNECTED
    upstream -> owner   DisconnectSettled              it was delivered, refused or lost
    owner -> upstream   PresentSession(...)            ProxyRegister with the session id
    upstream -> owner   SessionPresented               the server's answer, or why none

The notification hold (`notify_hold`, a public table owned by the root supervisor, so it
outlives the `upstream` actor's restarts): the held store (`NotifyStore`, adopted by each new
`upstream` actor) and the inbox the owners post their `Notify` and `SettleDisconnected` into.
An owner wakes the actor with `NotificationsPosted` when its post finds the inbox empty; the
actor takes the whole inbox, in order, on that wake and when it starts. A notification posted
while the actor restarts, or left in a killed actor's mailbox, is therefore not lost.

The contract between the upstream channel and its callers.

A call either returns the decoded response or raises `UpstreamCallError`, whose `kind`
(and `status` for a gRPC status) is what the circuit breaker classifies
(`actors.core.breaker.classify`). `detail` is safe to log: it never holds request or
response contents, certificate paths of key files, or metadata values.

A replay and a recovered session take the call path of ProxyRegister (`Calls`, implemented by
gateway/upstream/calls.py), which refuses a call it does not send with `UpstreamRefused`.

The GatewayUpstream methods the gateway calls (gRPC routes on the full path).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, Literal, Protocol, TypeVar

import attrs
from google.protobuf.message import Message

from actors.core.breaker import ResultKind
from actors.core.notify_store import Event, NotifyStore, SettledOutcome
from actors.core.permits import Caller
from actors.registry.api import OWNERS_TABLE
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.address import Address
from supervisors.errors import TableGone

if TYPE_CHECKING:
    from supervisors.process import Process
    from supervisors.runtime import LoopSystemBase
    from supervisors.table import Table

UPSTREAM_NAME: Final = "upstream"
REGULATOR_NAME: Final = "upstream_regulator"
CHANNEL_ACTOR_NAME: Final = "upstream_channel"
SLOW_SERVER_NAME: Final = "slow_server"

# The protected table the channel actor publishes its channels in, keyed by channel name.
CHANNELS_TABLE: Final = "upstream_channels"
# The registration, inventory and heartbeat code call the channel of this name.
DEFAULT_CHANNEL: Final = "default_channel"

# What the owner ends a recovered session's stream with when it was not presented again: the
# server could not be reached, or the gateway is stopping (the agent registers again).
FAILED_DETAILS: Final = "session owner restarted; the server could not be reached"
STOPPING_DETAILS: Final = "gateway stopping; register again"


@attrs.frozen
class Notify:
    """Hold and send a stream-status notification (NotifyStreamStatus)."""

    agent_id: str
    session_id: str = attrs.field(repr=False)
    stream_home_id: str
    event: Event
    peer_addr: str = attrs.field(repr=False)


@attrs.frozen
class NotificationsPosted:
    """Tell (an owner, to `upstream`): the notification hold's inbox has posts to take."""


# The single key of the `notify_hold` table.
NOTIFY_HOLD_TABLE: Final = "notify_hold"
_HOLD_KEY: Final = "hold"


@attrs.define(eq=False)
class NotifyHold:
    """What outlives an `upstream` actor: its held store (None until the first actor starts)
    and the posts no actor has taken yet, each with the owner that posted it."""

    store: NotifyStore | None = None
    inbox: deque[tuple[Notify | SettleDisconnected, Address]] = attrs.field(factory=deque)

    def take(self) -> list[tuple[Notify | SettleDisconnected, Address]]:
        posts = list(self.inbox)
        self.inbox.clear()
        return posts


def create_notify_hold(process: Process) -> Table[str, NotifyHold]:
    """Create the public notification hold, owned by `process` (the root supervisor)."""
    table: Table[str, NotifyHold] = process.new_table(NOTIFY_HOLD_TABLE, "public")
    table.insert(_HOLD_KEY, NotifyHold())
    return table


def notify_hold(runtime: LoopSystemBase) -> NotifyHold | None:
    """The node's notification hold, or None (no table: a test tree without one)."""
    table = runtime.table(NOTIFY_HOLD_TABLE)
    if table is None:
        return None
    try:
        hold: NotifyHold | None = table.get(_HOLD_KEY)
    except TableGone:
        return None
    return hold


def post(runtime: LoopSystemBase, msg: Notify | SettleDisconnected, sender: Address) -> bool:
    """Post `msg` for the `upstream` actor, waking it if the inbox was empty. False: there is
    no hold, so nothing will take it."""
    hold = notify_hold(runtime)
    if hold is None:
        return False
    wake = not hold.inbox
    hold.inbox.append((msg, sender))
    if wake and (upstream := runtime.whereis(UPSTREAM_NAME)) is not None:
        runtime.send(sender, upstream, NotificationsPosted())
    return True


@attrs.frozen
class ForwardGuardian:
    """Forward an unsolicited `__guard__` frame upstream with the gateway-asserted agent id
    (at most 50 in flight; dropped while the breaker is open)."""

    agent_id: str
    response: agent_pb2.CommandResponse = attrs.field(repr=False)


@attrs.frozen
class SettleDisconnected:
    """Hold and send `notify` (a DISCONNECTED) like any notification, after ending every resend
    of the session (a refused notice of the predecessor is not sent again: counted
    unacked_ended{superseded}); answer `DisconnectSettled` when it settles."""

    notify: Notify


@attrs.frozen
class DisconnectSettled:
    session_id: str = attrs.field(repr=False)
    outcome: SettledOutcome


@attrs.frozen
class PresentSession:
    """ProxyRegister `request` with `session_id` in x-yuzu-session-id (the replay permits, the
    breaker, upstream_rpc_timeout_ms); answer `SessionPresented`."""

    session_id: str = attrs.field(repr=False)
    agent_id: str
    request: agent_pb2.RegisterRequest = attrs.field(repr=False)


@attrs.frozen
class SessionPresented:
    """`accepted`: the server adopted the session. Otherwise `details` ends the agent's stream
    (UNAVAILABLE) and `reason` is the counted cause (`not_accepted`, `superseded`, `failed`,
    `stopping`)."""

    session_id: str = attrs.field(repr=False)
    accepted: bool
    details: str = ""
    reason: str = ""


@attrs.frozen
class CallFailed:
    """Tell: a call that never feeds the breaker (the heartbeat flush's BatchHeartbeat) failed.
    The `upstream` actor counts it in yuzu_gw_upstream_rpc_errors_total and logs its `Upstream
    RPC` line, rate limited, exactly as it does the other lanes' failures. `detail` is safe to
    log (`UpstreamCallError.detail`)."""

    method: str
    kind: ResultKind
    status: int | None = None
    detail: str = ""


M = TypeVar("M", bound=Message)


class UpstreamCallError(Exception):
    def __init__(self, kind: ResultKind, status: int | None = None, detail: str = "") -> None:
        super().__init__(
            f"{kind.value}"
            + (f" {status}" if status is not None else "")
            + (f": {detail}" if detail else "")
        )
        self.kind = kind
        self.status = status
        self.detail = detail


RefusalReason = Literal["circuit_open", "queue_full", "deadline", "stopping", "unavailable"]


class UpstreamRefused(Exception):
    """The gateway refused the call itself; the gRPC handler answers UNAVAILABLE.

    `circuit_open`: the breaker is open. `queue_full` / `deadline`: no permit (the request was
    not sent). `stopping`: a planned stop. `unavailable`: the upstream actors are not running
    (a restart gap; the seed's upstream_unavailable)."""

    def __init__(self, reason: RefusalReason) -> None:
        super().__init__(reason)
        self.reason: RefusalReason = reason


class Calls(Protocol):
    """The call path of ProxyRegister and ProxyInventory (gateway/upstream/calls.py): the
    breaker, a permit, the timeouts, the outcome told to the `upstream` actor."""

    async def call(
        self,
        caller: Caller,
        method: str,
        request: Message,
        response_type: type[M],
        *,
        grpc_timeout_s: float | None,
        metadata: Mapping[str, str] | None = None,
    ) -> M:
        """Returns the response, raises `UpstreamRefused` (not sent) or `UpstreamCallError`."""
        ...


class Channel(Protocol):
    """One named upstream channel (`default_channel`)."""

    name: str

    async def unary(
        self,
        method: str,
        request: Message,
        response_type: type[M],
        *,
        timeout: float,
        metadata: Mapping[str, str] | None = None,
    ) -> M:
        """Send one unary call on the next live connection (round robin). `timeout`
        (seconds) covers waiting for a connection too and is sent as `grpc-timeout`."""
        ...

    def server_max_streams(self) -> int:
        """The sum of SETTINGS_MAX_CONCURRENT_STREAMS over live connections; 0 = unknown
        or no limit declared."""
        ...

    def add_settings_listener(self, listener: Callable[[int], None]) -> None:
        """Called with the new total whenever it changes."""
        ...

    def tls_files_usable(self) -> bool:
        """False while the latest connection attempt failed on unusable TLS files (the
        `upstream_tls_files` readiness check)."""
        ...


def upstream_channel(runtime: LoopSystemBase, name: str = DEFAULT_CHANNEL) -> Channel | None:
    """The published channel `name` (a table read, no message), or None while none is."""
    table = runtime.table(CHANNELS_TABLE)
    return None if table is None else table.get(name)


SERVICE: Final = "yuzu.gateway.v1.GatewayUpstream"


PROXY_REGISTER: Final = f"/{SERVICE}/ProxyRegister"


BATCH_HEARTBEAT: Final = f"/{SERVICE}/BatchHeartbeat"


PROXY_INVENTORY: Final = f"/{SERVICE}/ProxyInventory"


NOTIFY_STREAM_STATUS: Final = f"/{SERVICE}/NotifyStreamStatus"


FORWARD_GUARDIAN_MESSAGE: Final = f"/{SERVICE}/ForwardGuardianMessage"


# The metadata key that presents a session on a replay or an owner recovery (WIRE.md).
SESSION_ID_METADATA: Final = "x-yuzu-session-id"


@attrs.frozen
class EndSession:
    """Tell (the `upstream` actor's registration replay): the server refused this session (a
    replay answered accepted=false, or FAILED_PRECONDITION: superseded). The owner of
    `session_id` ends it normally, so its DISCONNECTED goes once, and closes the agent's stream
    UNAVAILABLE with `details` so the agent registers afresh."""

    session_id: str = attrs.field(repr=False)
    details: str


class StoredSession(Protocol):
    """What the registration replay reads from an owner-table row. The rows are the owners'
    (`OwnerRow`, actors/agents/api.py); reading them through this view keeps the upstream
    feature below the agents one, which sends it notifications."""

    @property
    def owner(self) -> Address: ...

    @property
    def agent_id(self) -> str: ...

    @property
    def stream_home_id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def register(self) -> agent_pb2.RegisterRequest | None: ...


def stored_session(runtime: LoopSystemBase, session_id: str) -> StoredSession | None:
    """The session's owner-table row, or None (no row, or no table)."""
    table = runtime.table(OWNERS_TABLE)
    if table is None:
        return None
    try:
        row: StoredSession | None = table.get(session_id)
    except TableGone:
        return None
    return row
