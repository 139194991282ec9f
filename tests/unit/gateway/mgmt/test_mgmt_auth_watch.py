"""The certificate watcher: its core (gateway/mgmt/auth/watch.py) fed bytes by hand, a state
machine against a model of last known good, and the actor (watcher.py) on a real file."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from prometheus_client import CollectorRegistry

from actors.core import LogLine
from gateway.config.certs import spki_sha256
from gateway.config.mgmt_auth_settings import FilePin, SpkiPin
from gateway.mgmt.auth import watch as watch_module
from gateway.mgmt.auth.gate import PinBoard
from gateway.mgmt.auth.metrics import mgmt_auth_metrics
from gateway.mgmt.auth.watch import (
    PIN_ROLE,
    CertWatch,
    Effect,
    PinRotated,
    PinsUnresolved,
    PublishPins,
    ReadFailed,
    SetGauges,
    WatchedFile,
)
from gateway.mgmt.auth.watcher import PinWatcher, WatcherArgs
from tests.support.actors import Harness, actor_test
from tests.support.certs import CertAuthority, Leaf, new_key

PIN_PATH = "/etc/yuzu/certs/default-server.pem"
CA = CertAuthority()
KEYS = [new_key() for _ in range(3)]
# Two certificates over each key: a re-issue over the same key is not a rotation.
LEAVES = [[CA.issue("yuzu-server", key=key) for _ in range(2)] for key in KEYS]
MISSING = ReadFailed("No such file or directory")


def key_of(leaf: Leaf) -> bytes:
    return spki_sha256(leaf.cert)


def published(effects: list[Effect]) -> frozenset[bytes]:
    [publish] = [e for e in effects if isinstance(e, PublishPins)]
    return publish.pins


def gauges(effects: list[Effect]) -> dict[tuple[str, str], SetGauges]:
    return {(e.role, e.name): e for e in effects if isinstance(e, SetGauges)}


def logs(effects: list[Effect], level: str) -> list[str]:
    return [e.text for e in effects if isinstance(e, LogLine) and e.level == level]


def rotations(effects: list[Effect]) -> list[float]:
    return [e.at for e in effects if isinstance(e, PinRotated)]


def unresolved(effects: list[Effect]) -> int:
    return sum(e.n for e in effects if isinstance(e, PinsUnresolved))


def pin_watch() -> CertWatch:
    return CertWatch((FilePin(PIN_PATH),))


# -- the core by hand -----------------------------------------------------------------------------


def test_a_pin_file_pins_its_first_key_and_reports_its_expiry() -> None:
    watch = pin_watch()
    first, other = LEAVES[0][0], LEAVES[1][0]
    effects = watch.observe({PIN_PATH: first.cert_pem + other.cert_pem}, wall=100.0)
    assert published(effects) == {key_of(first)}
    series = gauges(effects)[(PIN_ROLE, PIN_PATH)]
    assert series.readable
    expected = min(first.cert.not_valid_after_utc, other.cert.not_valid_after_utc).timestamp()
    assert series.expiry == expected
    # Reading the file at start is not a rotation, and a quiet start logs nothing.
    assert rotations(effects) == [] and logs(effects, "warning") == logs(effects, "info") == []


def test_a_file_is_parsed_again_only_when_its_bytes_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []
    real = watch_module.certificates

    def counting(data: bytes) -> Any:
        calls.append(data)
        return real(data)

    monkeypatch.setattr(watch_module, "certificates", counting)
    watch = pin_watch()
    old = LEAVES[0][0]
    # An ECDSA signature's DER length varies by a byte or two: issue over the second key until a
    # certificate has exactly the first one's size, so size alone cannot tell them apart.
    new = next(
        leaf
        for leaf in (CA.issue("yuzu-server", key=KEYS[1]) for _ in range(100))
        if len(leaf.cert_pem) == len(old.cert_pem)
    )
    for wall in (1.0, 2.0, 3.0):
        watch.observe({PIN_PATH: old.cert_pem}, wall)
    assert len(calls) == 1
    # Same size (same key type), new key: picked up, whatever the size and time say.
    assert len(new.cert_pem) == len(old.cert_pem)
    effects = watch.observe({PIN_PATH: new.cert_pem}, wall=4.0)
    assert len(calls) == 2
    assert published(effects) == {key_of(new)}
    assert rotations(effects) == [4.0]
    assert logs(effects, "info") == [
        f"management pin file {PIN_PATH}: a new key is pinned; the previous one is refused from"
        " now on"
    ]


def test_a_same_key_reissue_is_not_a_rotation() -> None:
    watch = pin_watch()
    watch.observe({PIN_PATH: LEAVES[0][0].cert_pem}, 1.0)
    effects = watch.observe({PIN_PATH: LEAVES[0][1].cert_pem}, 2.0)
    assert published(effects) == {key_of(LEAVES[0][0])} and rotations(effects) == []


@pytest.mark.parametrize(
    "failure",
    [MISSING, b"", LEAVES[1][0].cert_pem[:200]],  # deleted, emptied, caught half-written
    ids=["deleted", "emptied", "half-written"],
)
def test_a_failed_read_keeps_the_last_known_good_key(failure: bytes | ReadFailed) -> None:
    watch = pin_watch()
    good = LEAVES[0][0]
    first = watch.observe({PIN_PATH: good.cert_pem}, 1.0)
    expiry = gauges(first)[(PIN_ROLE, PIN_PATH)].expiry
    effects = watch.observe({PIN_PATH: failure}, 2.0)
    assert published(effects) == {key_of(good)}
    series = gauges(effects)[(PIN_ROLE, PIN_PATH)]
    assert not series.readable and series.expiry == expiry  # the expiry keeps alerting
    [warning] = logs(effects, "warning")
    assert "stays pinned and is still admitted" in warning
    assert unresolved(effects) == 0  # it resolved once: last known good, not unresolved
    # Said once while it lasts; said again when it is fixed.
    assert logs(watch.observe({PIN_PATH: failure}, 3.0), "warning") == []
    back = watch.observe({PIN_PATH: good.cert_pem}, 4.0)
    assert logs(back, "info") == [f"management pin file {PIN_PATH} is readable again"]
    assert gauges(back)[(PIN_ROLE, PIN_PATH)].readable and rotations(back) == []


def test_a_pin_file_never_readable_pins_nothing_and_counts_every_refresh() -> None:
    watch = CertWatch((FilePin(PIN_PATH), SpkiPin(None), SpkiPin(key_of(LEAVES[2][0]))))
    effects = watch.observe({PIN_PATH: MISSING}, 1.0)
    assert published(effects) == {key_of(LEAVES[2][0])}  # only the literal pin
    assert unresolved(effects) == 2
    warnings = logs(effects, "warning")
    assert any("has not been since the gateway started: it pins nothing" in w for w in warnings)
    assert any("entry 2 ({spki_sha256, ...}) is not 64 hex digits" in w for w in warnings)
    assert (PIN_ROLE, PIN_PATH) in gauges(effects)
    assert gauges(effects)[(PIN_ROLE, PIN_PATH)].expiry is None  # no expiry series
    again = watch.observe({PIN_PATH: MISSING}, 2.0)
    assert unresolved(again) == 2 and logs(again, "warning") == []
    # Readable at last: the first key is not a rotation.
    late = watch.observe({PIN_PATH: LEAVES[0][0].cert_pem}, 3.0)
    assert key_of(LEAVES[0][0]) in published(late) and rotations(late) == []
    assert unresolved(late) == 1


def test_files_under_one_role_and_name_are_one_series() -> None:
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=3)
    one, two = LEAVES[0][0], CA.issue("x", not_after=soon)
    files = (
        WatchedFile("upstream_cacertfile", "default_channel", "/a.pem"),
        WatchedFile("upstream_cacertfile", "default_channel", "/b.pem"),
        WatchedFile("listener_certfile", "agent", "/a.pem"),
    )
    watch = CertWatch((), files)
    assert watch.paths() == ("/a.pem", "/b.pem")
    effects = watch.observe({"/a.pem": one.cert_pem, "/b.pem": two.cert_pem}, 1.0)
    series = gauges(effects)[("upstream_cacertfile", "default_channel")]
    assert series.readable
    assert series.expiry == two.cert.not_valid_after_utc.timestamp()  # the earliest
    effects = watch.observe({"/a.pem": one.cert_pem, "/b.pem": MISSING}, 2.0)
    assert not gauges(effects)[("upstream_cacertfile", "default_channel")].readable
    assert gauges(effects)[("listener_certfile", "agent")].readable
    assert published(effects) == frozenset()


def test_an_unreadable_not_after_removes_the_series_and_keeps_the_pin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watch_module, "earliest_not_after", lambda _certs: None)
    watch = pin_watch()
    effects = watch.observe({PIN_PATH: LEAVES[0][0].cert_pem}, 1.0)
    series = gauges(effects)[(PIN_ROLE, PIN_PATH)]
    assert series.readable and series.expiry is None
    assert published(effects) == {key_of(LEAVES[0][0])}
    [warning] = logs(effects, "warning")
    assert "expiry is not reported" in warning
    assert logs(watch.observe({PIN_PATH: LEAVES[0][0].cert_pem}, 2.0), "warning") == []


# -- last known good as a state machine -----------------------------------------------------------


class PinFileMachine(RuleBasedStateMachine):
    """A pin file written, re-issued, corrupted and deleted in any order; after each refresh
    the published key is the model's last known good, and a rotation is reported exactly when
    a different key replaced a previous one."""

    def __init__(self) -> None:
        super().__init__()
        self.watch = pin_watch()
        self.content: bytes | ReadFailed = MISSING
        self.good: bytes | None = None  # the model: the last key read
        self.effects: list[Effect] = []
        self.expected_rotation = False
        self.readable = False
        self.wall = 0.0

    @rule(key=st.integers(0, 2), copy=st.integers(0, 1))
    def write(self, key: int, copy: int) -> None:
        self.content = LEAVES[key][copy].cert_pem

    @rule()
    def corrupt(self) -> None:
        self.content = b"-----BEGIN CERTIFICATE-----\nMIIB"

    @rule()
    def delete(self) -> None:
        self.content = MISSING

    @rule()
    def refresh(self) -> None:
        self.wall += 5.0
        before = self.good
        leaves = [leaf for pair in LEAVES for leaf in pair if leaf.cert_pem == self.content]
        self.readable = bool(leaves)
        if leaves:
            self.good = key_of(leaves[0])
        self.expected_rotation = before is not None and self.good != before
        self.effects = self.watch.observe({PIN_PATH: self.content}, self.wall)

    @invariant()
    def published_is_last_known_good(self) -> None:
        if not self.effects:
            return
        expected = frozenset() if self.good is None else frozenset({self.good})
        assert published(self.effects) == expected
        assert rotations(self.effects) == ([self.wall] if self.expected_rotation else [])
        assert unresolved(self.effects) == (1 if self.good is None else 0)
        assert gauges(self.effects)[(PIN_ROLE, PIN_PATH)].readable == self.readable


TestPinFileMachine = PinFileMachine.TestCase
TestPinFileMachine.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)


# -- the actor --------------------------------------------------------------------------------


@actor_test(timeout=10.0)
async def test_the_watcher_publishes_before_it_returns_and_follows_the_file(
    h: Harness, tmp_path: Path
) -> None:
    path = tmp_path / "server.pem"
    path.write_bytes(LEAVES[0][0].cert_pem)
    registry = CollectorRegistry()
    metrics = mgmt_auth_metrics(registry)
    board = PinBoard()
    wall = [1000.0]
    args = WatcherArgs(
        CertWatch((FilePin(str(path)),)), board, metrics, refresh_s=0.02, wall=lambda: wall[0]
    )
    h.create(PinWatcher, args)
    # The first read is done in init: published before anything after it starts.
    assert board.pins == {key_of(LEAVES[0][0])}

    def sample(metric: str, labels: dict[str, str] | None = None) -> float | None:
        return registry.get_sample_value(metric, labels or {})

    labels = {"role": PIN_ROLE, "name": str(path)}
    assert sample("yuzu_gw_cert_file_readable", labels) == 1
    assert sample("yuzu_gw_mgmt_pin_rotated_timestamp_seconds") == 0
    wall[0] = 2000.0
    path.write_bytes(LEAVES[1][0].cert_pem)
    await h.wait_until(lambda: board.pins == {key_of(LEAVES[1][0])}, 3, "rotation")
    assert sample("yuzu_gw_mgmt_pin_rotated_timestamp_seconds") == 2000.0
    path.unlink()
    await h.wait_until(lambda: sample("yuzu_gw_cert_file_readable", labels) == 0, 3)
    assert board.pins == {key_of(LEAVES[1][0])}  # last known good
    assert sample("yuzu_gw_cert_expiry_timestamp_seconds", labels) == (
        LEAVES[1][0].cert.not_valid_after_utc.timestamp()
    )
