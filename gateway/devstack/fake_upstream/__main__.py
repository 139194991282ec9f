"""The fake Yuzu server standalone, for a dev stack: `python -m gateway.devstack.fake_upstream`."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from gateway.devstack.fake_upstream.records import METHODS, Call, ServerTls
from gateway.devstack.fake_upstream.server import FakeUpstream
from gateway.devstack.pki import ensure_pki
from gateway.node.version import add_version_option


def _parse_latency(items: list[str]) -> dict[str, float]:
    latency: dict[str, float] = {}
    for item in items:
        method, sep, ms = item.partition("=")
        if not sep or (method != "*" and method not in METHODS):
            raise argparse.ArgumentTypeError(f"--latency-ms {item!r}: want METHOD=MS or *=MS")
        try:
            latency[method] = float(ms) / 1000.0
        except ValueError:
            raise argparse.ArgumentTypeError(f"--latency-ms {item!r}: MS is not a number") from None
    return latency


async def _main(args: argparse.Namespace) -> None:
    tls: ServerTls | None = None
    if args.tls_dir:
        tls = ensure_pki(Path(args.tls_dir))

    def log(call: Call) -> None:
        print(f"{call.method} from {call.peer}", file=sys.stderr, flush=True)

    fake = FakeUpstream(
        tls=tls,
        max_concurrent_streams=args.max_streams,
        on_call=log if args.verbose else None,
    )
    for method, seconds in _parse_latency(args.latency_ms).items():
        fake.set_latency(seconds, *(() if method == "*" else (method,)))
    port = await fake.start(args.host, args.port)
    where = f"{args.host}:{port}"
    mode = f"tls (certificates in {Path(args.tls_dir).resolve()})" if tls else "plaintext"
    print(f"fake upstream listening on {where} ({mode})", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        await fake.stop()
    print("fake upstream stopped", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.devstack.fake_upstream",
        description="A fake Yuzu server (GatewayUpstream) on grpcio, for a dev stack.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50055)
    parser.add_argument(
        "--latency-ms",
        action="append",
        default=[],
        metavar="METHOD=MS",
        help="delay answers of METHOD (or * for all) by MS milliseconds; repeatable",
    )
    parser.add_argument(
        "--tls-dir",
        help="serve TLS requiring client certificates; the CA and leaves are read "
        "from DIR (ca.pem, server.pem/.key, gateway.pem/.key: the dev stack's), or created "
        "there when absent",
    )
    parser.add_argument("--max-streams", type=int, help="SETTINGS_MAX_CONCURRENT_STREAMS")
    parser.add_argument("--verbose", action="store_true", help="log every call to stderr")
    add_version_option(parser)
    args = parser.parse_args(argv)
    try:
        _parse_latency(args.latency_ms)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    _run_loop(_main(args))


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop  # noqa: PLC0415  (optional: a cheaper loop where it installs)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(main)
        return
    uvloop.run(main)


if __name__ == "__main__":
    main()
