"""`cluster`: membership, the inter-node transport and the forwarding of commands (seed:
"Gateway Clustering"; docs/cluster.md).

A permanent child of `gateway_sup`, after the router. It

1. serves `ClusterService` (gateway/cluster/transport.py) on `cluster_port` of the node name's
   host, the advertise address, and nowhere else; a port it cannot bind is logged and tried
   again every round: the node serves alone meanwhile (fail-open);
2. runs the membership rounds of gateway/cluster/membership.py every
   `cluster_redial_interval_ms`: resolves the seeds, dials and challenges new peers, probes the
   links that are up, and publishes the links that are up in the public table `cluster_links`
   (actors/cluster/api.py), which the router and the management plane read; a host (a seed
   entry without a port, an A record) is dialled on the cluster ports its nodes advertise in
   their challenge answers (gateway/cluster/hosts.py), each newly learned one at once;
3. keeps the agent directory (actors/core/agent_directory.py, replicated by
   gateway/cluster/directory.py): follows each linked peer's `Directory` call (its full sync,
   then its joins and leaves), purges a peer's entries when its link goes down, and while any
   peer reads this node's directory scans the agents it holds every `DIRECTORY_SCAN_S` and
   publishes what changed;
4. forwards the commands the router could not deliver here (`ForwardCommand`) to the one node
   the directory says holds each target, on that link's command stream
   (gateway/cluster/commands.py), merges the answers (gateway/cluster/merge.py: the newest
   holder first, the next only when it says it does not hold the agent) and sends them to the
   router as an owner would (`CommandAnswer`, `CommandFailed`); `ForgetCommand` tells the
   peers to forget it. A link whose stream ends (`LinkEnded`) is down at once: its commands'
   unanswered targets settle `agent_disconnected` and the next round dials it again.

Never logged: the cookie, commands, agent ids.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import socket
import ssl
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs
from google.protobuf import empty_pb2
from thespian.actors import WakeupMessage

from actors.agents.api import CommandAnswer, CommandFailed, FailReason, ForgetCommand
from actors.cluster.api import (
    CLUSTER_NAME,
    DIRECTORY_KEY,
    DIRECTORY_TABLE,
    LINKS_TABLE,
    ForwardCommand,
    LinkEnded,
    PeerEnded,
    PeerFrame,
)
from actors.core.agent_directory import AgentDirectory
from actors.core.warn_limit import WarnLimiter
from actors.registry.api import held_agent_ids
from gateway.cluster.directory import (
    FEED_KEY,
    DirectoryEnded,
    DirectoryFeed,
    DirectoryRecords,
    follow,
)
from gateway.cluster.hosts import HostAdvert, HostPlan, Target, port_list
from gateway.cluster.membership import Dial, DialOutcome, Effect, Membership, Probe, Resolve
from gateway.cluster.merge import Answer, Fail, MergeEffect, RemoteMerge, Send
from gateway.cluster.metrics import cluster_metrics
from gateway.cluster.transport import ClusterServer, ClusterService, PeerLink
from gateway.config.cluster_seeds import DEFAULT_CLUSTER_PORT, PeerAddr, host_ports, seed_target
from gateway.config.cluster_tls import link_contexts
from gateway.config.keys.cluster import (
    CLUSTER_MAX_LIFETIME_ADDRS,
    CLUSTER_PORT,
    CLUSTER_REDIAL_INTERVAL_MS,
    CLUSTER_SEED_DNS_NAME,
    CLUSTER_SEED_NODES,
    cluster_tls,
)
from gateway.config.refusal import BootRefused
from gateway.mgmt.metrics import mgmt_metrics
from gateway.mgmt.plane import MgmtPlane
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.server.v1 import management_pb2 as mgmt
from supervisors.messages import WorkerDone
from supervisors.process import Process
from supervisors.reason import ExitReason
from supervisors.supervisor import ChildSpec

if TYPE_CHECKING:
    from gateway.config.context import NodeContext

__all__ = ["CLUSTER_NAME", "Cluster", "cluster_child_spec"]

log = logging.getLogger("yuzu_gw.cluster")

_ROUND = "cluster_round"
_SERVE = "cluster_serve"
_RESOLVE = "cluster_resolve"
_SCAN = "cluster_directory_scan"
# While a peer reads this node's directory, the agents held are compared with what was
# published this often: a join or a leave reaches the peers within about this (plus a hop).
DIRECTORY_SCAN_S = 0.1
# A dial (connect + challenge) or a probe gets at most this long, and never more than a round.
DIAL_TIMEOUT_S = 5.0
# A forwarded command's peers get this much past the origin's deadline, so the origin's own
# timer, not the peer's, decides TIMEOUT; a command still unanswered past it (its router went
# without a ForgetCommand) is settled at the next round and the peers told to forget it.
FORWARD_SLACK_S = 2.0
_RUNNING = agent_pb2.CommandResponse.Status.RUNNING


def cluster_child_spec(ctx: NodeContext) -> ChildSpec:
    return ChildSpec(CLUSTER_NAME, Cluster, ctx, restart="permanent", name=CLUSTER_NAME)


@attrs.define(eq=False)
class _Remote:
    """One forwarded command: its merge, the request each wave sends, its deadline, and its
    waves' sequence numbers on their links."""

    command_id: str
    reply_to: Any
    merge: RemoteMerge
    command: agent_pb2.CommandRequest = attrs.field(repr=False)
    timeout_seconds: int
    expires: float
    seqs: dict[int, PeerLink] = attrs.field(factory=dict)


