"""The crash redaction filter (gateway/node/crash_redaction.py): what it rewrites, what it leaves,
and
that it is what keeps asyncio's reports free of a callback's arguments."""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.node.crash_redaction import WITHHELD, install, uninstall
from protos.yuzu.agent.v1 import agent_pb2
from supervisors.address import Address
from supervisors.reason import ExitReason
from tests.support.actors import Args, Child, Harness, actor_test

MARKER = "canary-3f9c1e-enrolment"
FORMATTER = logging.Formatter()


@pytest.fixture
def redaction() -> Iterator[None]:
    install()
    try:
        yield
    finally:
        uninstall()


def logged(caplog: pytest.LogCaptureFixture, name: str | None = None) -> str:
    """Every captured record as a handler would print it, traceback included."""
    return "\n".join(FORMATTER.format(r) for r in caplog.records if name in (None, r.name))


def raiser_in(module: str) -> Callable[[str], None]:
    """A function whose frames belong to `module`, raising ValueError(text)."""
    namespace: dict[str, Any] = {"__name__": module}
    exec("def fail(text):\n    raise ValueError(text)\n", namespace)
    return namespace["fail"]  # type: ignore[no-any-return]


def caught(module: str) -> BaseException:
    try:
        raiser_in(module)(MARKER)
    except ValueError as exc:
        return exc
    raise AssertionError("not raised")


def request() -> agent_pb2.RegisterRequest:
    return agent_pb2.RegisterRequest(enrollment_token=MARKER, csr_pem=MARKER)


# -- crash and supervisor reports --------------------------------------------------------------


@pytest.mark.usefixtures("redaction")
def test_a_covered_actors_report_keeps_names_and_reasons_only(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    crash = logging.getLogger("supervisors.crash")
    reason = ExitReason("crash", "KeyError", "registry.py:12 in _commit")
    crash.error("actor %s %s crashed: %s", "registry", Address(7), reason)
    # A report that carries more than names (a defect in the report's code) is reduced.
    crash.error("actor %s crashed holding %s", "AgentOwner", request())
    sup = logging.getLogger("supervisors.supervisor")
    sup.error("supervisor %s: child %s (%s) ended: %s", "agent_sup", "agent", "AgentOwner", reason)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "actor registry <0.7.0> crashed: crash: KeyError at registry.py:12 in _commit",
        "actor AgentOwner crashed holding <RegisterRequest>",
        "supervisor agent_sup: child agent (AgentOwner) ended: crash: KeyError at registry.py:12"
        " in _commit",
    ]


