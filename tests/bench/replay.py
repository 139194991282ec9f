"""Benchmark of a full registration replay: `python -m tests.bench.replay [--sessions N] [--json]`.

Workload (issue 5, section 5 (b); seed: "Convergence window after a server-only restart", "Load
and convergence bounds"): a gateway node holding N sessions (default 5,000) replays every one of
them to the fake server, which answers ProxyRegister in 50 ms and NotifyStreamStatus at once,
with 24 replay permits.

- The fake server runs in a SUBPROCESS (`python -m gateway.devstack.fake_upstream --latency-ms
  ProxyRegister=50`, as tests/bench/permits.py starts it), so the gateway's loop does not share
  its time with the server's.
- The gateway is a real node in this process (`gateway.node.node.Node`, the test configuration with
  its upstream channel pointed at the fake server): the registry, `agent_sup`, the owners, the
  `upstream` actor with its replay lane, the regulator and the real grpclib channel.
- The held sessions are made without agent connections, through the same steps the Register
  and Subscribe handlers take: the registry's `Reserve`, `Commit` (with the RegisterRequest, as
  the Register handler stores it) and `TakePending`, then `start_child(agent_sup, OwnerArgs)`
  with a `StreamHandle` that no socket drains (nothing is written to it during a replay). Each
  owner registers its session with the registry, writes its owner-table row with the stored
  request and announces CONNECTED, exactly as for a connected agent; only the socket is
  missing, and the replay never touches it.
- The replay is started the way a server that lost its state starts it: a heartbeat verdict
  marked truncated (`HeartbeatVerdict((), 1, truncated=True)`), cast to the `upstream` actor as
  the heartbeat buffer casts it. The start jitter (up to 1 s) passes before the first call.

Measured on the gateway side, around the channel's `unary`: from the first ProxyRegister call
(so the start jitter is excluded) to the last ProxyRegister answer. The bound is N / 24 x 50 ms
(5,000 / 24 x 50 ms = 10.4 s); the target is within 1.05 x the bound (the Erlang gateway
measured 10.7 s). Also reported: replays counted (`yuzu_gw_registration_replay_total`), failed
calls, the most ProxyRegisters in flight, the CONNECTED notices re-sent, CPU of both processes.

Then, in the same run, the bare reference (`bare_replay`): the same 5,000 ProxyRegister calls (the
stored request, the session id in the metadata) at most 24 at once, each followed by its
CONNECTED NotifyStreamStatus at most 9 at once (the notification drain keeps one of its 10 slots
free while a replay runs), from plain coroutines through the same channel and its connection,
no actors, no breaker, no permits; measured the same way. `ratio_vs_bare` is the replay's
elapsed over the bare one's: what the gateway's replay path costs above the transport, on this
host, at this moment; the CPU of both is reported beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

from actors.agents.api import AGENT_SUP_NAME, OWNERS_TABLE, OwnerArgs, OwnerRow, StreamHandle
from actors.core.notify_store import MAX_INFLIGHT
from actors.core.verdicts import HeartbeatVerdict
from actors.registry.api import (
    AGENTS_TABLE,
    REGISTRY_NAME,
    Commit,
    Committed,
    Reserve,
    Reserved,
    Taken,
    TakePending,
)
from actors.upstream.api import (
    NOTIFY_STREAM_STATUS,
    PROXY_REGISTER,
    SESSION_ID_METADATA,
    Channel,
    UpstreamCallError,
    upstream_channel,
)
from actors.upstream.api import UPSTREAM_NAME as UPSTREAM
from actors.upstream.notify import WIRE_CAPABILITIES
from gateway.config.keys.cluster import CLUSTER_ID
from gateway.config.keys.upstream import UPSTREAM_RPC_TIMEOUT_MS
from gateway.node.boot import prepare
from gateway.node.node import Node
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.gateway.v1 import gateway_pb2
from supervisors.api import start_child
from supervisors.gc_policy import NODE_GC_THRESHOLD
from supervisors.runtime import LoopSystemBase
from tests.bench.common import (
    Row,
    add_common_arguments,
    environment,
    process_cpu_s,
    report,
    run_on_uvloop,
)
from tests.bench.permits import fake_server
from tests.support.node import TEST_CONFIG, node_env

NAME = "replay"

DEFAULT_SESSIONS = 5000
DEFAULT_LATENCY_MS = 50.0
REPLAY_PERMITS = 24  # upstream_replay_concurrency's default: half of the 48 register permits
TARGET_RATIO = 1.05
CONNECT_TIMEOUT_S = 10.0
HOLD_BATCH = 250  # owners started at once while the sessions are made
REGISTER_BYTES = 2048  # about a real agent's RegisterRequest
# The notification drain keeps one of its 10 slots free while a replay runs (NS-23), so the
# replay's CONNECTED notices go at most 9 at once; the bare reference keeps the same bound.
BARE_NOTIFY_SLOTS = MAX_INFLIGHT - 1
_CONNECTED = gateway_pb2.StreamStatusNotification.CONNECTED


class Probe:
    """Wraps the channel's `unary`: the first ProxyRegister call, the last answer, in flight."""

    def __init__(self) -> None:
        self.first_call: float | None = None
        self.last_answer: float | None = None
        self.registers = 0
        self.failed = 0
        self.notifies = 0
        self.in_flight = 0
        self.peak = 0

    @property
    def elapsed(self) -> float:
        """From the first ProxyRegister call to the last answer."""
        assert self.first_call is not None and self.last_answer is not None
        return self.last_answer - self.first_call

    def wrap(self, unary: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Any]:
        async def measured(method: str, *args: Any, **kwargs: Any) -> Any:
            if method == NOTIFY_STREAM_STATUS and args[0].event == _CONNECTED:
                self.notifies += 1
            if method != PROXY_REGISTER:
                return await unary(method, *args, **kwargs)
            now = time.perf_counter()
            if self.first_call is None:
                self.first_call = now
            self.registers += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                return await unary(method, *args, **kwargs)
            except Exception:
                self.failed += 1
                raise
            finally:
                self.in_flight -= 1
                self.last_answer = time.perf_counter()

        return measured


