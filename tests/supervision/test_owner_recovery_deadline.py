"""A restarted owner's recovery deadline (actors/agents/owner.py, RECOVERY_DEADLINE_S): armed
while the session is being recovered, cancelled once it is recovered, so a mass kill does not
leave one timer per owner to arrive as a message 10 s later. The deadline's own rules (what it
ends, and that it changes nothing once streaming) are in
tests/unit/actors/core/test_owner_recovery.py.
"""

from __future__ import annotations

from actors.agents import owner as agent_owner
from actors.agents.api import StreamEnd, owner_row
from actors.core.owner_lifecycle import RECOVERY_FAILED_DETAILS
from actors.upstream.api import DisconnectSettled, SessionPresented
from supervisors.address import Address
from tests.supervision.test_agent_owner import UNAVAILABLE, drain, tree
from tests.support.actors import Harness, actor_test


def timers(h: Harness, owner: Address) -> int:
    ref = h.base.ref(owner)
    assert ref is not None
    return len(ref.timers or ())


@actor_test
async def test_a_recovered_owner_holds_no_recovery_deadline(h: Harness):
    t = tree(h)
    owner, _stream = await t.owner()
    assert timers(h, owner) == 0  # a first owner has no deadline
    h.base.kill(owner)
    await h.settle()
    row = owner_row(h.base, "s1")
    assert row is not None and row.owner != owner
    restarted = row.owner
    # Recovering: the deadline is armed through every step...
    assert timers(h, restarted) == 1
    h.tell(restarted, DisconnectSettled("s1", "delivered"))
    await h.settle()
    assert timers(h, restarted) == 1
    # ...and gone once the session is presented again and streaming.
    h.tell(restarted, SessionPresented("s1", True))
    await h.settle()
    assert h.instance(restarted).format_status()["phase"] == "streaming"
    assert timers(h, restarted) == 0


@actor_test
async def test_a_recovery_that_stalls_still_ends_at_its_deadline(h: Harness, monkeypatch):
    # Not cancelled too early: registered again but never presented, the owner ends at the
    # deadline and the agent is told to come back.
    monkeypatch.setattr(agent_owner, "RECOVERY_DEADLINE_S", 0.05)
    t = tree(h)
    owner, stream = await t.owner()
    h.base.kill(owner)
    await h.settle()
    row = owner_row(h.base, "s1")
    assert row is not None
    h.tell(row.owner, DisconnectSettled("s1", "delivered"))
    await h.settle()
    assert h.instance(row.owner).format_status()["phase"] == "presenting"
    await h.wait_until(lambda: not h.alive(row.owner))
    assert drain(stream) == [StreamEnd(UNAVAILABLE, RECOVERY_FAILED_DETAILS)]
    assert owner_row(h.base, "s1") is None
