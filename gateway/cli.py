"""`yuzu-gw` (also `python -m gateway.cli`): the client half of `rel/yuzu_gw`.

    yuzu-gw [--run-dir DIR] [--name NAME] ping | status | stop [--timeout S]
                                          | eval EXPR | remote_console | name
    yuzu-gw completion bash|zsh | --version

Exit statuses (docs/release.md): 0 done; 1 the node is not running or not answering; 2 usage;
3 refused (wrong or missing cookie); 4 the evaluated code raised; 5 `stop` timed out with the
node still running; 6 the node exited without finishing its planned stop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.console.client import Refused, Unreachable, bridge, one_shot, open_session
from gateway.console.paths import RunFiles, alive, read_pid
from gateway.ctl.completion import SHELLS, script
from gateway.node.version import add_version_option

EXIT_OK = 0
EXIT_NOT_RUNNING = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_RAISED = 4
EXIT_STOP_TIMEOUT = 5
EXIT_STOP_UNCLEAN = 6

# A little longer than the systemd unit's TimeoutStopSec=40 (seed: "Stop timeout coupling"),
# so `stop` does not call a stop failed that the unit would still have waited for.
DEFAULT_STOP_TIMEOUT_S = 45.0
STOP_POLL_S = 0.1


class CookieError(Exception):
    pass


def read_cookie(env: Mapping[str, str], files: RunFiles) -> str:
    """YUZU_GW_COOKIE, else the cookie file `rel/yuzu_gw` generated beside the pid file."""
    cookie = env.get("YUZU_GW_COOKIE")
    if cookie:
        return cookie
    path = files.cookie
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise CookieError(f"no cookie: set YUZU_GW_COOKIE or create {path}") from None
    # Erlang's rule for ~/.erlang.cookie: a cookie others can read authenticates nobody.
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CookieError(f"{path} must be readable by its owner only (chmod 600)")
    cookie = path.read_text().strip()
    if not cookie:
        raise CookieError(f"{path} is empty")
    return cookie


def _looks_like_node(pid: int) -> bool:
    """Guard against a reused pid: never SIGTERM a process that is not a gateway."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc (not Linux): trust the pid file
    return b"gateway" in cmdline


def _err(text: str) -> None:
    print(text, file=sys.stderr)


# -- commands ----------------------------------------------------------------------------


def cmd_ping(files: RunFiles, cookie: str) -> int:
    try:
        asyncio.run(one_shot(files.console, cookie, "ping"))
    except Unreachable as exc:
        _err(f"node {files.short_name} not responding: {exc}")
        return EXIT_NOT_RUNNING
    except Refused as exc:
        _err(f"node {files.short_name} refused: {exc}")
        return EXIT_REFUSED
    print("pong")
    return EXIT_OK


def cmd_eval(files: RunFiles, cookie: str, source: str) -> int:
    try:
        reply = asyncio.run(one_shot(files.console, cookie, "eval", source))
    except Unreachable as exc:
        _err(f"node {files.short_name} not responding: {exc}")
        return EXIT_NOT_RUNNING
    except Refused as exc:
        _err(f"node {files.short_name} refused: {exc}")
        return EXIT_REFUSED
    sys.stdout.write(str(reply.get("output", "")))
    if "raised" in reply:
        sys.stderr.write(str(reply["raised"]))
        return EXIT_RAISED
    print(reply.get("result", ""))
    return EXIT_OK


async def _console(files: RunFiles, cookie: str) -> None:
    reader, writer, _ = await open_session(files.console, cookie, "console")
    await bridge(reader, writer)


def cmd_remote_console(files: RunFiles, cookie: str) -> int:
    try:
        asyncio.run(_console(files, cookie))
    except Unreachable as exc:
        _err(f"node {files.short_name} not responding: {exc}")
        return EXIT_NOT_RUNNING
    except Refused as exc:
        _err(f"node {files.short_name} refused: {exc}")
        return EXIT_REFUSED
    except KeyboardInterrupt:
        # Ctrl-C leaves the console; the node (and anything the session ran) is unaffected
        # beyond the session being closed.
        _err("\ndetached")
    return EXIT_OK


