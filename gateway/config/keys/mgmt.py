"""Keys of management peer authorisation (seed: "Authorizing the server by its identity",
"Certificate rotation and expiry"; SPEC_INDEX C70-C74). No `YUZU_GW_*` variable maps to any.

The converters (gateway/config/mgmt_auth_settings.py) refuse an unreadable value with the
seed's `{bad_mgmt_peer_*,V}` term; the whole-config rules are the boot check in `CHECKS`
(gateway/config/mgmt_auth_boot.py). After that check, `config[MGMT_PEER_IDENTITY]` is the
identity the management streams are matched against: the stated one, or the one derived from
the management listener's cacertfile, or None when it is unresolved or not used (mode pin)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.config.converters import IntRange
from gateway.config.keys import listeners as listener_keys
from gateway.config.mgmt_auth_boot import check_at_boot
from gateway.config.mgmt_auth_settings import (
    BAD_DENIED,
    BAD_IDENTITY,
    BAD_MODE,
    BAD_PINS,
    DeniedSerial,
    DeniedSetting,
    IdentitySetting,
    Mode,
    ModeSetting,
    Pin,
    PinsSetting,
)
from gateway.config.schema import Key, Refuse
from gateway.config.section import Check
from gateway.config.terms import Atom

if TYPE_CHECKING:
    from gateway.config.config import Config

AREA = "mgmt"
MGMT_LOGGER = "yuzu_gw.mgmt_auth"
_AT_BOOT = "boot, before the listeners start"

MGMT_PIN_REFRESH_MS: Key[int] = Key(
    name="mgmt_pin_refresh_ms",
    default=5000,
    convert=IntRange(100, 3_600_000),
    read_when="once, when the pin watcher starts",
    doc="How often the certificate watcher re-reads every configured certificate file (the"
    " cert_file pins, the listeners' and the upstream channel's files); a file is parsed again"
    " only when the SHA-256 of its bytes changed.",
    area=AREA,
    our_choices=("valid values", "bad value"),
)

MGMT_PEER_AUTH_MODE: Key[Mode] = Key(
    name="mgmt_peer_auth_mode",
    default=Atom("pin"),
    convert=ModeSetting(),
    read_when=_AT_BOOT,
    doc="What admits the server on a management listener with TLS: its key pinned in"
    " mgmt_peer_pins (pin), its identity yuzu://<install>/server in a URI SAN (identity; a pin,"
    " if configured, must match too), or either (identity_or_pin). docs/mgmt-auth.md.",
    area=AREA,
    on_bad=Refuse(BAD_MODE),
    bad_doc=f"refuse boot `{{{BAD_MODE},V}}`",
)

MGMT_PEER_IDENTITY: Key[str | None] = Key(
    name="mgmt_peer_identity",
    default=Atom("undefined"),
    convert=IdentitySetting(),
    read_when=_AT_BOOT,
    doc="The server's identity, matched byte for byte against URI SANs. Unset, it is derived"
    " from the management listener's cacertfile when that holds exactly one certificate. Ignored"
    " (with a WARNING) in mode pin.",
    area=AREA,
    on_bad=Refuse(BAD_IDENTITY),
    default_doc="derived from the management listener's cacertfile",
    bad_doc=f"refuse boot `{{{BAD_IDENTITY},V}}`",
)

MGMT_PEER_PINS: Key[tuple[Pin, ...]] = Key(
    name="mgmt_peer_pins",
    default=[],
    convert=PinsSetting(),
    read_when="the list at boot; each cert_file every mgmt_pin_refresh_ms",
    doc="The server keys admitted: {spki_sha256, Hex} (SHA-256 of the DER SubjectPublicKeyInfo)"
    " or {cert_file, Path} (the key of the first certificate in the file; the last key read"
    " stays pinned while the file cannot be read). A pin that never resolves is counted on"
    " yuzu_gw_mgmt_auth_pin_unresolved_total.",
    area=AREA,
    on_bad=Refuse(BAD_PINS),
    our_choices=("bad value",),
    bad_doc=f"a list of the wrong shape refuses boot `{{{BAD_PINS},...}}` (term ours); a Hex that"
    " is not 64 hex digits is a pin that never resolves",
)

MGMT_PEER_DENIED: Key[tuple[DeniedSerial, ...]] = Key(
    name="mgmt_peer_denied",
    default=[],
    convert=DeniedSetting(),
    read_when=_AT_BOOT,
    doc='Certificate serials refused in every mode (reason revoked), e.g. [{serial, "0A1B2C"}].'
    " A decimal value is read as hex.",
    area=AREA,
    on_bad=Refuse(BAD_DENIED),
    bad_doc=f"refuse boot `{{{BAD_DENIED},...}}`",
)


def check_peer_authorization(config: Config, env: Mapping[str, str]) -> Config:
    """The boot check (gateway/config/mgmt_auth_boot.py): refuses, logs, and leaves the resolved
    identity in `MGMT_PEER_IDENTITY`."""
    outcome = check_at_boot(
        config[MGMT_PEER_AUTH_MODE],
        config[MGMT_PEER_IDENTITY],
        config[MGMT_PEER_PINS],
        config[MGMT_PEER_DENIED],
        listeners=config[listener_keys.GRPC_LISTENERS],
    )
    log = logging.getLogger(MGMT_LOGGER)
    for line in outcome.lines:
        log.log(logging.getLevelName(line.level.upper()), "%s", line.text)
    return config.with_value(
        MGMT_PEER_IDENTITY, outcome.identity, config.source_of(MGMT_PEER_IDENTITY)
    )


KEYS: tuple[Key[Any], ...] = (
    MGMT_PIN_REFRESH_MS,
    MGMT_PEER_AUTH_MODE,
    MGMT_PEER_IDENTITY,
    MGMT_PEER_PINS,
    MGMT_PEER_DENIED,
)

# Runs after the listener checks: it reads the final listener list (ports overridden).
CHECKS: tuple[Check, ...] = (check_peer_authorization,)

__all__ = [
    "CHECKS",
    "KEYS",
    "MGMT_LOGGER",
    "MGMT_PEER_AUTH_MODE",
    "MGMT_PEER_DENIED",
    "MGMT_PEER_IDENTITY",
    "MGMT_PEER_PINS",
    "MGMT_PIN_REFRESH_MS",
]
