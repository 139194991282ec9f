"""`log_format` (docs/runbook.md, "Reading the log"): JSON lines from the variable and from the
file, and the crash-redaction canary in the JSON format (the canary of
tests/integration/test_crash_redaction.py, for the router: it holds a command whose parameter is
a marker when it fails).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.router.api import ROUTER_NAME
from gateway.config.keys.node import LOG_FORMAT
from gateway.node.boot import prepare
from gateway.node.logs import JsonFormatter, configure_logging
from tests.integration.test_agent_plane import gateway, run, until
from tests.integration.test_crash_redaction import (
    HELD,
    MARKERS,
    PARAM,
    _fail,
    carries,
    command,
    inject,
)
from tests.integration.test_management_plane import operator
from tests.support.node import ROOT, TEST_CONFIG, node_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@contextlib.contextmanager
def json_capture() -> Iterator[io.StringIO]:
    """Every record at DEBUG, formatted as the node's JSON handler formats it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def parsed(text: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in text.splitlines() if line]


def test_a_router_crash_prints_no_secret_in_json(tmp_path: Path) -> None:
    with json_capture() as out:

        async def body() -> None:
            async with gateway(tmp_path) as (node, _fake), operator(node) as op:
                runtime = node.runtime
                assert runtime is not None
                router = runtime.whereis(ROUTER_NAME)
                assert router is not None
                fired = inject(runtime, router, lambda msg: carries(msg, PARAM))
                call = op.send(command("c1"), ("agent-absent",), 60)
                await until(lambda: bool(fired), "the router to crash")
                await until(lambda: runtime.whereis(ROUTER_NAME) != router, "its restart")
                call.cancel()

        run(body)
    lines = parsed(out.getvalue())  # every line is one JSON object
    assert [m for m in MARKERS if m in out.getvalue()] == []
    crash = [line for line in lines if line["logger"] == "supervisors.crash"]
    assert any("CanaryDefect at test_crash_redaction.py:" in line["message"] for line in crash)
    assert {"time", "level", "logger", "message"} <= set(crash[0])


def test_the_json_formatter_would_print_the_markers_without_redaction() -> None:
    """The control: a record that carries the secrets (its arguments, its traceback) shows them
    in JSON when nothing redacts, so the canary above fails if the filter stops working."""
    try:
        _fail(HELD)
    except Exception:
        record = logging.LogRecord(
            "yuzu_gw.canary", logging.ERROR, __file__, 1, "held %r", (HELD,), sys.exc_info()
        )
    line = json.loads(JsonFormatter().format(record))
    assert PARAM in line["message"]
    assert "CanaryDefect" in line["exc_info"] and PARAM in line["exc_info"]


def test_log_format_from_the_variable_and_from_the_file(tmp_path: Path) -> None:
    config = tmp_path / "json.config"
    config.write_text(
        TEST_CONFIG.read_text().replace("{allow_no_upstream, true}", "{log_format, json}")
    )
    # The key without the upstream acknowledgement: boot is refused, in the variable's format.
    refused = subprocess.run(
        [sys.executable, "-m", "gateway"],
        check=False,
        env=node_env(tmp_path, config, YUZU_GW_LOG_FORMAT="json"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 1
    *_, line = parsed(refused.stderr)  # every line (the override's INFO too) is JSON
    assert line["level"] == "CRITICAL" and line["logger"] == "yuzu_gw.boot"
    assert line["message"].startswith("Refusing to start: ")

    config.write_text(
        TEST_CONFIG.read_text().replace(
            "{allow_no_upstream, true}", "{allow_no_upstream, true}, {log_format, json}"
        )
    )
    ctx = prepare(node_env(tmp_path, config))
    assert ctx.config[LOG_FORMAT] == "json"
    assert prepare(node_env(tmp_path, config, YUZU_GW_LOG_FORMAT="text")).config[LOG_FORMAT] == (
        "text"
    )
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging({}, ctx.config)
        [handler] = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        configure_logging({"YUZU_GW_LOG_FORMAT": "JSON"})
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
        configure_logging({})
        assert not isinstance(root.handlers[0].formatter, JsonFormatter)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
