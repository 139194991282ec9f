"""`python -m gateway.release`: the multi-node half of `rel/yuzu_gw` (docs/multinode.md).

    supervise --nodes N|auto [--logs files|inherit]   run the release supervisor (foreground)
    wait --pid PID [--timeout S]    until every node of the release answers ping (for `start`)
    stop [--timeout S]              the planned stop of every node
    status                          the supervisor and each node
    node K                          print node K's short name (exit 1: no release runs)
    count [N|auto]                  the running release's node count, or parse a --nodes value

The run directory is YUZU_GW_RUN_DIR (./run). Exit statuses follow `yuzu-gw`'s
(docs/release.md): 0 done, 1 not running / did not start, 2 usage, 5 `stop` timed out,
6 a node did not finish its planned stop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway import cli
from gateway.config import default_paths, load
from gateway.config.refusal import BootRefused, log_refusal
from gateway.console.client import Refused, Unreachable, one_shot
from gateway.console.paths import DEFAULT_RUN_DIR, RunFiles, alive, read_pid
from gateway.node.logs import configure_logging
from gateway.node.version import add_version_option
from gateway.release import runfile
from gateway.release.plan import cpu_count, parse_count, pin_advertise, plan
from gateway.release.runfile import ENDED, NodeRecord, ReleaseRecord
from gateway.release.supervisor import EXIT_FAILED, Logs, ReleaseSupervisor

EXIT_USAGE = 2
WAIT_POLL_S = 0.2
# `stop` waits this much longer than the supervisor gives its nodes, so the supervisor's own
# SIGKILL of a straggler is seen as its outcome rather than as a `stop` timeout.
STOP_MARGIN_S = 5.0
LOG_TAIL_LINES = 20


def _err(text: str) -> None:
    print(text, file=sys.stderr)


def _stop_timeout(env: Mapping[str, str], given: float | None) -> float:
    if given is not None:
        return given
    return float(env.get("YUZU_GW_STOP_TIMEOUT_S") or cli.DEFAULT_STOP_TIMEOUT_S)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path})"
    return "\n".join(lines[-LOG_TAIL_LINES:])


# -- supervise ---------------------------------------------------------------------------


def cmd_supervise(run_dir: Path, env: Mapping[str, str], count_text: str, logs: str) -> int:
    configure_logging(env)
    try:
        count = parse_count(count_text, cpu_count())
    except ValueError as exc:
        _err(str(exc))
        return EXIT_USAGE
    if runfile.running(run_dir) is not None:
        _err(f"a release is already running in {run_dir} ({runfile.path(run_dir)})")
        return EXIT_FAILED
    try:
        paths = default_paths(env)
        config, node = load(paths.config, paths.vm_args, env)
        plans = plan(config, node, count)
    except BootRefused as refused:
        log_refusal(refused)
        return EXIT_FAILED
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    supervisor = ReleaseSupervisor(
        plans,
        pin_advertise(env, node),
        run_dir,
        logs=Logs(logs),
        stop_timeout_s=_stop_timeout(env, None),
    )
    return asyncio.run(supervisor.run())


# -- wait --------------------------------------------------------------------------------


def _answers(files: RunFiles, node: NodeRecord, cookie: str) -> bool:
    """Node answers on its console, as the process the supervisor last started."""
    if node.pid is None or read_pid(files.pid) != node.pid:
        return False
    try:
        asyncio.run(one_shot(files.console, cookie, "ping"))
    except (Unreachable, Refused):
        return False
    return True


def _failed_start(
    run_dir: Path, env: Mapping[str, str], pid: int, why: str, nodes: Sequence[NodeRecord]
) -> int:
    _err(why)
    _err(f"the end of {run_dir / runfile.RELEASE_LOG}:\n{_tail(run_dir / runfile.RELEASE_LOG)}")
    for node in nodes:
        log = RunFiles(run_dir, node.short_name).log
        _err(f"the end of {log}:\n{_tail(log)}")
    if alive(pid):
        # The nodes that did start are stopped in order rather than left behind.
        os.kill(pid, signal.SIGTERM)
        _wait_gone(pid, _stop_timeout(env, None) + STOP_MARGIN_S)
    return cli.EXIT_NOT_RUNNING


def cmd_wait(run_dir: Path, env: Mapping[str, str], pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    ready: set[int] = set()
    record: ReleaseRecord | None = None
    while time.monotonic() < deadline:
        if not alive(pid):
            return _failed_start(run_dir, env, pid, "the release supervisor exited", ())
        record = runfile.read(run_dir)
        if record is not None and record.supervisor_pid == pid:
            ended = [node for node in record.nodes if node.state in ENDED]
            if ended:
                names = ", ".join(f"{n.short_name} ({n.state})" for n in ended)
                return _failed_start(run_dir, env, pid, f"node(s) did not start: {names}", ended)
            for node in record.nodes:
                files = RunFiles(run_dir, node.short_name)
                try:
                    cookie = cli.read_cookie(env, files)
                except cli.CookieError as exc:
                    return _failed_start(run_dir, env, pid, str(exc), ())
                if node.index not in ready and _answers(files, node, cookie):
                    ready.add(node.index)
            if len(ready) == len(record.nodes):
                _print_started(run_dir, record)
                return cli.EXIT_OK
        time.sleep(WAIT_POLL_S)
    late = [] if record is None else [n for n in record.nodes if n.index not in ready]
    names = ", ".join(n.short_name for n in late) or "every node"
    why = f"{names} did not answer ping within {timeout:g} s"
    return _failed_start(run_dir, env, pid, why, late)


def _print_started(run_dir: Path, record: ReleaseRecord) -> None:
    print(
        f"{len(record.nodes)} nodes started (supervisor pid {record.supervisor_pid},"
        f" run dir {run_dir}, record {runfile.path(run_dir)})"
    )
    for node in record.nodes:
        print(
            f"  node {node.index}: {node.name} pid {node.pid}, health port {node.health_port},"
            f" metrics port {node.prometheus_port}, cluster port {node.cluster_port},"
            f" log {RunFiles(run_dir, node.short_name).log}"
        )


# -- stop, status, node, count -----------------------------------------------------------


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(cli.STOP_POLL_S)
    return True


def cmd_stop(run_dir: Path, timeout: float) -> int:
    record = runfile.read(run_dir)
    if record is None:
        print(f"no multi-node release is running in {run_dir}")
        return cli.EXIT_NOT_RUNNING
    if runfile.supervisor_alive(record):
        # The supervisor turns SIGTERM into the planned stop of every node.
        os.kill(record.supervisor_pid, signal.SIGTERM)
        if not _wait_gone(record.supervisor_pid, timeout + STOP_MARGIN_S):
            _err(f"the release supervisor (pid {record.supervisor_pid}) still runs")
            return cli.EXIT_STOP_TIMEOUT
    else:
        # The supervisor was killed: stop the nodes it left, each as `yuzu-gw stop` does.
        _err(f"the release supervisor (pid {record.supervisor_pid}) is gone; stopping its nodes")
        for node in record.nodes:
            files = RunFiles(run_dir, node.short_name)
            pid = read_pid(files.pid)
            if pid is not None and alive(pid):
                cli.cmd_stop(files, timeout)
        runfile.remove(run_dir)
    # Each node removes its pid file once its planned stop is done (Node.stop).
    unclean = [n.short_name for n in record.nodes if RunFiles(run_dir, n.short_name).pid.exists()]
    if unclean:
        _err(f"node(s) {', '.join(unclean)} did not finish their planned stop")
        return cli.EXIT_STOP_UNCLEAN
    print(f"{len(record.nodes)} nodes stopped")
    return cli.EXIT_OK


def cmd_status(run_dir: Path, env: Mapping[str, str]) -> int:
    record = runfile.running(run_dir)
    if record is None:
        print(f"no multi-node release is running in {run_dir}")
        return cli.EXIT_NOT_RUNNING
    print(f"release supervisor pid {record.supervisor_pid}, {len(record.nodes)} nodes")
    statuses = []
    for node in record.nodes:
        print(f"node {node.index} ({node.state}, restarts {node.restarts}): ", end="", flush=True)
        statuses.append(cli.cmd_status(RunFiles(run_dir, node.short_name), env))
    return cli.EXIT_OK if not any(statuses) else cli.EXIT_NOT_RUNNING


def cmd_node(run_dir: Path, index: int) -> int:
    record = runfile.running(run_dir)
    if record is None:
        return cli.EXIT_NOT_RUNNING
    if not 1 <= index <= len(record.nodes):
        _err(f"the release runs {len(record.nodes)} nodes: --node takes 1..{len(record.nodes)}")
        return EXIT_USAGE
    print(record.node(index).short_name)
    return cli.EXIT_OK


def cmd_count(run_dir: Path, text: str | None) -> int:
    if text is None:
        record = runfile.running(run_dir)
        if record is None:
            return cli.EXIT_NOT_RUNNING
        print(len(record.nodes))
        return cli.EXIT_OK
    try:
        print(parse_count(text, cpu_count()))
    except ValueError as exc:
        _err(str(exc))
        return EXIT_USAGE
    return cli.EXIT_OK


# -- entry -------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="python -m gateway.release",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_option(top)
    sub = top.add_subparsers(dest="command", required=True)
    supervise = sub.add_parser("supervise", help="run the release supervisor")
    supervise.add_argument("--nodes", default="1", help="a count, or auto (one per core)")
    supervise.add_argument("--logs", choices=("files", "inherit"), default="inherit")
    wait = sub.add_parser("wait", help="until every node answers ping")
    wait.add_argument("--pid", type=int, required=True, help="the supervisor's pid")
    wait.add_argument("--timeout", type=float, default=30.0)
    stop = sub.add_parser("stop", help="the planned stop of every node")
    stop.add_argument("--timeout", type=float, default=None)
    sub.add_parser("status", help="the supervisor and each node")
    node = sub.add_parser("node", help="print node K's short name")
    node.add_argument("index", type=int)
    count = sub.add_parser("count", help="the running node count, or parse a --nodes value")
    count.add_argument("value", nargs="?")
    return top


def run(argv: Sequence[str] | None, env: Mapping[str, str]) -> int:
    args = parser().parse_args(argv)
    run_dir = Path(env.get("YUZU_GW_RUN_DIR") or DEFAULT_RUN_DIR).absolute()
    if args.command == "supervise":
        return cmd_supervise(run_dir, env, args.nodes, args.logs)
    if args.command == "wait":
        return cmd_wait(run_dir, env, args.pid, args.timeout)
    if args.command == "stop":
        return cmd_stop(run_dir, _stop_timeout(env, args.timeout))
    if args.command == "status":
        return cmd_status(run_dir, env)
    if args.command == "node":
        return cmd_node(run_dir, args.index)
    return cmd_count(run_dir, args.value)


def main() -> None:
    sys.exit(run(None, os.environ))


if __name__ == "__main__":
    main()
