"""The decision for one management stream (gateway/mgmt/auth/decide.py): the seed's admission
order and reporting rules, as examples and as properties over arbitrary peers and policies."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gateway.config.certs import PeerCert
from gateway.config.mgmt_auth_settings import Mode
from gateway.mgmt.auth.decide import Admitted, Policy, Rejected, decide
from gateway.mgmt.auth.reasons import Method, Reason

INSTALL = "AB" * 32
IDENTITY = f"yuzu://{INSTALL}/server"
KEY_A, KEY_B, KEY_C = (bytes([n]) * 32 for n in (1, 2, 3))

# URIs a peer may carry: the identity, and what must never pass for it.
URIS = (
    IDENTITY,
    IDENTITY.lower(),  # case folding
    f"yuzu://{INSTALL.lower()}/server",
    f"yuzu://{INSTALL}/agent/agent-1",  # an agent shares the prefix
    f"yuzu://{INSTALL}/server/",  # prefix match
    f"yuzu://{INSTALL}/serve",
    "https://yuzu.example.com/",
)

SERVER = PeerCert(server_auth=True, spki_sha256=KEY_A, uris=(IDENTITY,), serial=0x0A1B2C)


def policy(
    mode: Mode = Mode.PIN,
    identity: str | None = IDENTITY,
    pins: int = 1,
    denied: frozenset[int] = frozenset(),
) -> Policy:
    return Policy(mode, identity, pins, denied)


# -- examples, one per rule ----------------------------------------------------------------------


def test_no_certificate_and_no_server_auth_come_first() -> None:
    for mode in Mode:
        assert decide(None, policy(mode), frozenset({KEY_A})) == Rejected(Reason.BAD_PEER_CERT)
        agent = attrs.evolve(SERVER, server_auth=False)
        assert decide(agent, policy(mode), frozenset({KEY_A})) == Rejected(
            Reason.MISSING_SERVER_AUTH_EKU
        )


def test_pin_mode() -> None:
    pins = frozenset({KEY_A, KEY_B})
    assert decide(SERVER, policy(), pins) == Admitted(Method.PIN)
    other = attrs.evolve(SERVER, spki_sha256=KEY_C)
    assert decide(other, policy(), pins) == Rejected(Reason.PIN_MISMATCH)
    assert decide(SERVER, policy(pins=2), frozenset()) == Rejected(Reason.NO_PINS_RESOLVED)
    assert decide(SERVER, policy(pins=0), frozenset()) == Rejected(Reason.NO_PINS_CONFIGURED)
    # The identity plays no part in mode pin.
    assert decide(attrs.evolve(SERVER, uris=()), policy(identity=None), pins) == Admitted(
        Method.PIN
    )


def test_identity_is_byte_exact() -> None:
    identity = policy(Mode.IDENTITY, pins=0)
    assert decide(SERVER, identity, frozenset()) == Admitted(Method.IDENTITY)
    for uri in URIS[1:]:
        peer = attrs.evolve(SERVER, uris=(uri,))
        assert decide(peer, identity, frozenset()) == Rejected(Reason.IDENTITY_MISMATCH), uri
    # Any of several URI SANs may carry it.
    both = attrs.evolve(SERVER, uris=(URIS[3], IDENTITY))
    assert decide(both, identity, frozenset()) == Admitted(Method.IDENTITY)
    assert decide(attrs.evolve(SERVER, uris=()), identity, frozenset()) == Rejected(
        Reason.NO_URI_SAN
    )
    unresolved = policy(Mode.IDENTITY, identity=None, pins=0)
    assert decide(SERVER, unresolved, frozenset()) == Rejected(Reason.IDENTITY_UNRESOLVED)


def test_identity_mode_with_a_pin_needs_both() -> None:
    both = policy(Mode.IDENTITY, pins=1)
    assert decide(SERVER, both, frozenset({KEY_A})) == Admitted(Method.IDENTITY)
    renewed = attrs.evolve(SERVER, spki_sha256=KEY_B)
    assert decide(renewed, both, frozenset({KEY_A})) == Rejected(Reason.PIN_MISMATCH)
    # With no pin, a renewed key that keeps the identity is admitted at once.
    assert decide(renewed, policy(Mode.IDENTITY, pins=0), frozenset()) == Admitted(Method.IDENTITY)


def test_identity_or_pin_reporting_rules() -> None:
    either = policy(Mode.IDENTITY_OR_PIN, pins=1)
    pins = frozenset({KEY_A})
    # The identity admits whatever the pin says (a renewed key: no pin_mismatch window).
    renewed = attrs.evolve(SERVER, spki_sha256=KEY_B)
    assert decide(renewed, either, pins) == Admitted(Method.IDENTITY)
    # The pin admits a peer without the identity.
    old_leaf = attrs.evolve(SERVER, uris=())
    assert decide(old_leaf, either, pins) == Admitted(Method.PIN)
    # Both fail: no_uri_san and identity_mismatch are reported as the pin's reason.
    stranger = attrs.evolve(SERVER, spki_sha256=KEY_C, uris=())
    assert decide(stranger, either, pins) == Rejected(Reason.PIN_MISMATCH)
    agent_uri = attrs.evolve(stranger, uris=(URIS[3],))
    assert decide(agent_uri, either, frozenset()) == Rejected(Reason.NO_PINS_RESOLVED)
    # identity_unresolved is a configuration defect, reported as itself.
    unresolved = policy(Mode.IDENTITY_OR_PIN, identity=None, pins=1)
    assert decide(stranger, unresolved, pins) == Rejected(Reason.IDENTITY_UNRESOLVED)
    assert decide(SERVER, unresolved, pins) == Admitted(Method.PIN)
    # With no pin configured, the identity's own reason.
    no_pins = policy(Mode.IDENTITY_OR_PIN, pins=0)
    assert decide(stranger, no_pins, frozenset()) == Rejected(Reason.NO_URI_SAN)
    assert decide(agent_uri, no_pins, frozenset()) == Rejected(Reason.IDENTITY_MISMATCH)


@pytest.mark.parametrize("mode", list(Mode))
def test_the_deny_list_comes_last_and_fails_closed_on_an_unreadable_serial(mode: Mode) -> None:
    pins = frozenset({KEY_A})
    denied = policy(mode, denied=frozenset({0x0A1B2C}))
    assert decide(SERVER, denied, pins) == Rejected(Reason.REVOKED)
    other = policy(mode, denied=frozenset({0x99}))
    assert isinstance(decide(SERVER, other, pins), Admitted)
    unreadable = attrs.evolve(SERVER, serial=None)
    assert decide(unreadable, other, pins) == Rejected(Reason.REVOKED)
    # With an empty deny-list the serial is not read.
    assert isinstance(decide(unreadable, policy(mode), pins), Admitted)
    # A peer the mode refuses keeps the mode's reason.
    stranger = attrs.evolve(SERVER, spki_sha256=KEY_C, uris=())
    assert decide(stranger, denied, pins) != Rejected(Reason.REVOKED)


# -- properties ------------------------------------------------------------------------------------

peers = st.builds(
    PeerCert,
    server_auth=st.booleans(),
    spki_sha256=st.sampled_from((KEY_A, KEY_B, KEY_C)),
    uris=st.lists(st.sampled_from(URIS), max_size=3).map(tuple),
    serial=st.none() | st.integers(1, 4),
)
policies = st.builds(
    Policy,
    mode=st.sampled_from(list(Mode)),
    identity=st.sampled_from((None, IDENTITY)),
    pins_configured=st.integers(0, 3),
    denied=st.frozensets(st.integers(1, 4), max_size=2),
)
pin_sets = st.frozensets(st.sampled_from((KEY_A, KEY_B, KEY_C)), max_size=3)


def _admissible(peer: PeerCert, pol: Policy, pins: frozenset[bytes]) -> bool:
    """The seed's rules written as one predicate."""
    if not peer.server_auth:
        return False
    by_identity = pol.identity is not None and pol.identity in peer.uris
    by_pin = pol.pins_configured > 0 and peer.spki_sha256 in pins
    by_mode = {
        Mode.PIN: by_pin,
        Mode.IDENTITY: by_identity and (pol.pins_configured == 0 or by_pin),
        Mode.IDENTITY_OR_PIN: by_identity or by_pin,
    }[pol.mode]
    revoked = bool(pol.denied) and (peer.serial is None or peer.serial in pol.denied)
    return by_mode and not revoked