@contextlib.asynccontextmanager
async def gateway(workdir: Path, fake_port: int) -> AsyncIterator[Node]:
    """A node from the test configuration whose default_channel dials the fake server."""
    config = workdir / "replay.config"
    upstream = (
        "{upstream_client, #{channels => [{default_channel,"
        f' [{{http, "127.0.0.1", {fake_port}, []}}], #{{}}}}]}}}},'
        f" {{upstream_replay_concurrency, {REPLAY_PERMITS}}}"
    )
    config.write_text(TEST_CONFIG.read_text().replace("{allow_no_upstream, true}", upstream))
    node = Node(prepare(node_env(workdir, YUZU_GW_CONFIG=str(config))))
    await node.start()
    try:
        runtime = node.runtime
        assert runtime is not None
        channel = upstream_channel(runtime)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while channel is None or channel.live_connections() == 0:  # type: ignore[attr-defined]
            if time.monotonic() > deadline:
                raise RuntimeError("no connection to the fake server")
            await asyncio.sleep(0.01)
            channel = upstream_channel(runtime)
        yield node
    finally:
        await node.stop()


def register_request(i: int) -> agent_pb2.RegisterRequest:
    request = agent_pb2.RegisterRequest(enrollment_token="t" * 64)
    request.info.agent_id = f"bench-agent-{i:05d}"
    request.info.hostname = f"host-{i:05d}"
    request.info.agent_version = "0.15.0"
    for p in range(8):
        request.info.plugins.add(name=f"plugin-{p}", version="1.0.0")
    request.info.scopable_tags["pad"] = "x" * max(0, REGISTER_BYTES - request.ByteSize())
    return request


async def hold(runtime: LoopSystemBase, i: int) -> None:
    """One held session, made as the Register and Subscribe handlers make it (no socket)."""
    registry = runtime.whereis(REGISTRY_NAME)
    agent_sup = runtime.whereis(AGENT_SUP_NAME)
    assert registry is not None and agent_sup is not None
    request = register_request(i)
    agent_id, session_id, conn = request.info.agent_id, f"gw-session-{i:032x}", ("bench", i)
    plugins = tuple(p.name for p in request.info.plugins)
    rid = ("bench-replay", i)
    assert isinstance(await runtime.ask(registry, Reserve(rid, conn, agent_id), 10.0), Reserved)
    committed = await runtime.ask(
        registry, Commit(rid, session_id, "10.1.0.1", plugins, request), 10.0
    )
    assert committed == Committed(session_id)
    assert isinstance(await runtime.ask(registry, TakePending(session_id, conn), 10.0), Taken)
    args = OwnerArgs(session_id, agent_id, conn, "10.1.0.1", request, StreamHandle(), plugins)
    await start_child(runtime, agent_sup, args)


