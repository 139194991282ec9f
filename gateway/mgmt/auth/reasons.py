"""The vocabulary of management peer authorisation: admission methods and the closed set of
rejection reasons (the modes are the values of a key, gateway/config/mgmt_auth_settings.py).

The seed counts rejections on `yuzu_gw_mgmt_auth_rejected_total{reason}` with a closed set of
eleven reasons. It names six (`pin_mismatch`, `no_pins_resolved` and the four the identity modes
added: `no_uri_san`, `identity_mismatch`, `identity_unresolved`, `revoked`); the other five are
the pin-era reasons of the Erlang gateway's authorisation module, kept by name so dashboards and
alerts carry over. Every reason's series exists at 0 from start (a series that first appears at 1
is invisible to `increase()`).

- `bad_peer_cert`: the connection has no client certificate, or it cannot be decoded;
- `missing_server_auth_eku`: the certificate lacks the serverAuth extended key usage (no agent
  leaf has it);
- `no_pins_configured`: the pin is needed and `mgmt_peer_pins` is empty (boot refuses that on a
  TLS management listener; kept as the decision's backstop);
- `no_pins_resolved`: the pin is needed and no configured pin resolved (typo'd fingerprints, pin
  files never readable);
- `pin_mismatch`: pins resolved, none is the key of the certificate;
- `bad_pin_config`: the pin list is malformed; this gateway refuses such a list at boot
  (`{bad_mgmt_peer_pins,...}`), so its series stays at 0;
- `no_uri_san`: the identity is needed and the certificate has no URI SAN;
- `identity_mismatch`: it has URI SANs, none byte-equal to `yuzu://<install>/server`;
- `identity_unresolved`: the identity is needed and the gateway could not resolve it;
- `revoked`: the certificate's serial is in `mgmt_peer_denied` (or a deny-list is set and the
  serial cannot be read);
- `internal_error`: the check itself failed; the stream is refused (fail closed).
"""

from __future__ import annotations

import enum


class Method(enum.StrEnum):
    """What let a stream in (`yuzu_gw_mgmt_auth_admitted_total{method}`)."""

    IDENTITY = "identity"
    PIN = "pin"


class Reason(enum.StrEnum):
    """Why a stream was refused (the list in the module doc)."""

    BAD_PEER_CERT = "bad_peer_cert"
    MISSING_SERVER_AUTH_EKU = "missing_server_auth_eku"
    NO_PINS_CONFIGURED = "no_pins_configured"
    NO_PINS_RESOLVED = "no_pins_resolved"
    PIN_MISMATCH = "pin_mismatch"
    BAD_PIN_CONFIG = "bad_pin_config"
    NO_URI_SAN = "no_uri_san"
    IDENTITY_MISMATCH = "identity_mismatch"
    IDENTITY_UNRESOLVED = "identity_unresolved"
    REVOKED = "revoked"
    INTERNAL_ERROR = "internal_error"
