"""The upstream actors' child specs (the channel, the breaker's actor, the permits, the
slow-server sampler) and the `Args` they start with, read from the Config once."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Any

from actors.core import LogLine, breaker, permits
from actors.core.notify_store import NotifyPolicy, pending_max_for
from actors.core.replay_queue import ReplayPolicy
from actors.core.resend import ResendPolicy
from actors.upstream.actor import Upstream, UpstreamArgs
from actors.upstream.api import (
    BATCH_HEARTBEAT,
    CHANNEL_ACTOR_NAME,
    FORWARD_GUARDIAN_MESSAGE,
    NOTIFY_STREAM_STATUS,
    PROXY_INVENTORY,
    PROXY_REGISTER,
    REGULATOR_NAME,
    SLOW_SERVER_NAME,
    UPSTREAM_NAME,
)
from actors.upstream.notify import NotifyArgs
from actors.upstream.regulator import Regulator, RegulatorArgs
from actors.upstream.replay import ReplayArgs
from actors.upstream.slow_sampler import SlowSampler, SlowSamplerArgs
from gateway.config import Config
from gateway.config.context import NodeContext
from gateway.config.keys.breaker import (
    CIRCUIT_BREAKER_FAILURE_THRESHOLD,
    CIRCUIT_BREAKER_MAX_RESET_TIMEOUT_MS,
    CIRCUIT_BREAKER_RESET_TIMEOUT_MS,
)
from gateway.config.keys.cluster import CLUSTER_ID
from gateway.config.keys.listeners import GRPC_LISTENERS
from gateway.config.keys.replay import (
    NOTIFY_PENDING_MAX,
    NOTIFY_PROBE_TIMEOUT_MS,
    NOTIFY_UNACKED_DISCONNECTED_WINDOW_MS,
    NOTIFY_UNACKED_RETRY_BASE_MS,
    NOTIFY_UNACKED_RETRY_MAX_MS,
    NOTIFY_UNACKED_SLOW_AFTER_MS,
    NOTIFY_UNACKED_SLOW_MAX_MS,
    REGISTRATION_REPLAY_QUEUE_MAX,
    REGISTRATION_REPLAY_SESSION_GUARD_MS,
    REGISTRATION_REPLAY_START_JITTER_MS,
)
from gateway.config.keys.upstream import (
    UPSTREAM_CALL_TIMEOUT_MS,
    UPSTREAM_INVENTORY_CONCURRENCY,
    UPSTREAM_PERMIT_QUEUE_MAX,
    UPSTREAM_REGISTER_CONCURRENCY,
    UPSTREAM_REPLAY_CONCURRENCY,
    UPSTREAM_RPC_TIMEOUT_MS,
)
from gateway.upstream import rpc_metrics
from gateway.upstream.calls import UpstreamCalls
from gateway.upstream.channel_actor import UpstreamChannelActor
from supervisors.supervisor import ChildSpec

# The GatewayUpstream methods the gateway calls.
UPSTREAM_METHODS = (
    PROXY_REGISTER,
    PROXY_INVENTORY,
    BATCH_HEARTBEAT,
    NOTIFY_STREAM_STATUS,
    FORWARD_GUARDIAN_MESSAGE,
)

__all__ = [
    "child_specs",
    "notify_pending_max",
    "regulator_args",
    "rpc_timeout_s",
    "slow_server_specs",
    "upstream_args",
]


def child_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # Every call to the server is counted and timed by the channel's connections; the node's
    # registry exports those families, every method's series at 0 from the start.
    rpc_metrics.export(ctx.registry, UPSTREAM_METHODS)
    return (
        # Opens the upstream connections (without waiting for them) before anything that calls
        # the server starts.
        ChildSpec(CHANNEL_ACTOR_NAME, UpstreamChannelActor, ctx, name=CHANNEL_ACTOR_NAME),
        ChildSpec(UPSTREAM_NAME, Upstream, upstream_args(ctx), name=UPSTREAM_NAME),
        ChildSpec(REGULATOR_NAME, Regulator, regulator_args(ctx), name=REGULATOR_NAME),
    )


def slow_server_specs(ctx: NodeContext) -> tuple[ChildSpec, ...]:
    # Reads the lane states the upstream actors publish; not a readiness input.
    args = SlowSamplerArgs(ctx.registry)
    return (ChildSpec(SLOW_SERVER_NAME, SlowSampler, args, name=SLOW_SERVER_NAME),)


# --- the actors' arguments ----------------------------------------------------------------------


def upstream_args(ctx: NodeContext) -> UpstreamArgs:
    config = ctx.config
    return UpstreamArgs(
        breaker=breaker.policy_from_settings(
            threshold=config[CIRCUIT_BREAKER_FAILURE_THRESHOLD],
            reset_timeout_ms=config[CIRCUIT_BREAKER_RESET_TIMEOUT_MS],
            max_reset_timeout_ms=config[CIRCUIT_BREAKER_MAX_RESET_TIMEOUT_MS],
        ),
        notify=NotifyArgs(_notify_policy(config), ctx.node.name, config[CLUSTER_ID]),
        # Replays and recovered sessions take the registrations' call path.
        replay=ReplayArgs(_replay_policy(config), partial(UpstreamCalls, config=config)),
        rpc_timeout_s=rpc_timeout_s(config),
        registry=ctx.registry,
    )


def regulator_args(ctx: NodeContext) -> RegulatorArgs:
    policy, lines = _permit_policy(ctx.config)
    return RegulatorArgs(policy, tuple(lines), ctx.registry)


def rpc_timeout_s(config: Config) -> float:
    """upstream_rpc_timeout_ms in seconds: every upstream call but the probe's is bounded by it."""
    return config[UPSTREAM_RPC_TIMEOUT_MS] / 1000.0