@attrs.frozen
class _ScanNow:
    """A peer opened this node's directory: scan while anyone reads it."""


class Cluster(Process):
    def init(self, args: NodeContext) -> None:
        ctx = args
        config = ctx.config
        self.ctx = ctx
        node = ctx.node
        self.host = node.name.split("@", 1)[1]
        self.port = config[CLUSTER_PORT]
        # Port 0 (tests) is a free port no peer can be told: a host's ports are then unknown.
        ports = (
            host_ports(self.port, node.index, node.host_nodes)
            if self.port
            else (DEFAULT_CLUSTER_PORT,)
        )
        self.host_ports = ports
        self.plan = HostPlan(ports)
        self.seeds = tuple(seed_target(entry, ports[0]) for entry in config[CLUSTER_SEED_NODES])
        # The last round's discovery: what `plan` turns into addresses, again when it learns.
        self.targets: tuple[Target, ...] = ()
        # The other nodes of this host are peers whatever the discovery finds: the release
        # started them, and the shared management port can hand an operator to any of them.
        self.siblings = tuple(PeerAddr(self.host, p) for p in ports if self.port and p != self.port)
        self.dns_name = config[CLUSTER_SEED_DNS_NAME]
        interval_s = config[CLUSTER_REDIAL_INTERVAL_MS] / 1000
        self.interval_s = interval_s
        self.membership = Membership(interval_s, config[CLUSTER_MAX_LIFETIME_ADDRS])
        self.node_id = secrets.token_hex(16)
        self.cookie = ctx.node.cookie
        self.metrics = cluster_metrics(ctx.registry)
        self.links = self.new_table(LINKS_TABLE, "public")
        self.pending: dict[PeerAddr, PeerLink] = {}
        self.limiter = WarnLimiter()
        plane = MgmtPlane(runtime=self.runtime, metrics=mgmt_metrics(ctx.registry))
        # Read at each start, as a listener's files are: an unusable one fails this start (at
        # boot, the boot: `start_failed`); this line says which file.
        try:
            tls = link_contexts(cluster_tls(config))
        except BootRefused as refusal:
            log.error("Cluster transport cannot start: %s", refusal)
            raise
        if tls is None:
            log.warning(
                "Cluster links are plaintext (cluster_tls_* unset): the development posture"
                " only, commands and agent ids cross hosts in clear"
            )
        self.client_tls = tls.client if tls is not None else None
        self.service = ClusterService(self.cookie, self.node_id, plane, self.metrics.refused.inc)
        # Set before the listener opens, so no dialler reads an answer without it (port 0,
        # tests: once bound).
        self.service.advert = HostAdvert(ports[0], len(ports)) if self.port else None
        self.server = ClusterServer(self.service, tls.server if tls is not None else None)
        self.serving = False
        self.binding = False
        # A wave's sequence number -> its command and the wave (its route in the merge).
        self.remotes: dict[int, tuple[_Remote, int]] = {}
        self.seq = 0
        self.forwarded = 0
        self.directory = AgentDirectory()
        self.feed = DirectoryFeed(self.directory, lambda: self._tell(_ScanNow()))
        table = self.new_table(DIRECTORY_TABLE)
        table.insert(DIRECTORY_KEY, self.directory)
        table.insert(FEED_KEY, self.feed)
        self.scanning = False
        self._bind()
        self._round()

    # -- messages ------------------------------------------------------------------------------

    def receiveMessage(self, msg: Any, sender: Any) -> None:
        match msg:
            case WakeupMessage(payload=payload) if payload == _ROUND:
                self._round()
            case WorkerDone(tag=tag):
                self._worker_done(tag, msg)
            case ForwardCommand():
                self._forward(msg)
            case PeerFrame(seq=seq, peer=peer, agent_id=agent_id, response=response):
                found = self.remotes.get(seq)
                if found is not None:
                    remote, wave = found
                    final = response is None or response.status != _RUNNING
                    held = response is not None
                    route = (cast(PeerLink, peer).addr, wave)
                    self._apply(remote, remote.merge.frame(route, agent_id, held, final), response)
            case PeerEnded(seq=seq, peer=peer):
                found = self.remotes.get(seq)
                if found is not None:
                    remote, wave = found
                    self._apply(remote, remote.merge.ended((cast(PeerLink, peer).addr, wave)))
            case LinkEnded(peer=peer, refused=refused):
                self._link_ended(cast(PeerLink, peer), refused)
            case DirectoryRecords(peer=peer, records=records):
                link = cast(PeerLink, peer)
                if self.links.get(link.addr) is link:
                    for record in records:
                        self.directory.apply(link.addr, record)
                    self._directory_gauges()
            case DirectoryEnded(peer=peer):
                # The peer's directory is not followed any more: the link is not trusted.
                self._link_ended(cast(PeerLink, peer), False)
            case _ScanNow():
                if not self.scanning:
                    self._scan()
            case WakeupMessage(payload=payload) if payload == _SCAN:
                self.scanning = False
                self._scan()
            case ForgetCommand(command_id=command_id):
                for remote in {r for r, _ in self.remotes.values() if r.command_id == command_id}:
                    self._drop(remote, forget=True)
            case _:
                pass

    def terminate(self, reason: ExitReason) -> None:
        self.remotes.clear()
        if self.serving:
            # The node leaves the cluster: the peers' calls to it fail now, not at a deadline.
            self.server.leave()
        for link in [*self.links.values(), *self.pending.values()]:
            link.close()
        self.metrics.connected.set(0)

    def format_status(self) -> Mapping[str, Any]:
        return {
            "serving": self.serving,
            "peers_resolved": self.membership.peers_resolved,
            "peers_connected": self.membership.peers_connected,
            "addresses_over_cap": self.membership.capped,
            "forwarded_commands": self.forwarded,
            "forwards_in_flight": len({id(r) for r, _ in self.remotes.values()}),
            "directory_local_agents": self.directory.local_count(),
            "directory_remote_agents": self.directory.remote_count(),
            "directory_readers": self.feed.readers,
            "hosts_advertised": self.plan.status(),
            "undialled_nodes": {h: port_list(p) for h, p in self.plan.current_gaps().items()},
        }

    # -- the transport -------------------------------------------------------------------------

    def _bind(self) -> None:
        if self.serving or self.binding:
            return
        self.binding = True
        self.run_worker(self._serve(), _SERVE)

    async def _serve(self) -> int:
        await self.server.serve(self.host, self.port)
        return self.server.bound_port(self.port)

    # -- membership ----------------------------------------------------------------------------

    def _round(self) -> None:
        self._bind()
        self._perform(self.membership.tick(self.now()))
        self._expire()
        self.directory.expire(self.now())
        self._directory_gauges()
        self.wakeupAfter(self.interval_s, _ROUND)

    def _perform(self, effects: Sequence[Effect]) -> None:
        for effect in effects:
            match effect:
                case Resolve():
                    self.run_worker(self._resolve(), _RESOLVE)
                case Dial(addr=addr):
                    link = PeerLink(addr, self.cookie, self.node_id, self.client_tls)
                    self.pending[addr] = link
                    self.run_worker(link.dial(self._dial_timeout(), self._tell), ("dial", addr))
                case Probe(addr=addr):
                    probe = self.links.get(addr)
                    if probe is not None:
                        call = probe.unary(
                            "Ping", empty_pb2.Empty(), empty_pb2.Empty, self._dial_timeout()
                        )
                        self.run_worker(call, ("probe", addr))

    def _tell(self, msg: object) -> None:
        """A link's answers, told from its own task."""
        self.runtime.tell(self.myAddress, msg)

    def _dial_timeout(self) -> float:
        return min(DIAL_TIMEOUT_S, self.interval_s)

    async def _resolve(self) -> list[Target]:
        return list(self.seeds) if self.seeds else await self._dns_hosts()

    async def _dns_hosts(self) -> list[Target]:
        """The seed name's A records, each a host."""
        try:
            async with asyncio.timeout(self.interval_s):
                infos = await self.loop.getaddrinfo(
                    self.dns_name, None, family=socket.AF_INET, type=socket.SOCK_STREAM
                )
        except (OSError, TimeoutError, UnicodeError):
            return []
        return list(dict.fromkeys(str(info[4][0]) for info in infos))

    def _addresses(self) -> list[PeerAddr]:
        """The addresses the round's targets name now, this host's other nodes first; the gaps
        a seed list leaves in the hosts it names are said once each (and counted)."""
        addrs = list(dict.fromkeys((*self.siblings, *self.plan.addresses(self.targets))))
        me = PeerAddr(self.host, self.server.bound_port(self.port))
        for host, missing in self.plan.report([*addrs, me]).items():
            log.warning(
                "Cluster host %s advertises nodes on cluster ports %s; this node does not dial"
                " %s (its seed list names that host's nodes as host:port and leaves these out)",
                host,
                port_list(self.plan.advertised(host)),
                port_list(missing),
            )
        self.metrics.undialled.set(sum(map(len, self.plan.current_gaps().values())))
        return addrs

    def _learn(self, link: PeerLink) -> None:
        """What the peer just linked said of its host; its newly learned ports dialled now."""
        addr, advert = link.addr, link.peer_host
        if advert is None:
            if self.plan.unadvertised(addr.host):
                log.warning(
                    "Cluster peer %s does not advertise its host's nodes (an older gateway);"
                    " its host is dialled on this host's cluster ports %s",
                    addr,
                    port_list(self.host_ports),
                )
        elif self.plan.learn(addr, advert):
            self._perform(self.membership.retarget(self._addresses()))

    def _worker_done(self, tag: Any, done: WorkerDone) -> None:
        error = done.error
        match tag:
            case "cluster_serve":
                self.binding = False
                if error is None:
                    self.serving = True
                    self.ctx.record_bound("cluster", (self.host, int(done.result)))
                    if not self.port:
                        # A free port (tests): the host of this one node.
                        self.service.advert = HostAdvert(int(done.result), 1)
                    log.info("Cluster transport listening on %s:%s", self.host, done.result)
                else:
                    self._warn(
                        "bind",
                        "Cluster transport cannot listen on %s:%s (%s); serving alone, trying"
                        " again every round",
                        self.host,
                        self.port,
                        type(error).__name__,
                    )
            case "cluster_resolve":
                self.targets = tuple(cast(list[Target], done.result or []))
                self._perform(self.membership.resolved(self._addresses()))
                self.metrics.resolved.set(self.membership.peers_resolved)
            case ("dial", addr):
                link = self.pending.pop(addr)
                outcome = cast(DialOutcome, done.result if error is None else "failed")
                if outcome == "up" and link.ended:
                    outcome = "failed"  # its stream broke before this was read: not up
                if isinstance(error, ssl.SSLError):
                    self._warn(
                        ("tls", addr),
                        "Cluster peer %s failed the TLS handshake (%s)",
                        addr,
                        getattr(error, "reason", None) or type(error).__name__,
                    )
                if self.membership.dialed(addr, outcome):
                    self.links.insert(addr, link)
                    log.info("Cluster peer %s connected", addr)
                    self._learn(link)
                    # The full sync of its agents, then their joins and leaves.
                    self.run_worker(follow(link, self._tell), ("directory", addr))
                else:
                    link.close()
                    if outcome == "refused":
                        self.metrics.refused.inc()
                        self._warn(
                            ("refused", addr),
                            "Cluster peer %s refused: its proof does not match this node's cookie",
                            addr,
                        )
                self._gauges()
            case ("probe", addr):
                if self.membership.probed(addr, error is None):
                    self._link_down(addr)
            case _:
                pass

    def _link_down(self, addr: PeerAddr) -> None:
        link = self.links.get(addr)
        if link is not None:
            self.links.delete(addr)
            link.close()
            log.warning("Cluster peer %s lost", addr)
        self.directory.purge(addr, self.now())
        self._gauges()
        self._directory_gauges()

    def _directory_gauges(self) -> None:
        self.metrics.directory_agents.set(self.directory.remote_count())
        self.metrics.unreachable_peers.set(len(self.directory.unreachable_peers()))

    def _scan(self) -> None:
        """Publish the joins and leaves of this node's agents since the last scan (module doc);
        again in `DIRECTORY_SCAN_S` while any peer reads them."""
        if not self.feed.readers:
            return
        held = frozenset(held_agent_ids(self.runtime) or ())
        self.feed.publish(self.directory.observe(held, int(time.time() * 1000)))
        self.scanning = True
        self.wakeupAfter(DIRECTORY_SCAN_S, _SCAN)

    def _gauges(self) -> None:
        self.metrics.resolved.set(self.membership.peers_resolved)
        self.metrics.connected.set(self.membership.peers_connected)

    def _warn(self, kind: object, line: str, *args: object) -> None:
        suffix = self.limiter.admit(kind, self.now())
        if suffix is not None:
            log.warning(line + "%s", *args, suffix)

    # -- forwarded commands --------------------------------------------------------------------

    def _forward(self, msg: ForwardCommand) -> None:
        """Each target to the reachable node the directory says holds it (newest first)."""
        links = self.links
        directory = self.directory
        candidates: dict[str, list[Hashable]] = {}
        lost: list[str] = []
        for agent_id in msg.agent_ids:
            candidates[agent_id] = [p for p in directory.candidates(agent_id) if p in links]
            if directory.unreachable_holder(agent_id) is not None:
                lost.append(agent_id)
        self.forwarded += 1
        remaining = msg.deadline - self.now()
        remote = _Remote(
            msg.command.command_id,
            msg.reply_to,
            RemoteMerge(candidates, lost),
            msg.command,
            max(1, math.ceil(remaining)) + 1,
            msg.deadline + FORWARD_SLACK_S,
        )
        self._apply(remote, remote.merge.start())

    def _send(self, remote: _Remote, send: Send) -> list[MergeEffect]:
        """One wave's frame to its peer; a peer gone since is the route ending at once."""
        link = cast(PeerLink | None, self.links.get(send.peer))
        if link is None:
            return remote.merge.ended((send.peer, send.wave))
        self.seq += 1
        remote.seqs[self.seq] = link
        self.remotes[self.seq] = (remote, send.wave)
        request = mgmt.SendCommandRequest(
            agent_ids=send.agent_ids,
            command=remote.command,
            timeout_seconds=remote.timeout_seconds,
        )
        self.metrics.forwards.inc()
        self.metrics.forwarded_targets.inc(len(send.agent_ids))
        link.forward(self.seq, request)
        return []

    def _link_ended(self, link: PeerLink, refused: bool) -> None:
        """The link's command stream (or its directory) is over: every command on it has its
        last word from that peer now, and the link is down (the next round dials it again)."""
        if refused:
            self.metrics.refused.inc()
        for remote in {r for r, _ in self.remotes.values() if link in r.seqs.values()}:
            self._apply(remote, remote.merge.peer_ended(link.addr))
        if self.links.get(link.addr) is link and self.membership.lost(link.addr):
            self._link_down(link.addr)

    def _expire(self) -> None:
        """Forwarded commands still owed past their deadline and slack (their router went
        without a ForgetCommand): settled, and their peers told to forget them."""
        now = self.now()
        for remote in {r for r, _ in self.remotes.values() if r.expires <= now}:
            self._drop(remote, forget=True)
            effects = [e for route in remote.merge.routes() for e in remote.merge.ended(route)]
            self._apply(remote, effects)

    def _apply(
        self,
        remote: _Remote,
        effects: list[MergeEffect],
        response: agent_pb2.CommandResponse | None = None,
    ) -> None:
        pending = list(effects)
        while pending:
            match pending.pop(0):
                case Answer(agent_id=agent_id):
                    self.send(remote.reply_to, CommandAnswer(agent_id, cast(Any, response)))
                case Fail(agent_id=agent_id, reason=reason):
                    failed = CommandFailed(agent_id, remote.command_id, cast(FailReason, reason))
                    self.send(remote.reply_to, failed)
                case Send() as send:
                    pending += self._send(remote, send)
        if remote.merge.done:
            self._drop(remote)

    def _drop(self, remote: _Remote, *, forget: bool = False) -> None:
        """`forget`: the command ended here before every peer answered; they drop it too."""
        for seq, link in remote.seqs.items():
            if self.remotes.pop(seq, None) is not None and forget:
                link.forget(seq)
