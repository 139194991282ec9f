"""Keys of the upstream client: the channel map (`upstream_client`), dead look-alikes, the test
acknowledgement, the channel's TCP option and the call permits.

`upstream_client` is parsed by `gateway/config/upstream_client.py`, which refuses a shape it
cannot use with its own defect names; its file and environment checks run at boot
(`gateway/upstream/boot_check.py`), not here, so a config file can be read and validated
without the TLS files being present.

The permit keys mirror `actors/core/permits.py` (its names, defaults and bounds): the manual
gives the defaults and "WARN, default used" but no bounds, so the bounds only refuse what
cannot work (below 1) or is absurd."""

from __future__ import annotations

from typing import Any

from gateway.config.converters import AnyTerm, Boolean, IntRange, LiteralTrue, OrUndefined
from gateway.config.schema import Key, NameOrigin, Refuse
from gateway.config.section import NoEffectVariable
from gateway.config.terms import Atom, Term
from gateway.config.upstream_client import ClientConfigConverter, ClientSpec

AREA = "upstream"
_START = "upstream client start"
_CONCURRENCY = IntRange(1, 4096)
_TIMEOUT_MS = IntRange(1, 3_600_000)


def _dead(name: str, shipped: str) -> Key[Term]:
    return Key(
        name=name,
        default=Atom("undefined"),
        convert=AnyTerm(),
        read_when="never",
        doc=f"Read by nothing (old configs ship {shipped}). The channel endpoints and their"
        " pool_size in upstream_client are what count.",
        area=AREA,
        effect=False,
        default_doc="none",
        bad_doc="no effect",
    )


UPSTREAM_ADDR = _dead("upstream_addr", '"127.0.0.1"')
UPSTREAM_PORT = _dead("upstream_port", "50055")
UPSTREAM_POOL_SIZE = _dead("upstream_pool_size", "16")

# The manual's config comment says these variables "only set" the two dead keys; its later
# upstream-client section says they are now ignored with a boot warning and no ENV override
# line. The later text describes the current gateway, so that is what this does.
NO_EFFECT_ENV = (
    NoEffectVariable("YUZU_GW_UPSTREAM_ADDR", "no effect: repoint the channel endpoint"),
    NoEffectVariable("YUZU_GW_UPSTREAM_PORT", "no effect: repoint the channel endpoint"),
)

UPSTREAM_CLIENT: Key[ClientSpec | None] = Key(
    name="upstream_client",
    default=Atom("undefined"),
    convert=ClientConfigConverter(),
    read_when="boot (parsed with the config; TLS files checked before anything starts)",
    doc="The upstream channels: #{channels => [{default_channel, [{http | https, Host, Port,"
    " SslOptions}], #{pool_size => 1}}]}. Options, refusals and warnings:"
    " docs/upstream-channel.md.",
    area=AREA,
    on_bad=Refuse("bad_client_config"),
    default_doc="none (no channel; boot is refused unless allow_no_upstream is true)",
    bad_doc="refuse boot: `bad_client_config`, `bad_channel`, `bad_endpoint`, `bad_host`,"
    " `bad_socket_options`, `mixed_upstream_endpoints`, `no_default_channel`,"
    " `unverified_upstream_tls`, `unusable_upstream_tls_file`; a bad pool_size,"
    " connect_timeout or max_receive_message_bytes: WARN, default used",
)

ALLOW_NO_UPSTREAM: Key[bool] = Key(
    name="allow_no_upstream",
    default=False,
    convert=LiteralTrue(),
    read_when="boot",
    doc="Test-only acknowledgement: boot without a default_channel. Never in a deployment.",
    area=AREA,
    default_doc="unset",
    bad_doc="any value but `true` counts as unset",
)

UPSTREAM_TCP_NODELAY: Key[bool] = Key(
    name="upstream_tcp_nodelay",
    default=True,
    convert=Boolean(),
    read_when="when the channel configuration is parsed, at start",
    doc="TCP_NODELAY on the upstream connections.",
    area=AREA,
)

UPSTREAM_REGISTER_CONCURRENCY: Key[int] = Key(
    name="upstream_register_concurrency",
    default=48,
    convert=_CONCURRENCY,
    read_when=_START,
    doc="Register permits. Above what the server's stream limit allows it has no effect.",
    area=AREA,
    our_choices=("valid values",),
)

UPSTREAM_INVENTORY_CONCURRENCY: Key[int] = Key(
    name="upstream_inventory_concurrency",
    default=8,
    convert=_CONCURRENCY,
    read_when=_START,
    doc="Inventory permits.",
    area=AREA,
    origin=NameOrigin.OURS,
)

UPSTREAM_REPLAY_CONCURRENCY: Key[int | None] = Key(
    name="upstream_replay_concurrency",
    default=Atom("undefined"),
    convert=OrUndefined(_CONCURRENCY),
    read_when=_START,
    doc="Registration replays at once; the permit policy caps it at the register pool.",
    area=AREA,
    our_choices=("valid values",),
    default_doc="half of upstream_register_concurrency (24)",
)

UPSTREAM_PERMIT_QUEUE_MAX: Key[int] = Key(
    name="upstream_permit_queue_max",
    default=10000,
    convert=IntRange(1, 1_000_000),
    read_when=_START,
    doc="Requests that may wait for a permit, per caller kind.",
    area=AREA,
    origin=NameOrigin.OURS,
)

UPSTREAM_CALL_TIMEOUT_MS: Key[int] = Key(
    name="upstream_call_timeout_ms",
    default=25000,
    convert=_TIMEOUT_MS,
    read_when="on every call",
    doc="How long a request that sent no grpc-timeout waits for a permit (the agent's 30 s"
    " Register deadline less the handler margin).",
    area=AREA,
    our_choices=("default", "valid values"),
)

UPSTREAM_RPC_TIMEOUT_MS: Key[int] = Key(
    name="upstream_rpc_timeout_ms",
    default=5000,
    convert=_TIMEOUT_MS,
    read_when="on every call",
    doc="The most one upstream call gets: min(deadline - now, this).",
    area=AREA,
    our_choices=("valid values",),
)

KEYS: tuple[Key[Any], ...] = (
    UPSTREAM_CLIENT,
    UPSTREAM_ADDR,
    UPSTREAM_PORT,
    UPSTREAM_POOL_SIZE,
    ALLOW_NO_UPSTREAM,
    UPSTREAM_TCP_NODELAY,
    UPSTREAM_REGISTER_CONCURRENCY,
    UPSTREAM_INVENTORY_CONCURRENCY,
    UPSTREAM_REPLAY_CONCURRENCY,
    UPSTREAM_PERMIT_QUEUE_MAX,
    UPSTREAM_CALL_TIMEOUT_MS,
    UPSTREAM_RPC_TIMEOUT_MS,
)
