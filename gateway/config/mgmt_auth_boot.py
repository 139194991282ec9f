"""The boot check of management peer authorisation: resolve the identity once, refuse what cannot
work, and say what is in force (seed: "Authorizing the server by its identity"; SPEC_INDEX
B24-B31, MG-06..09, L42-L43).

It runs as a schema check, after every key is resolved and after the listener port overrides,
before anything is bound. It reads the management listeners' cacertfiles (to derive the
identity), nothing else; the per-stream check never reads a file.

Which listeners are judged: a listener that serves the ManagementService over TLS. A plaintext
listener has no certificate to judge and is not judged (the lab rig's loopback listener); one
bound off loopback gets a WARNING instead, because anyone who reaches it can command the fleet.

In order:

1. mode `pin` with `mgmt_peer_identity` set: WARNING, the identity is ignored;
2. the identity (not in mode `pin`): the stated one, or derived from each judged listener's
   cacertfile when it holds exactly one certificate. A stated identity over a cacertfile that is
   not demonstrably one certificate refuses `{identity_over_ca_bundle,Mode}` unless the mode is
   `identity` and a pin is configured; a stated identity that differs from a derived one is a
   WARNING (with a hint when only the letter case differs); two listeners deriving different
   values refuse `identity_ambiguous`;
3. a judged listener whose mode has no way left to admit the server refuses
   `no_mgmt_peer_pins` / `no_mgmt_peer_identity` / `no_mgmt_peer_pins_or_identity`;
4. WARNINGs: an unresolved identity where a judged listener needs it, a judged listener that
   asks for no client certificate (verify_none), a plaintext management listener off loopback;
5. one INFO line, `Management peer authorization: mode=... identity=... pins=N denied_serials=N`,
   and the deny-list as parsed when it is not empty.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
from cryptography import x509

from actors.core import LogLine
from gateway.config.certs import PemError, install_identity, pem_blocks
from gateway.config.listener_spec import ListenerSpec
from gateway.config.mgmt_auth_settings import DeniedSerial, Mode, Pin
from gateway.config.refusal import BootRefused

__all__ = [
    "IDENTITY_AMBIGUOUS",
    "IDENTITY_OVER_CA_BUNDLE",
    "NO_IDENTITY",
    "NO_PINS",
    "NO_PINS_OR_IDENTITY",
    "BootOutcome",
    "check_at_boot",
    "is_judged",
]

NO_PINS = "no_mgmt_peer_pins"
NO_IDENTITY = "no_mgmt_peer_identity"
NO_PINS_OR_IDENTITY = "no_mgmt_peer_pins_or_identity"
IDENTITY_OVER_CA_BUNDLE = "identity_over_ca_bundle"
IDENTITY_AMBIGUOUS = "identity_ambiguous"

# Seed, "The boot log reports the outcome": the deny-list line prints at most 20 serials.
DENY_LIST_SHOWN = 20
_DOCS = "docs/mgmt-auth.md"

Reader = Callable[[str], bytes]


def is_judged(spec: ListenerSpec) -> bool:
    """A listener whose management streams are authorised: it serves the ManagementService
    over TLS."""
    return spec.serves_mgmt and spec.tls is not None


@attrs.frozen
class BootOutcome:
    identity: str | None  # the identity the streams are matched against; None: unresolved
    lines: tuple[LogLine, ...]


@attrs.frozen
class _Derived:
    listener: str
    identity: str | None
    why: str  # why nothing was derived ("" when it was)


def _read(path: str) -> bytes:
    return Path(path).read_bytes()


def derive(listener: str, cacertfile: str, read: Reader = _read) -> _Derived:
    """The identity of a cacertfile that holds exactly one readable certificate."""
    try:
        data = read(cacertfile)
    except OSError as exc:
        return _Derived(listener, None, f"cacertfile cannot be read ({exc.strerror or 'error'})")
    try:
        blocks = pem_blocks(data)
    except PemError as exc:
        return _Derived(listener, None, f"cacertfile is not readable PEM: {exc}")
    certs = [der for label, der in blocks if label == "CERTIFICATE"]
    if len(blocks) != 1 or len(certs) != 1:
        return _Derived(
            listener, None, f"cacertfile holds {len(certs)} certificates, not exactly one"
        )
    try:
        x509.load_der_x509_certificate(certs[0])
    except ValueError:
        return _Derived(listener, None, "cacertfile's certificate does not decode")
    return _Derived(listener, install_identity(certs[0]), "")


def check_at_boot(
    mode: Mode,
    stated: str | None,
    pins: Sequence[Pin],
    denied: Sequence[DeniedSerial],
    *,
    listeners: Sequence[ListenerSpec],
    read: Reader = _read,
) -> BootOutcome:
    """Resolve the identity and check the posture (module doc); raises `BootRefused`."""
    judged = [spec for spec in listeners if is_judged(spec)]
    lines: list[LogLine] = []
    if mode is Mode.PIN:
        identity = None
        if stated is not None:
            lines.append(
                LogLine(
                    "warning",
                    "mgmt_peer_identity is set but mgmt_peer_auth_mode is pin: the identity is"
                    " ignored (identity_or_pin or identity use it)",
                )
            )
    else:
        derived = [derive(s.name, s.tls.cacertfile, read) for s in judged if s.tls is not None]
        if stated is not None:
            identity = stated
            lines += _check_stated(mode, stated, derived, bool(pins))
        else:
            identity = _from_derived(derived)
    _refuse_no_way_in(mode, identity, pins, judged)
    lines += _warnings(mode, identity, judged, listeners)
    if mode is Mode.PIN:
        identity_word = "not used (mode pin)"
    else:
        identity_word = "resolved" if identity is not None else "unresolved"
    lines.append(
        LogLine(
            "info",
            f"Management peer authorization: mode={mode.value} identity={identity_word}"
            f" pins={len(pins)} denied_serials={len(denied)}",
        )
    )
    if denied:
        shown = ", ".join(d.text for d in denied[:DENY_LIST_SHOWN])
        more = ", ..." if len(denied) > DENY_LIST_SHOWN else ""
        lines.append(LogLine("info", f"Management peer deny-list: {shown}{more}"))
    return BootOutcome(identity, tuple(lines))


def _check_stated(
    mode: Mode, stated: str, derived: list[_Derived], has_pins: bool
) -> list[LogLine]:
    lines: list[LogLine] = []
    for one in derived:
        if one.identity is None:
            if mode is Mode.IDENTITY and has_pins:
                continue  # every CA of the bundle could mint it; the pin must match too
            raise BootRefused(
                IDENTITY_OVER_CA_BUNDLE,
                f"mgmt_peer_identity is set, but the {one.why} on management listener"
                f" {one.listener}: any CA it trusts could mint the identity. Stay in pin, or use"
                f" mode identity with a pin, or fix the file ({_DOCS})",
                context=(mode.value,),
            )
        if one.identity != stated:
            hint = (
                "; they differ only in letter case and the comparison is byte-exact: write the"
                " install in upper case"
                if one.identity.lower() == stated.lower()
                else ""
            )
            lines.append(
                LogLine(
                    "warning",
                    f"mgmt_peer_identity differs from the identity derived from the cacertfile of"
                    f" management listener {one.listener} ({one.identity}){hint}",
                )
            )
    return lines


def _from_derived(derived: list[_Derived]) -> str | None:
    if not derived or any(one.identity is None for one in derived):
        return None
    values = sorted({one.identity for one in derived if one.identity is not None})
    if len(values) > 1:
        raise BootRefused(
            IDENTITY_AMBIGUOUS,
            "the management listeners' cacertfiles give different identities"
            f" ({', '.join(one.listener for one in derived)}); state mgmt_peer_identity",
        )
    return values[0]


def _refuse_no_way_in(
    mode: Mode, identity: str | None, pins: Sequence[Pin], judged: list[ListenerSpec]
) -> None:
    if not judged:
        return
    where = f"management listener {judged[0].name} runs peer authorization"
    if mode is Mode.PIN and not pins:
        raise BootRefused(
            NO_PINS,
            f"{where} in mode pin and mgmt_peer_pins is empty: nothing could admit the"
            f" server ({_DOCS})",
        )
    if mode is Mode.IDENTITY and identity is None:
        raise BootRefused(
            NO_IDENTITY,
            f"{where} in mode identity and the identity is unresolved: state mgmt_peer_identity"
            f" or give the listener a cacertfile of exactly one certificate ({_DOCS})",
        )
    if mode is Mode.IDENTITY_OR_PIN and identity is None and not pins:
        raise BootRefused(
            NO_PINS_OR_IDENTITY,
            f"{where} in mode identity_or_pin with no pin and an unresolved identity ({_DOCS})",
        )


def _warnings(
    mode: Mode,
    identity: str | None,
    judged: list[ListenerSpec],
    listeners: Sequence[ListenerSpec],
) -> list[LogLine]:
    lines: list[LogLine] = []
    if judged and mode is not Mode.PIN and identity is None:
        lines.append(
            LogLine(
                "warning",
                "Management peer authorization: the identity could not be resolved (the"
                " cacertfile is not exactly one readable certificate and mgmt_peer_identity is"
                " not set); only a pinned key is admitted",
            )
        )
    for spec in judged:
        if spec.tls is not None and spec.tls.verify == "verify_none":
            lines.append(
                LogLine(
                    "warning",
                    f"management listener {spec.name} asks for no client certificate (verify_none):"
                    " every management stream is refused bad_peer_cert; use the strict mutual"
                    " TLS defaults",
                )
            )
    for spec in listeners:
        if spec.serves_mgmt and spec.tls is None and not ipaddress.ip_address(spec.ip).is_loopback:
            lines.append(
                LogLine(
                    "warning",
                    f"management listener {spec.name} is plaintext on a network address: peer"
                    " authorization needs TLS, so anyone who reaches the port can command the"
                    " fleet; give it the tls map of sys.config.prod",
                )
            )
    return lines
