"""What gateway_sup starts for management peer authorisation and hands the listeners.

    auth = mgmt_auth_tree(ctx)
    listeners = listener_child_specs(ctx, handlers, peer_gate=auth.gate)
    children = (..., auth.watcher, *listeners)    # the watcher before the listeners

The policy comes from the configuration as the boot check left it (the identity resolved
there); the pin board and the watcher's core are created here, once per tree, and shared by the
watcher (the writer) and the gate (the reader), so a restarted watcher keeps its last known good
keys.

Watched files and their labels: each `{cert_file, Path}` pin (role `mgmt_peer_pin`, name: the
path), each listener's TLS files (`listener_certfile` / `listener_cacertfile`, name: the
listener) and the upstream channel's (`upstream_certfile` / `upstream_cacertfile`, name: the
channel; several endpoints of one channel are one series). Inline certificates are not files
and are not reported.
"""

from __future__ import annotations

import attrs

from gateway.config.config import Config
from gateway.config.context import NodeContext
from gateway.config.keys.listeners import GRPC_LISTENERS
from gateway.config.keys.mgmt import (
    MGMT_PEER_AUTH_MODE,
    MGMT_PEER_DENIED,
    MGMT_PEER_IDENTITY,
    MGMT_PEER_PINS,
    MGMT_PIN_REFRESH_MS,
)
from gateway.config.keys.upstream import UPSTREAM_CLIENT
from gateway.mgmt.auth.decide import Policy
from gateway.mgmt.auth.gate import PeerGate, PinBoard
from gateway.mgmt.auth.metrics import mgmt_auth_metrics
from gateway.mgmt.auth.tls_reload import TlsReload
from gateway.mgmt.auth.watch import CertWatch, WatchedFile
from gateway.mgmt.auth.watcher import NAME, PinWatcher, WatcherArgs
from supervisors.supervisor import ChildSpec

__all__ = ["MgmtAuthTree", "mgmt_auth_tree", "policy_of", "watched_files"]


@attrs.frozen(eq=False)
class MgmtAuthTree:
    gate: PeerGate
    watcher: ChildSpec


def policy_of(config: Config) -> Policy:
    return Policy(
        mode=config[MGMT_PEER_AUTH_MODE],
        identity=config[MGMT_PEER_IDENTITY],
        pins_configured=len(config[MGMT_PEER_PINS]),
        denied=frozenset(serial.value for serial in config[MGMT_PEER_DENIED]),
    )


def watched_files(config: Config) -> tuple[WatchedFile, ...]:
    """The certificate files other than the pins, with their labels (module doc)."""
    files: list[WatchedFile] = []
    for spec in config[GRPC_LISTENERS]:
        if spec.tls is not None:
            files.append(WatchedFile("listener_certfile", spec.name, spec.tls.certfile))
            files.append(WatchedFile("listener_cacertfile", spec.name, spec.tls.cacertfile))
    client = config[UPSTREAM_CLIENT]
    for channel in client.channels if client is not None else ():
        for endpoint in channel.endpoints:
            if not endpoint.is_tls:
                continue
            if endpoint.tls.certfile is not None:
                files.append(WatchedFile("upstream_certfile", channel.name, endpoint.tls.certfile))
            if endpoint.tls.cacertfile is not None:
                files.append(
                    WatchedFile("upstream_cacertfile", channel.name, endpoint.tls.cacertfile)
                )
    return tuple(dict.fromkeys(files))


def mgmt_auth_tree(ctx: NodeContext) -> MgmtAuthTree:
    config = ctx.config
    board = PinBoard()
    metrics = mgmt_auth_metrics(ctx.registry)
    watch = CertWatch(config[MGMT_PEER_PINS], watched_files(config))
    args = WatcherArgs(
        watch,
        board,
        metrics,
        config[MGMT_PIN_REFRESH_MS] / 1000,
        reload=TlsReload.of(config, ctx.registry),
    )
    return MgmtAuthTree(
        gate=PeerGate(policy_of(config), board, metrics),
        watcher=ChildSpec(NAME, PinWatcher, args, restart="permanent", name=NAME),
    )