def cmd_status(files: RunFiles, env: Mapping[str, str]) -> int:
    pid = read_pid(files.pid)
    if pid is None:
        print(f"node {files.short_name} is not running (no pid file {files.pid})")
        return EXIT_NOT_RUNNING
    if not alive(pid):
        print(f"node {files.short_name} is not running (stale pid file {files.pid}, pid {pid})")
        return EXIT_NOT_RUNNING
    try:
        reply = asyncio.run(one_shot(files.console, read_cookie(env, files), "ping"))
    except (Unreachable, CookieError) as exc:
        print(f"node {files.short_name}: pid {pid} is alive but the console does not answer: {exc}")
        return EXIT_NOT_RUNNING
    except Refused as exc:
        print(f"node {files.short_name} is running (pid {pid}); console refused: {exc}")
        return EXIT_OK
    print(
        f"node {reply.get('node', files.short_name)} is running (pid {pid},"
        f" run dir {files.run_dir})"
    )
    return EXIT_OK


def cmd_stop(files: RunFiles, timeout: float) -> int:
    pid = read_pid(files.pid)
    if pid is None or not alive(pid):
        print(f"node {files.short_name} is not running")
        return EXIT_NOT_RUNNING
    if not _looks_like_node(pid):
        _err(f"pid {pid} in {files.pid} is not a gateway (a reused pid?); not signalled")
        return EXIT_NOT_RUNNING
    # SIGTERM is the planned stop (gateway/__main__.py): prep-stop flush, then the tree.
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            _err(f"node {files.short_name} (pid {pid}) still running after {timeout:g} s")
            return EXIT_STOP_TIMEOUT
        time.sleep(STOP_POLL_S)
    # The node removes its pid file only once the planned stop is done (Node.stop): a file
    # left behind means it died on the way (killed, crashed).
    if files.pid.exists() and read_pid(files.pid) == pid:
        _err(f"node {files.short_name} (pid {pid}) exited without finishing its planned stop")
        return EXIT_STOP_UNCLEAN
    print(f"node {files.short_name} stopped")
    return EXIT_OK


# -- entry -------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="yuzu-gw", description="Control a running Yuzu gateway node."
    )
    top.add_argument("--run-dir", help="the node's run directory (YUZU_GW_RUN_DIR, ./run)")
    top.add_argument("--name", help="the node's short name (YUZU_GW_NODE_NAME, yuzu_gw)")
    add_version_option(top)
    sub = top.add_subparsers(dest="command", required=True)
    sub.add_parser("ping", help="answer pong if the node answers on its console")
    sub.add_parser("status", help="say whether the node runs, its pid and name")
    stop = sub.add_parser("stop", help="planned stop: SIGTERM, wait for the node to exit")
    stop.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to wait (YUZU_GW_STOP_TIMEOUT_S, {DEFAULT_STOP_TIMEOUT_S:g})",
    )
    ev = sub.add_parser("eval", help="evaluate one Python expression inside the node")
    ev.add_argument("expr")
    sub.add_parser("remote_console", help="an interactive console inside the node")
    sub.add_parser("name", help="print the node's short name (what its run files are named)")
    completion = sub.add_parser(
        "completion", help='print a shell completion script: eval "$(yuzu-gw completion bash)"'
    )
    completion.add_argument("shell", choices=SHELLS)
    return top


def run(argv: Sequence[str] | None, env: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)
    if args.command == "completion":
        sys.stdout.write(script(parser(), "yuzu-gw", args.shell))
        return EXIT_OK
    files = RunFiles.from_env(env, args.run_dir, args.name)
    if args.command == "name":
        print(files.short_name)
        return EXIT_OK
    if args.command == "status":
        return cmd_status(files, env)
    if args.command == "stop":
        timeout = args.timeout
        if timeout is None:
            timeout = float(env.get("YUZU_GW_STOP_TIMEOUT_S") or DEFAULT_STOP_TIMEOUT_S)
        return cmd_stop(files, timeout)
    try:
        cookie = read_cookie(env, files)
    except CookieError as exc:
        _err(str(exc))
        return EXIT_REFUSED
    if args.command == "ping":
        return cmd_ping(files, cookie)
    if args.command == "eval":
        return cmd_eval(files, cookie, args.expr)
    return cmd_remote_console(files, cookie)


def main() -> None:
    sys.exit(run(None, os.environ))


if __name__ == "__main__":
    main()