async def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, poll_s: float = 0.02
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(poll_s)


async def notices_drained(runtime: LoopSystemBase, what: str, poll_s: float = 0.02) -> None:
    """Until no stream-status notification is held or in flight (at most 60 s)."""

    def drained() -> bool:
        status = upstream_status(runtime)
        return status["notify_pending"] == 0 and status["notify_inflight"] == 0

    await wait_for(drained, 60.0, what, poll_s)


async def bare_replay(
    channel: Channel, rows: Sequence[OwnerRow], notice: Callable[[OwnerRow], Any], timeout: float
) -> int:
    """The replay's calls without the gateway around them: for each row its stored request as
    ProxyRegister with the session id, at most REPLAY_PERMITS at once, then, once that is
    answered, its CONNECTED (`notice(row)`), at most BARE_NOTIFY_SLOTS at once, the lane going
    on to its next row meanwhile, as a replay frees its permit on the answer and hands the
    notice to the notification lane. Returns the
    calls that did not succeed: ProxyRegisters failed or answered accepted=false, and
    notifications failed or not acknowledged (0 expected)."""
    loop = asyncio.get_running_loop()
    notify_slots = asyncio.Semaphore(BARE_NOTIFY_SLOTS)
    notices: set[asyncio.Task[None]] = set()
    unsuccessful = 0

    async def notify(row: OwnerRow) -> None:
        nonlocal unsuccessful
        async with notify_slots:
            try:
                ack = await channel.unary(
                    NOTIFY_STREAM_STATUS, notice(row), gateway_pb2.StreamStatusAck, timeout=timeout
                )
            except UpstreamCallError:
                unsuccessful += 1
            else:
                unsuccessful += not ack.acknowledged

    async def lane(pending: Iterator[OwnerRow]) -> None:
        nonlocal unsuccessful
        for row in pending:  # one iterator shared by the lanes: each row is taken once
            assert row.register is not None
            try:
                answer = await channel.unary(
                    PROXY_REGISTER,
                    row.register,
                    agent_pb2.RegisterResponse,
                    timeout=timeout,
                    metadata={SESSION_ID_METADATA: row.session_id},
                )
            except UpstreamCallError:
                unsuccessful += 1
                continue  # a failed replay announces nothing
            if not answer.accepted:
                unsuccessful += 1
                continue
            task = loop.create_task(notify(row))
            notices.add(task)
            task.add_done_callback(notices.discard)

    shared = iter(rows)
    await asyncio.gather(*(lane(shared) for _ in range(REPLAY_PERMITS)))
    await asyncio.gather(*notices)
    return unsuccessful


def upstream_status(runtime: LoopSystemBase) -> dict[str, Any]:
    address = runtime.whereis(UPSTREAM)
    ref = None if address is None else runtime.ref(address)
    assert ref is not None
    return dict(ref.instance.format_status())  # type: ignore[attr-defined]


