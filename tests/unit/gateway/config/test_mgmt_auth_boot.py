"""The four keys and the boot check of management peer authorisation (gateway/config/:
mgmt_auth_boot.py, mgmt_auth_settings.py, keys/mgmt.py): every refusal and warning of the
seed, the one INFO line, and the shipped production entry."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.config.config import Config
from gateway.config.keys import SCHEMA, mgmt
from gateway.config.keys import listeners as listener_keys
from gateway.config.loader import PROJECT_ROOT, load_config
from gateway.config.mgmt_auth_settings import FilePin, Mode, SpkiPin
from gateway.config.refusal import BootRefused
from gateway.config.resolve import resolve_section
from gateway.config.terms import parse_term
from tests.support.certs import CertAuthority, Pki, server_identity, write_pki

LOGGER = mgmt.MGMT_LOGGER
MGMT = "'yuzu.server.v1.ManagementService'"


def mgmt_entry(
    pki: Pki | None,
    name: str = "mgmt",
    ip: str = "{127,0,0,1}",
    cacertfile: Path | None = None,
    extra: str = "",
) -> str:
    body = (
        f"#{{name => {name}, service_protos => [management_pb], services => #{{{MGMT} => m}},"
        f" listen => #{{port => 0, ip => {ip}}}"
    )
    if pki is not None:
        ca = cacertfile if cacertfile is not None else pki.ca_cert_path
        body += (
            f', tls => #{{certfile => "{pki.server.cert_path}",'
            f' keyfile => "{pki.server.key_path}", cacertfile => "{ca}"{extra}}}'
        )
    return body + "}"


def resolve(*settings: str, listeners: tuple[str, ...] = ()) -> Config:
    entries = [*settings, "{allow_no_listeners, true}"]
    if listeners:
        entries.append(f"{{grpc_listeners, [{', '.join(listeners)}]}}")
    return resolve_section(SCHEMA, parse_term(f"[{', '.join(entries)}]."), {})


def refused(*settings: str, listeners: tuple[str, ...] = ()) -> BootRefused:
    with pytest.raises(BootRefused) as caught:
        resolve(*settings, listeners=listeners)
    return caught.value


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return write_pki(tmp_path)


@pytest.fixture
def bundle(tmp_path: Path, pki: Pki) -> Path:
    path = tmp_path / "bundle.pem"
    path.write_bytes(pki.ca_cert_pem + CertAuthority("Other").cert_pem)
    return path


PIN = '{mgmt_peer_pins, [{spki_sha256, "' + "AB" * 32 + '"}]}'


# -- the keys ---------------------------------------------------------------------------------


def test_defaults() -> None:
    config = resolve()
    assert config[mgmt.MGMT_PEER_AUTH_MODE] is Mode.PIN
    assert config[mgmt.MGMT_PEER_IDENTITY] is None
    assert config[mgmt.MGMT_PEER_PINS] == () and config[mgmt.MGMT_PEER_DENIED] == ()
    assert config[mgmt.MGMT_PIN_REFRESH_MS] == 5000


def test_pins_and_deny_list_are_read() -> None:
    config = resolve(
        '{mgmt_peer_pins, [{cert_file, "/etc/yuzu/certs/default-server.pem"},'
        ' {spki_sha256, <<"' + "ab" * 32 + '">>}, {spki_sha256, "not-hex"}]}',
        '{mgmt_peer_denied, [{serial, "0a1b2c"}, {serial, <<"FF">>}, {serial, 255}]}',
    )
    assert config[mgmt.MGMT_PEER_PINS] == (
        FilePin("/etc/yuzu/certs/default-server.pem"),
        SpkiPin(bytes.fromhex("ab" * 32)),
        SpkiPin(None),  # a typo'd fingerprint is a pin that never resolves, not a refusal
    )
    denied = config[mgmt.MGMT_PEER_DENIED]
    # Upper case as written; a decimal serial is read as hex (seed: 255 is 0x255).
    assert [(d.text, d.value) for d in denied] == [
        ("0A1B2C", 0x0A1B2C),
        ("FF", 0xFF),
        ("255", 0x255),
    ]


@pytest.mark.parametrize(
    ("setting", "term"),
    [
        ("{mgmt_peer_auth_mode, identity_only}", "{bad_mgmt_peer_auth_mode,identity_only}"),
        ('{mgmt_peer_auth_mode, "pin"}', "{bad_mgmt_peer_auth_mode,a list}"),
        ('{mgmt_peer_identity, "yuzu://ABC/server"}', "{bad_mgmt_peer_identity,a list}"),
        (
            '{mgmt_peer_identity, "https://' + "A" * 64 + '/server"}',
            "{bad_mgmt_peer_identity,a list}",
        ),
        ("{mgmt_peer_identity, 42}", "{bad_mgmt_peer_identity,42}"),
        ('{mgmt_peer_pins, {cert_file, "/x"}}', "{bad_mgmt_peer_pins,a tuple}"),
        ('{mgmt_peer_pins, [{cert_file, ""}]}', "{bad_mgmt_peer_pins,a tuple}"),
        ('{mgmt_peer_pins, [{key_file, "/x"}]}', "{bad_mgmt_peer_pins,a tuple}"),
        ("{mgmt_peer_pins, [{spki_sha256, 12}]}", "{bad_mgmt_peer_pins,a tuple}"),
        ('{mgmt_peer_denied, [{serial, "0x0A"}]}', "{bad_mgmt_peer_denied,a tuple}"),
        ('{mgmt_peer_denied, [{serial, "0A:1B"}]}', "{bad_mgmt_peer_denied,a tuple}"),
        ('{mgmt_peer_denied, [{serial, "' + "A" * 41 + '"}]}', "{bad_mgmt_peer_denied,a tuple}"),
        ("{mgmt_peer_denied, [{serial, -1}]}", "{bad_mgmt_peer_denied,a tuple}"),
        ('{mgmt_peer_denied, "0A"}', "{bad_mgmt_peer_denied,a list}"),
    ],
)
def test_unreadable_values_refuse_boot_with_the_seeds_terms(setting: str, term: str) -> None:
    refusal = refused(setting)
    assert refusal.term == term
    assert "/x" not in refusal.detail  # a path is never echoed


# -- refusals -------------------------------------------------------------------------------------


def test_an_authorised_listener_with_no_way_in_refuses(pki: Pki, bundle: Path) -> None:
    judged = (mgmt_entry(pki),)
    assert refused(listeners=judged).term == "no_mgmt_peer_pins"
    on_bundle = (mgmt_entry(pki, cacertfile=bundle),)
    assert (
        refused("{mgmt_peer_auth_mode, identity}", listeners=on_bundle).term
        == "no_mgmt_peer_identity"
    )
    assert (
        refused("{mgmt_peer_auth_mode, identity_or_pin}", listeners=on_bundle).term
        == "no_mgmt_peer_pins_or_identity"
    )


def test_a_plaintext_loopback_listener_is_not_judged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    for mode in Mode:
        resolve(f"{{mgmt_peer_auth_mode, {mode.value}}}", listeners=(mgmt_entry(None),))
    assert lines(caplog, logging.WARNING) == []


def test_an_identity_over_a_cacertfile_that_is_not_one_certificate_refuses(
    tmp_path: Path, pki: Pki, bundle: Path
) -> None:
    stated = f'{{mgmt_peer_identity, "{server_identity(pki.ca)}"}}'
    half = tmp_path / "half.pem"
    half.write_bytes(pki.ca_cert_pem[:300])
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    for cacertfile in (bundle, half, empty, tmp_path / "missing.pem"):
        refusal = refused(
            "{mgmt_peer_auth_mode, identity_or_pin}",
            stated,
            PIN,
            listeners=(mgmt_entry(pki, cacertfile=cacertfile),),
        )
        assert refusal.term == "{identity_over_ca_bundle,identity_or_pin}", cacertfile
        assert refusal.detail.count("\n") == 0
    # Mode identity without a pin is refused too; with a pin the pin must also match: allowed.
    assert (
        refused(
            "{mgmt_peer_auth_mode, identity}",
            stated,
            listeners=(mgmt_entry(pki, cacertfile=bundle),),
        ).term
        == "{identity_over_ca_bundle,identity}"
    )
    config = resolve(
        "{mgmt_peer_auth_mode, identity}",
        stated,
        PIN,
        listeners=(mgmt_entry(pki, cacertfile=bundle),),
    )
    assert config[mgmt.MGMT_PEER_IDENTITY] == server_identity(pki.ca)


def test_two_listeners_deriving_different_identities_refuse(tmp_path: Path, pki: Pki) -> None:
    other = write_pki(tmp_path / "other")
    listeners = (mgmt_entry(pki), mgmt_entry(other, name="mgmt2"))
    refusal = refused("{mgmt_peer_auth_mode, identity_or_pin}", PIN, listeners=listeners)
    assert refusal.term == "identity_ambiguous"
    # The same CA on both: one identity.
    same = (mgmt_entry(pki), mgmt_entry(pki, name="mgmt2"))
    config = resolve("{mgmt_peer_auth_mode, identity_or_pin}", PIN, listeners=same)
    assert config[mgmt.MGMT_PEER_IDENTITY] == server_identity(pki.ca)


# -- what is resolved and logged ------------------------------------------------------------------


def test_the_identity_is_derived_from_a_single_certificate_cacertfile(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = resolve("{mgmt_peer_auth_mode, identity}", listeners=(mgmt_entry(pki),))
    assert config[mgmt.MGMT_PEER_IDENTITY] == server_identity(pki.ca)
    assert lines(caplog, logging.INFO) == [
        "Management peer authorization: mode=identity identity=resolved pins=0 denied_serials=0"
    ]
    assert lines(caplog, logging.WARNING) == []


def test_an_unresolved_identity_warns_only_where_a_listener_needs_it(
    pki: Pki, bundle: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = resolve(
        "{mgmt_peer_auth_mode, identity_or_pin}",
        PIN,
        listeners=(mgmt_entry(pki, cacertfile=bundle),),
    )
    assert config[mgmt.MGMT_PEER_IDENTITY] is None
    [warning] = lines(caplog, logging.WARNING)
    assert "identity could not be resolved" in warning and "only a pinned key" in warning
    assert lines(caplog, logging.INFO) == [
        "Management peer authorization: mode=identity_or_pin identity=unresolved pins=1"
        " denied_serials=0"
    ]
    caplog.clear()
    resolve("{mgmt_peer_auth_mode, identity_or_pin}", PIN)  # no listener runs authorization
    assert lines(caplog, logging.WARNING) == []


def test_a_stated_identity_that_differs_warns_with_a_case_hint(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    derived = server_identity(pki.ca)
    lower = "yuzu://" + pki.ca.fingerprint_hex.lower() + "/server"
    config = resolve(
        "{mgmt_peer_auth_mode, identity_or_pin}",
        f'{{mgmt_peer_identity, <<"{lower}">>}}',
        listeners=(mgmt_entry(pki),),
    )
    assert config[mgmt.MGMT_PEER_IDENTITY] == lower  # stated wins, byte for byte
    [warning] = lines(caplog, logging.WARNING)
    assert derived in warning and "only in letter case" in warning
    caplog.clear()
    stale = server_identity(CertAuthority())
    resolve(
        "{mgmt_peer_auth_mode, identity_or_pin}",
        f'{{mgmt_peer_identity, "{stale}"}}',
        listeners=(mgmt_entry(pki),),
    )
    [warning] = lines(caplog, logging.WARNING)
    assert "differs" in warning and "letter case" not in warning


def test_an_identity_under_mode_pin_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    config = resolve(f'{{mgmt_peer_identity, "{server_identity(CertAuthority())}"}}')
    assert config[mgmt.MGMT_PEER_IDENTITY] is None
    [warning] = lines(caplog, logging.WARNING)
    assert "identity is ignored" in warning
    assert lines(caplog, logging.INFO) == [
        "Management peer authorization: mode=pin identity=not used (mode pin) pins=0"
        " denied_serials=0"
    ]


def test_the_deny_list_line_shows_at_most_twenty(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    serials = ", ".join(f'{{serial, "{n:x}"}}' for n in range(1, 23))
    resolve(f"{{mgmt_peer_denied, [{serials}]}}")
    [summary, deny] = lines(caplog, logging.INFO)
    assert summary.endswith("pins=0 denied_serials=22")
    assert (
        deny == "Management peer deny-list: " + ", ".join(f"{n:X}" for n in range(1, 21)) + ", ..."
    )


def test_postures_that_cannot_work_as_meant_warn(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    one_way = mgmt_entry(pki, extra=", verify => verify_none, fail_if_no_peer_cert => false")
    resolve(PIN, listeners=(one_way,))
    [warning] = lines(caplog, logging.WARNING)
    assert "verify_none" in warning and "bad_peer_cert" in warning
    caplog.clear()
    resolve(listeners=(mgmt_entry(None, ip="{10,0,5,12}"),))
    [warning] = lines(caplog, logging.WARNING)
    assert "plaintext on a network address" in warning


# -- the boot guard on proxied management listeners -----------------------------------------------


@pytest.mark.parametrize(
    "origin",
    [
        "origin => #{mode => proxy_protocol, sources => [{10,0,0,5}]}",
        "origin => #{mode => forwarded_for, sources => [{10,0,0,5}]}",
    ],
)
def test_a_network_reachable_management_listener_is_never_proxied(origin: str) -> None:
    entry = mgmt_entry(None, ip="{0,0,0,0}")[:-1] + f", {origin}}}"
    assert refused(PIN, listeners=(entry,)).term == "proxied_mgmt_listener"
    on_loopback = mgmt_entry(None)[:-1] + f", {origin}}}"
    resolve(PIN, listeners=(on_loopback,))  # a loopback listener is not reachable


# -- the shipped production config ----------------------------------------------------------------


def test_the_shipped_prod_config_has_the_strict_mutual_tls_management_listener() -> None:
    config = load_config(PROJECT_ROOT / "sys_config" / "sys.config.prod", {})
    [spec] = [s for s in config[listener_keys.GRPC_LISTENERS] if s.serves_mgmt]
    assert (spec.name, spec.ip, spec.port) == ("mgmt", "0.0.0.0", 50063)
    assert spec.tls is not None
    assert (spec.tls.verify, spec.tls.fail_if_no_peer_cert) == ("verify_peer", True)
    assert spec.tls.cacertfile == "/etc/yuzu/certs/default-ca.pem"
    assert spec.http2.idle_timeout_ms == 600_000 and spec.http2.max_concurrent_streams == 4096
    assert spec.limits.max_connections == 256 and spec.acceptors == 4
    assert spec.origin.mode.value == "transport"
    assert config[mgmt.MGMT_PEER_AUTH_MODE] is Mode.PIN
    assert config[mgmt.MGMT_PEER_PINS] == (FilePin("/etc/yuzu/certs/default-server.pem"),)
