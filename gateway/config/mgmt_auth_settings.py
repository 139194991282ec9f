"""The converters of the four peer-authorisation keys and the values they produce.

Each refuses a term it cannot read with the seed's defect term, `{bad_mgmt_peer_auth_mode,V}`,
`{bad_mgmt_peer_identity,V}`, `{bad_mgmt_peer_denied,...}`, and this gateway's
`{bad_mgmt_peer_pins,...}` for a pin list of the wrong shape. `V` is what `shown_value` may
print: an atom or an integer by itself, anything else by its type only (a config file holds
paths beside these values).

What is NOT refused (seed): an `{spki_sha256, Hex}` that is not 64 hex digits is a pin that
never resolves (counted on `yuzu_gw_mgmt_auth_pin_unresolved_total` and warned about), not a
boot failure; an identity in lower case is accepted and matches nothing, and the boot check
says so when the listener's CA gives the upper-case value.
"""

from __future__ import annotations

import enum
import re

import attrs

from gateway.config.converters import BadValue, text_of
from gateway.config.redact import shown_value
from gateway.config.refusal import BootRefused
from gateway.config.terms import Atom, Term

__all__ = [
    "BAD_DENIED",
    "BAD_IDENTITY",
    "BAD_MODE",
    "BAD_PINS",
    "DeniedSerial",
    "DeniedSetting",
    "FilePin",
    "IdentitySetting",
    "Mode",
    "ModeSetting",
    "Pin",
    "PinsSetting",
    "SpkiPin",
]


class Mode(enum.StrEnum):
    """`mgmt_peer_auth_mode`: what admits the server."""

    PIN = "pin"
    IDENTITY = "identity"
    IDENTITY_OR_PIN = "identity_or_pin"


BAD_MODE = "bad_mgmt_peer_auth_mode"
BAD_IDENTITY = "bad_mgmt_peer_identity"
BAD_PINS = "bad_mgmt_peer_pins"  # ours: the seed names no term for a malformed pin list
BAD_DENIED = "bad_mgmt_peer_denied"

# Seed: "64 hex digits between yuzu:// and /server". Either case is accepted here so that the
# boot check can give the case-only hint; only the upper case can ever match.
_IDENTITY = re.compile(r"yuzu://[0-9A-Fa-f]{64}/server")
_SPKI_HEX = re.compile(r"[0-9A-Fa-f]{64}")
# Seed, "Getting the serial right": bare hex, 1 to 40 digits, either case, no 0x, no colons.
_SERIAL_HEX = re.compile(r"[0-9A-Fa-f]{1,40}")
_MODES = frozenset(mode.value for mode in Mode)


def _text(term: Term) -> str | None:
    """A string or a binary as text; None for any other term."""
    try:
        return text_of(term, "a text")
    except BadValue:
        return None


def _refuse(defect: str, term: Term, detail: str) -> BootRefused:
    return BootRefused(defect, detail, context=(shown_value(term),))


@attrs.frozen
class ModeSetting:
    expected: str = "pin, identity or identity_or_pin"

    def __call__(self, term: Term) -> Mode:
        if isinstance(term, Atom) and term.name in _MODES:
            return Mode(term.name)
        raise _refuse(BAD_MODE, term, f"yuzu_gw mgmt_peer_auth_mode is not {self.expected}")


@attrs.frozen
class IdentitySetting:
    """`undefined` (derive it from the management listener's cacertfile) or the identity."""

    expected: str = '"yuzu://<64 hex digits>/server" (a string or a binary), or undefined'

    def __call__(self, term: Term) -> str | None:
        if term == Atom("undefined"):
            return None
        text = _text(term)
        if text is None or not _IDENTITY.fullmatch(text):
            raise _refuse(
                BAD_IDENTITY,
                term,
                f"yuzu_gw mgmt_peer_identity is not {self.expected}; take the install from"
                " `openssl x509 -in <cacertfile> -noout -fingerprint -sha256` without the colons",
            )
        return text


@attrs.frozen
class SpkiPin:
    """`{spki_sha256, Hex}`. `digest` is None when the text is not 64 hex digits: a pin that
    never resolves."""

    digest: bytes | None

    def __str__(self) -> str:
        return "{spki_sha256, ...}"


@attrs.frozen
class FilePin:
    """`{cert_file, Path}`: the key of the first certificate in the file, re-read by the
    watcher every mgmt_pin_refresh_ms."""

    path: str

    def __str__(self) -> str:
        return f'{{cert_file, "{self.path}"}}'


Pin = SpkiPin | FilePin


@attrs.frozen
class PinsSetting:
    expected: str = "a list of {spki_sha256, Hex} and {cert_file, Path}"

    def __call__(self, term: Term) -> tuple[Pin, ...]:
        if not isinstance(term, list):
            raise _refuse(BAD_PINS, term, f"yuzu_gw mgmt_peer_pins is not {self.expected}")
        return tuple(self._pin(index, item) for index, item in enumerate(term, 1))

    def _pin(self, index: int, item: Term) -> Pin:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], Atom):
            kind, text = item[0].name, _text(item[1])
            if kind == "spki_sha256" and text is not None:
                return SpkiPin(bytes.fromhex(text) if _SPKI_HEX.fullmatch(text) else None)
            if kind == "cert_file" and text:
                return FilePin(text)
        raise _refuse(
            BAD_PINS,
            item,
            f"yuzu_gw mgmt_peer_pins entry {index} is not {{spki_sha256, Hex}} or"
            " {cert_file, Path} (a non-empty string or binary)",
        )


@attrs.frozen
class DeniedSerial:
    """One `{serial, Hex}`: `text` is the upper-case hex as written (what the boot line prints),
    `value` the serial it denies."""

    text: str
    value: int


@attrs.frozen
class DeniedSetting:
    expected: str = "a list of {serial, Hex}: bare hex, 1 to 40 digits, no 0x and no colons"

    def __call__(self, term: Term) -> tuple[DeniedSerial, ...]:
        if not isinstance(term, list):
            raise _refuse(BAD_DENIED, term, f"yuzu_gw mgmt_peer_denied is not {self.expected}")
        return tuple(self._serial(index, item) for index, item in enumerate(term, 1))

    def _serial(self, index: int, item: Term) -> DeniedSerial:
        if isinstance(item, tuple) and len(item) == 2 and item[0] == Atom("serial"):
            value = item[1]
            # Seed: "A decimal serial is read as hex (255 would be read as 0x255)".
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                text: str | None = str(value)
            else:
                text = _text(value)
            if text is not None and _SERIAL_HEX.fullmatch(text):
                return DeniedSerial(text.upper(), int(text, 16))
        raise _refuse(
            BAD_DENIED,
            item,
            f"yuzu_gw mgmt_peer_denied entry {index} is not {{serial, Hex}} with bare hex of 1"
            " to 40 digits (no 0x, no colons); read it with `openssl x509 -noout -serial`",
        )
