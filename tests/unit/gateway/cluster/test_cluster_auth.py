"""The cookie-derived mutual authentication (gateway/cluster/auth.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.cluster.auth import (
    REPLAY_WINDOW,
    ReplayWindow,
    ServerNonces,
    call_proof,
    new_nonce,
    server_proof,
    verify,
)

COOKIE = "c" * 64
METHOD = "/yuzu.gateway.cluster.v1.Cluster/Ping"


def signed(nonce: str, seq: int, cookie: str = COOKIE, method: str = METHOD) -> str:
    return f"{nonce}.{seq}.{call_proof(cookie, nonce, seq, method)}"


def test_the_server_proof_binds_both_nonces_the_node_and_the_cookie() -> None:
    cn, sn = new_nonce(), new_nonce()
    proof = server_proof(COOKIE, cn, sn, "node-1")
    assert verify(proof, server_proof(COOKIE, cn, sn, "node-1"))
    assert not verify(proof, server_proof("d" * 64, cn, sn, "node-1"))
    assert not verify(proof, server_proof(COOKIE, new_nonce(), sn, "node-1"))
    assert not verify(proof, server_proof(COOKIE, cn, sn, "node-2"))
    # The cookie never appears in what crosses the wire.
    assert COOKIE not in proof


def test_a_signed_call_is_accepted_once_for_its_method_and_cookie() -> None:
    nonces = ServerNonces()
    sn = nonces.issue()
    assert nonces.check(COOKIE, signed(sn, 1), METHOD)
    assert not nonces.check(COOKIE, signed(sn, 1), METHOD)  # replayed
    assert not nonces.check(COOKIE, signed(sn, 2, cookie="x" * 64), METHOD)  # wrong cookie
    assert not nonces.check(COOKIE, signed(sn, 3), METHOD + "x")  # signed for another method
    assert not nonces.check(COOKIE, signed(new_nonce(), 4), METHOD)  # never issued
    for bad in ("", "a.b.c", f"{sn}.-1.x", f"{sn}.1"):
        assert not nonces.check(COOKIE, bad, METHOD)


def test_the_oldest_challenge_is_forgotten_past_the_cap() -> None:
    nonces = ServerNonces(cap=2)
    first, second, third = nonces.issue(), nonces.issue(), nonces.issue()
    assert len(nonces) == 2
    assert not nonces.check(COOKIE, signed(first, 1), METHOD)
    assert nonces.check(COOKIE, signed(second, 1), METHOD)
    assert nonces.check(COOKIE, signed(third, 1), METHOD)


def test_a_flood_of_challenges_and_bad_calls_never_evicts_an_established_link() -> None:
    """Challenge is unauthenticated: a flood of them, or of calls signed without the cookie,
    must not drop a link a cookie holder established (it used to evict its nonce)."""
    nonces = ServerNonces(cap=2, links=2)
    live = nonces.issue()
    assert nonces.check(COOKIE, signed(live, 1), METHOD)
    for seq in range(2, 50):
        flooded = nonces.issue()
        assert not nonces.check(COOKIE, signed(flooded, 1, cookie="x" * 64), METHOD)
        assert not nonces.check(COOKIE, signed(live, seq, cookie="x" * 64), METHOD)
        assert nonces.check(COOKIE, signed(live, seq), METHOD)
    assert len(nonces) == 3  # the live link and the two newest pending challenges


def test_established_links_are_bounded_oldest_first() -> None:
    nonces = ServerNonces(cap=4, links=2)
    first, second, third = nonces.issue(), nonces.issue(), nonces.issue()
    for nonce in (first, second, third):
        assert nonces.check(COOKIE, signed(nonce, 1), METHOD)
    assert not nonces.check(COOKIE, signed(first, 2), METHOD)
    assert nonces.check(COOKIE, signed(second, 2), METHOD)
    assert nonces.check(COOKIE, signed(third, 2), METHOD)


@given(st.lists(st.integers(1, 3 * REPLAY_WINDOW), max_size=200))
def test_the_replay_window_accepts_each_sequence_number_at_most_once(seqs: list[int]) -> None:
    window = ReplayWindow()
    accepted: set[int] = set()
    high = 0
    for seq in seqs:
        ok = window.accept(seq)
        if ok:
            assert seq not in accepted and seq > high - REPLAY_WINDOW
            accepted.add(seq)
            high = max(high, seq)
        else:
            assert seq in accepted or seq <= high - REPLAY_WINDOW
