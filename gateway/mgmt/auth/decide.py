"""The decision for one management stream: admitted by a method, or refused with a reason.

Pure: the peer's facts (read once per connection), the policy resolved at boot and the pins the
watcher last published go in; a `Decision` comes out. No I/O, no clock, no logging.

Rules (seed: "Authorizing the server by its identity" > Admission order; SPEC_INDEX MG-01..05):

1. No certificate, or one that does not decode: `bad_peer_cert`.
2. The serverAuth extended key usage is required: `missing_server_auth_eku`.
3. The mode:
   - `pin`: the SHA-256 of the certificate's SubjectPublicKeyInfo is one of the resolved pins;
   - `identity`: a URI SAN is byte-for-byte the resolved identity (no case folding, no
     normalisation, no prefix match); with pins configured the pin must match as well;
   - `identity_or_pin`: either. When both fail, `no_uri_san` and `identity_mismatch` are
     reported as the pin's reason if pins are configured (the pin alerting keeps its meaning
     through the transition); `identity_unresolved` is reported as itself (a configuration
     defect, not a rotation); with no pins configured the identity's own reason is reported.
4. The deny-list, last, for a peer the mode admitted: a denied serial is `revoked`, and so is
   an unreadable serial when a deny-list is configured. With an empty deny-list the serial is
   not read.
"""

from __future__ import annotations

import attrs

from gateway.config.certs import PeerCert
from gateway.config.mgmt_auth_settings import Mode
from gateway.mgmt.auth.reasons import Method, Reason

__all__ = ["Admitted", "Decision", "Policy", "Rejected", "decide"]


@attrs.frozen
class Policy:
    """What boot resolved: fixed for the life of the node (every change needs a restart)."""

    mode: Mode
    identity: str | None  # the identity to match; None: unresolved (or not used, mode pin)
    pins_configured: int  # entries in mgmt_peer_pins, resolved or not
    denied: frozenset[int] = frozenset()  # serials of mgmt_peer_denied


@attrs.frozen
class Admitted:
    method: Method


@attrs.frozen
class Rejected:
    reason: Reason


Decision = Admitted | Rejected

_BY_PIN = Admitted(Method.PIN)
_BY_IDENTITY = Admitted(Method.IDENTITY)
# Reasons identity_or_pin reports as the pin's when pins are configured.
_MASKED_BY_PIN = frozenset({Reason.NO_URI_SAN, Reason.IDENTITY_MISMATCH})


def decide(peer: PeerCert | None, policy: Policy, pins: frozenset[bytes]) -> Decision:
    """Admit or refuse one stream of a peer whose certificate is `peer` (module doc)."""
    if peer is None:
        return Rejected(Reason.BAD_PEER_CERT)
    if not peer.server_auth:
        return Rejected(Reason.MISSING_SERVER_AUTH_EKU)
    verdict = _by_mode(peer, policy, pins)
    if (
        isinstance(verdict, Admitted)
        and policy.denied
        and (peer.serial is None or peer.serial in policy.denied)
    ):
        return Rejected(Reason.REVOKED)
    return verdict


def _by_mode(peer: PeerCert, policy: Policy, pins: frozenset[bytes]) -> Decision:
    if policy.mode is Mode.PIN:
        return _by_pin(peer, policy, pins)
    by_identity = _by_identity(peer, policy)
    if policy.mode is Mode.IDENTITY:
        if isinstance(by_identity, Admitted) and policy.pins_configured:
            # A pin kept in identity mode is an extra constraint: both must match.
            by_pin = _by_pin(peer, policy, pins)
            return by_identity if isinstance(by_pin, Admitted) else by_pin
        return by_identity
    if isinstance(by_identity, Admitted) or not policy.pins_configured:
        return by_identity
    by_pin = _by_pin(peer, policy, pins)
    if isinstance(by_pin, Admitted):
        return by_pin
    assert isinstance(by_identity, Rejected)
    return by_pin if by_identity.reason in _MASKED_BY_PIN else by_identity


def _by_pin(peer: PeerCert, policy: Policy, pins: frozenset[bytes]) -> Decision:
    if not policy.pins_configured:
        return Rejected(Reason.NO_PINS_CONFIGURED)
    if not pins:
        return Rejected(Reason.NO_PINS_RESOLVED)
    return _BY_PIN if peer.spki_sha256 in pins else Rejected(Reason.PIN_MISMATCH)


def _by_identity(peer: PeerCert, policy: Policy) -> Decision:
    if policy.identity is None:
        return Rejected(Reason.IDENTITY_UNRESOLVED)
    if not peer.uris:
        return Rejected(Reason.NO_URI_SAN)
    # `in` on a tuple of str compares with ==: exact, code point for code point (URI SANs are
    # IA5String, so that is byte for byte).
    return _BY_IDENTITY if policy.identity in peer.uris else Rejected(Reason.IDENTITY_MISMATCH)
