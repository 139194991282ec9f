"""BootRefused and its one critical line."""

from __future__ import annotations

import logging

import pytest

from gateway.config.refusal import BOOT_LOGGER, BootRefused, log_refusal, refusing_boot


def test_defect_term_with_and_without_context() -> None:
    assert BootRefused("unknown_keys", "x").term == "unknown_keys"
    refusal = BootRefused("invalid_cluster_id", "x", context=("env",))
    assert refusal.term == "{invalid_cluster_id,env}"
    assert str(refusal) == "{invalid_cluster_id,env}: x"


def test_the_log_line_is_one_critical_line(caplog: pytest.LogCaptureFixture) -> None:
    log_refusal(BootRefused("tls_incomplete", "listener agent:\n  tls lacks keyfile"))
    [record] = caplog.records
    assert (record.name, record.levelno) == (BOOT_LOGGER, logging.CRITICAL)
    assert (
        record.getMessage()
        == "Refusing to start: tls_incomplete: listener agent: tls lacks keyfile"
    )


def test_refusing_boot_logs_and_reraises(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(BootRefused), refusing_boot():
        raise BootRefused("short_cookie", "too short")
    assert len(caplog.records) == 1
    with refusing_boot():
        pass
    assert len(caplog.records) == 1