async def run_benchmark(
    sessions: int = DEFAULT_SESSIONS,
    latency_ms: float = DEFAULT_LATENCY_MS,
    *,
    quiet: bool = False,
) -> dict[str, Any]:
    def progress(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    bound_s = sessions / REPLAY_PERMITS * latency_ms / 1000.0
    with tempfile.TemporaryDirectory(prefix="yuzu-bench-replay-") as tmp:
        async with fake_server(latency_ms) as (port, server_pid), gateway(Path(tmp), port) as node:
            runtime = node.runtime
            assert runtime is not None
            progress(f"holding {sessions} sessions")
            for start in range(0, sessions, HOLD_BATCH):
                batch = range(start, min(start + HOLD_BATCH, sessions))
                await asyncio.gather(*(hold(runtime, i) for i in batch))
            owners = runtime.table(OWNERS_TABLE)
            assert owners is not None
            await wait_for(lambda: len(owners) == sessions, 60.0, "every owner's row")
            await notices_drained(runtime, "the first CONNECTED notices")
            channel = upstream_channel(runtime)
            assert channel is not None
            unary = channel.unary
            probe = Probe()
            channel.unary = probe.wrap(unary)  # type: ignore[method-assign]
            registry = node.ctx.registry
            replays_before = registry.get_sample_value("yuzu_gw_registration_replay_total") or 0
            gc.collect()
            progress("full replay: a truncated verdict, as from a server that lost its state")
            cpu, server_cpu = time.process_time(), process_cpu_s(server_pid)
            upstream = runtime.whereis(UPSTREAM)
            assert upstream is not None
            runtime.tell(upstream, HeartbeatVerdict((), 1, truncated=True))
            limit = 10 * bound_s + 30.0
            await wait_for(lambda: probe.registers >= sessions, limit, "every replay sent")
            await wait_for(
                lambda: (
                    upstream_status(runtime)["replay_full"] == "idle"
                    and upstream_status(runtime)["replay_inflight"] == 0
                ),
                limit,
                "the replay's end",
            )
            cpu = time.process_time() - cpu
            server_cpu = process_cpu_s(server_pid) - server_cpu
            await wait_for(
                lambda: (
                    upstream_status(runtime)["notify_pending"] == 0
                    and upstream_status(runtime)["notify_inflight"] == 0
                ),
                30.0,
                "the CONNECTED notices sent again",
            )
            replays = (
                registry.get_sample_value("yuzu_gw_registration_replay_total") or 0
            ) - replays_before
            status = upstream_status(runtime)
            connected_resent = probe.notifies  # before the stop's DISCONNECTEDs
            progress(f"bare reference: the same {sessions} calls, no actors")
            rows = [row for row in owners.values() if isinstance(row, OwnerRow)]
            agents = runtime.table(AGENTS_TABLE)
            assert agents is not None
            gateway_node, cluster_id = node.ctx.node.name, node.ctx.config[CLUSTER_ID]

            def notice(row: OwnerRow) -> gateway_pb2.StreamStatusNotification:
                # The fields the notification lane sends (actors/upstream/notify.py).
                return gateway_pb2.StreamStatusNotification(
                    agent_id=row.agent_id,
                    session_id=row.session_id,
                    event=_CONNECTED,
                    peer_addr=agents.get(row.session_id).peer,
                    gateway_node=gateway_node,
                    wire_capabilities=WIRE_CAPABILITIES,
                    cluster_id=cluster_id,
                    stream_home_id=row.stream_home_id,
                )

            bare = Probe()
            channel.unary = bare.wrap(unary)  # type: ignore[method-assign]
            timeout = node.ctx.config[UPSTREAM_RPC_TIMEOUT_MS] / 1000.0
            gc.collect()
            bare_cpu, bare_server_cpu = time.process_time(), process_cpu_s(server_pid)
            bare_unsuccessful = await bare_replay(channel, rows, notice, timeout)
            bare_cpu = time.process_time() - bare_cpu
            bare_server_cpu = process_cpu_s(server_pid) - bare_server_cpu
            channel.unary = unary  # type: ignore[method-assign]
    elapsed = probe.elapsed
    adopted = int(status["replay_adopted"])
    result: dict[str, Any] = {
        "benchmark": NAME,
        "sessions": sessions,
        "replay_permits": REPLAY_PERMITS,
        "latency_ms": latency_ms,
        "bound_s": round(bound_s, 4),
        "elapsed_s": round(elapsed, 4),
        "ratio_to_bound": round(elapsed / bound_s, 3),
        "replayed": adopted,
        "replay_total": int(replays),
        "proxy_register_calls": probe.registers,
        "failed": probe.failed + int(status["replay_failed"]),
        "peak_in_flight": probe.peak,
        "connected_resent": connected_resent,
        "gateway_cpu_s": round(cpu, 3),
        "server_cpu_s": round(server_cpu, 3),
        # The same per replayed session: what to compare between runs on a shared host, where
        # elapsed moves with the load and CPU time much less.
        "gateway_cpu_ms_per_session": round(cpu / sessions * 1000, 3),
        "bare_elapsed_s": round(bare.elapsed, 4),
        "bare_ratio_to_bound": round(bare.elapsed / bound_s, 3),
        "ratio_vs_bare": round(elapsed / bare.elapsed, 3),
        "bare_proxy_register_calls": bare.registers,
        "bare_connected_sent": bare.notifies,
        "bare_unsuccessful": bare_unsuccessful,
        "bare_peak_in_flight": bare.peak,
        "bare_gateway_cpu_s": round(bare_cpu, 3),
        "bare_server_cpu_s": round(bare_server_cpu, 3),
        "bare_cpu_ms_per_session": round(bare_cpu / sessions * 1000, 3),
        "load_average_1m": os.getloadavg()[0],
        "targets_met": {
            "replayed_all": adopted == sessions,
            "peak_in_flight": probe.peak <= REPLAY_PERMITS,
            "elapsed_within_1_05x_bound": elapsed <= TARGET_RATIO * bound_s,
        },
        "environment": environment(),
        "loop": type(asyncio.get_running_loop()).__module__,
    }
    return result


def table_rows(result: dict[str, Any]) -> list[Row]:
    met = result["targets_met"]
    n = result["sessions"]
    return [
        Row("held sessions", str(n)),
        Row("replay permits", str(result["replay_permits"])),
        Row("server ProxyRegister latency", f"{result['latency_ms']:g} ms"),
        Row("bound (N / permits x latency)", f"{result['bound_s']:.3f} s"),
        Row(
            "first replay call to last answer",
            f"{result['elapsed_s']:.3f} s ({result['ratio_to_bound']:.3f} x bound)",
            f"<= {TARGET_RATIO * result['bound_s']:.3f} s",
            met["elapsed_within_1_05x_bound"],
        ),
        Row("replayed (adopted)", str(result["replayed"]), str(n), met["replayed_all"]),
        Row("yuzu_gw_registration_replay_total", str(result["replay_total"])),
        Row("failed", str(result["failed"])),
        Row(
            "peak ProxyRegister in flight",
            str(result["peak_in_flight"]),
            f"<= {result['replay_permits']}",
            met["peak_in_flight"],
        ),
        Row("CONNECTED notices re-sent", str(result["connected_resent"])),
        Row(
            "gateway / server CPU during the replay",
            f"{result['gateway_cpu_s']:.2f} / {result['server_cpu_s']:.2f} s"
            f" ({result['gateway_cpu_ms_per_session']:.3f} ms per session)",
        ),
        Row(
            "bare reference: the same calls, no actors",
            f"{result['bare_elapsed_s']:.3f} s ({result['bare_ratio_to_bound']:.3f} x bound)",
        ),
        Row("replay / bare", f"{result['ratio_vs_bare']:.3f}"),
        Row(
            "bare: ProxyRegister / CONNECTED / unsuccessful",
            f"{result['bare_proxy_register_calls']} / {result['bare_connected_sent']}"
            f" / {result['bare_unsuccessful']}",
        ),
        Row(
            "gateway / server CPU during the bare calls",
            f"{result['bare_gateway_cpu_s']:.2f} / {result['bare_server_cpu_s']:.2f} s"
            f" ({result['bare_cpu_ms_per_session']:.3f} ms per session)",
        ),
        Row("host load average (1 min)", f"{result['load_average_1m']:.2f}"),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.replay",
        description="A full registration replay of N held sessions to the fake server, against "
        "the bound N / 24 x latency.",
    )
    parser.add_argument("--sessions", type=int, default=DEFAULT_SESSIONS, help="default 5000")
    parser.add_argument(
        "--latency-ms", type=float, default=DEFAULT_LATENCY_MS, help="ProxyRegister latency (50)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_common_arguments(parser, NAME)
    args = parser.parse_args(argv)
    previous = gc.get_threshold()
    gc.set_threshold(*NODE_GC_THRESHOLD)
    try:
        result = run_on_uvloop(run_benchmark(args.sessions, args.latency_ms, quiet=args.quiet))
    finally:
        gc.set_threshold(*previous)
    report(result, table_rows(result), args.out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