def notify_pending_max(config: Config) -> int:
    """notify_pending_max in force: the configured value, else 3 x the sum of the agent
    listeners' limits.max_connections, at least 15,000 (C55)."""
    configured = config[NOTIFY_PENDING_MAX]
    if configured is not None:
        return int(configured)
    listeners: Iterable[Any] = config[GRPC_LISTENERS]
    return pending_max_for(spec.limits.max_connections for spec in listeners if spec.serves_agent)


def _notify_policy(config: Config) -> NotifyPolicy:
    resend_keys = (
        NOTIFY_UNACKED_RETRY_BASE_MS,
        NOTIFY_UNACKED_RETRY_MAX_MS,
        NOTIFY_UNACKED_SLOW_AFTER_MS,
        NOTIFY_UNACKED_SLOW_MAX_MS,
        NOTIFY_UNACKED_DISCONNECTED_WINDOW_MS,
    )
    return NotifyPolicy(
        pending_max=notify_pending_max(config),
        probe_timeout_s=config[NOTIFY_PROBE_TIMEOUT_MS] / 1000.0,
        resend=ResendPolicy.from_config({key.name: config[key] for key in resend_keys}),
    )


def _permit_policy(config: Config) -> tuple[permits.PermitPolicy, list[LogLine]]:
    """The permit policy the configuration asks for, and the lines its resolution logs (each
    regulator that starts logs them; the replay lane reads the resolved replay cap)."""
    return permits.policy_from_settings(
        register=config[UPSTREAM_REGISTER_CONCURRENCY],
        inventory=config[UPSTREAM_INVENTORY_CONCURRENCY],
        replay=config[UPSTREAM_REPLAY_CONCURRENCY],
        queue_max=config[UPSTREAM_PERMIT_QUEUE_MAX],
        call_timeout_ms=config[UPSTREAM_CALL_TIMEOUT_MS],
        rpc_timeout_ms=config[UPSTREAM_RPC_TIMEOUT_MS],
    )


def _replay_policy(config: Config) -> ReplayPolicy:
    """The replay core's numbers. The concurrency is the replay permits' cap as the regulator
    resolves it (half of register unless set, never above register)."""
    policy, _lines = _permit_policy(config)  # the regulator logs the lines
    return ReplayPolicy(
        guard_s=config[REGISTRATION_REPLAY_SESSION_GUARD_MS] / 1000.0,
        queue_max=config[REGISTRATION_REPLAY_QUEUE_MAX],
        concurrency=policy.configured.replay,
        start_jitter_s=config[REGISTRATION_REPLAY_START_JITTER_MS] / 1000.0,
    )