@pytest.mark.usefixtures("redaction")
def test_a_report_of_another_actor_passes_unchanged(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    logging.getLogger("supervisors.crash").error("actor %s holding %s", "console", [MARKER])
    assert caplog.records[0].getMessage() == f"actor console holding ['{MARKER}']"


# -- tracebacks -----------------------------------------------------------------------------


@pytest.mark.usefixtures("redaction")
def test_a_traceback_through_a_covered_module_keeps_class_and_top_frame(
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.DEBUG)
    log = logging.getLogger("yuzu_gw.listeners")
    log.error("handler failed for %s", "agent-1", exc_info=caught("actors.registry.actor"))
    # Chained: raised elsewhere while handling a covered module's exception.
    try:
        try:
            raiser_in("actors.router.actor")(MARKER)
        except ValueError:
            raiser_in("gateway.http.server")(MARKER)
    except ValueError:
        log.exception("chained")
    [first, second] = caplog.records
    assert first.getMessage() == (
        "handler failed for agent-1 [ValueError at <string>:2 in fail; traceback redacted]"
    )
    assert first.exc_info is None and first.exc_text is None
    assert second.getMessage().startswith("chained [ValueError at <string>:2 in fail")
    assert MARKER not in logged(caplog)


@pytest.mark.usefixtures("redaction")
def test_a_library_line_loses_its_arguments_too(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    exc = caught("gateway.agent.register")
    logging.getLogger("grpclib.server").error("Application error: %s %d", MARKER, 3, exc_info=exc)
    assert logged(caplog) == (
        "Application error: <str> 3 [ValueError at <string>:2 in fail; traceback redacted]"
    )


@pytest.mark.usefixtures("redaction")
def test_a_traceback_of_other_work_passes_unchanged(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    logging.getLogger("yuzu_gw.http").error("failed", exc_info=caught("gateway.http.server"))
    text = logged(caplog)
    assert "Traceback (most recent call last)" in text and MARKER in text


@actor_test
async def test_a_traceback_logged_inside_a_covered_actor_is_reduced(h: Harness, caplog):
    caplog.set_level(logging.DEBUG)
    install(h.base)
    try:
        registry = h.create(Child, Args("r"), name="registry")
        other = h.create(Child, Args("o"), name="console")
        log = logging.getLogger("yuzu_gw.any")

        def log_failure(actor: Any) -> None:
            log.error("work failed", exc_info=caught("gateway.http.server"))

        await h.call(registry, log_failure)
        await h.call(other, log_failure)
    finally:
        uninstall()
    [inside, outside] = caplog.records
    assert inside.exc_info is None and "traceback redacted" in inside.getMessage()
    assert outside.exc_info is not None  # not a covered actor: untouched


# -- asyncio's reports ------------------------------------------------------------------------


def _fail(holding: object) -> None:
    raise ValueError(f"defect while holding {holding}")


async def _callback_and_task_failures() -> None:
    loop = asyncio.get_running_loop()
    loop.call_soon(functools.partial(_fail, request()))
    task = loop.create_task(asyncio.sleep(0, result=None))
    await task

    async def fails() -> None:
        _fail(request())

    dropped = loop.create_task(fails())
    for _ in range(3):
        await asyncio.sleep(0)
    del dropped
    gc.collect()


def test_asyncio_reports_are_cut_to_their_head(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    uninstall()  # a node started earlier in this process installed it
    # Without the filter, asyncio prints the callback's arguments and the exception's text...
    asyncio.run(_callback_and_task_failures())
    assert MARKER in logged(caplog, "asyncio")
    caplog.clear()
    # ...with it, the head, the class and the top frame only.
    install()
    try:
        asyncio.run(_callback_and_task_failures())
    finally:
        uninstall()
    lines = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    frame = "test_crash_redaction.py"
    assert any(
        line.startswith("Exception in callback [ValueError at " + frame) for line in lines
    ), lines
    assert any(
        line.startswith("Task exception was never retrieved [ValueError at " + frame)
        for line in lines
    ), lines
    assert MARKER not in logged(caplog)


# -- failure and installation ------------------------------------------------------------------


@pytest.mark.usefixtures("redaction")
def test_a_record_the_filter_cannot_handle_is_withheld(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    exc = caught("actors.router.actor")
    logging.getLogger("supervisors.crash").error("%d crashed", "router", exc_info=exc)
    [record] = caplog.records
    assert (record.getMessage(), record.exc_info) == (WITHHELD, None)


def test_installed_once_per_process_and_released_by_its_node():
    uninstall()
    before = logging.getLogRecordFactory()
    first_runtime: Any = object()
    redaction = install(first_runtime)
    factory = logging.getLogRecordFactory()
    try:
        # A second node reuses it: one factory, pointed at the newest runtime.
        second_runtime: Any = object()
        assert install(second_runtime) is redaction and logging.getLogRecordFactory() is factory
        redaction.release(first_runtime)  # a node that is not the current one: nothing
        assert redaction.runtime is second_runtime
        redaction.release(second_runtime)  # the stopped node lets go; the filter stays
        assert redaction.runtime is None and logging.getLogRecordFactory() is factory
    finally:
        uninstall()
    assert logging.getLogRecordFactory() is before


def test_uninstall_leaves_a_factory_set_on_top_in_place():
    uninstall()
    before = logging.getLogRecordFactory()
    install()
    ours = logging.getLogRecordFactory()

    def stacked(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return ours(*args, **kwargs)

    logging.setLogRecordFactory(stacked)
    try:
        uninstall()
        assert logging.getLogRecordFactory() is stacked
    finally:
        logging.setLogRecordFactory(ours)
        uninstall()
    assert logging.getLogRecordFactory() is before