@given(peers, policies, pin_sets)
def test_admitted_exactly_when_the_rules_say(
    peer: PeerCert, pol: Policy, pins: frozenset[bytes]
) -> None:
    assume(pol.pins_configured or not pins)  # nothing resolves from no pin
    decision = decide(peer, pol, pins)
    assert isinstance(decision, Admitted) == _admissible(peer, pol, pins)
    if isinstance(decision, Admitted):
        by_identity = pol.mode is not Mode.PIN and pol.identity in peer.uris
        assert decision.method is (Method.IDENTITY if by_identity else Method.PIN)
    else:
        assert decision.reason in set(Reason)
        assert decision.reason not in (Reason.INTERNAL_ERROR, Reason.BAD_PIN_CONFIG)


@given(peers, policies, pin_sets)
def test_reporting_rules(peer: PeerCert, pol: Policy, pins: frozenset[bytes]) -> None:
    assume(pol.pins_configured or not pins)
    decision = decide(peer, pol, pins)
    if not isinstance(decision, Rejected):
        return
    reason = decision.reason
    if pol.mode is Mode.PIN:
        assert reason not in (
            Reason.NO_URI_SAN,
            Reason.IDENTITY_MISMATCH,
            Reason.IDENTITY_UNRESOLVED,
        )
    if pol.mode is Mode.IDENTITY_OR_PIN and pol.pins_configured:
        assert reason not in (Reason.NO_URI_SAN, Reason.IDENTITY_MISMATCH)
    if pol.mode is Mode.IDENTITY_OR_PIN and not pol.pins_configured:
        # The identity's own reason: the same as mode identity with no pin.
        assert decision == decide(peer, attrs.evolve(pol, mode=Mode.IDENTITY), pins)
    if (
        pol.mode is not Mode.PIN
        and pol.identity is None
        and peer.server_auth
        and not (
            pol.mode is Mode.IDENTITY_OR_PIN and pol.pins_configured and peer.spki_sha256 in pins
        )
    ):
        assert reason is Reason.IDENTITY_UNRESOLVED
    if reason is Reason.REVOKED:
        # Only a peer the mode admitted is checked against the deny-list.
        assert decide(peer, attrs.evolve(pol, denied=frozenset()), pins) != decision


@given(peers, policies, pin_sets)
def test_an_empty_deny_list_never_reads_the_serial(
    peer: PeerCert, pol: Policy, pins: frozenset[bytes]
) -> None:
    pol = attrs.evolve(pol, denied=frozenset())
    assert decide(peer, pol, pins) == decide(attrs.evolve(peer, serial=None), pol, pins)


def test_the_closed_set_has_the_seeds_eleven() -> None:
    assert len(Reason) == 11
    named = {"pin_mismatch", "no_pins_resolved", "no_uri_san", "identity_mismatch"}
    named |= {"identity_unresolved", "revoked"}
    assert named <= {r.value for r in Reason}
    assert {m.value for m in Method} == {"identity", "pin"}
