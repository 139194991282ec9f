"""Tables: read anywhere, written by the owner (protected) or anyone (public), gone with the
owner; a restarted owner starts with a fresh, empty table."""

from __future__ import annotations

import pytest

from supervisors import api
from supervisors.errors import TableGone
from supervisors.supervisor import ChildSpec, Supervisor, SupFlags, SupSpec
from tests.support.actors import Args, Child, Crash, Exit, Harness, actor_test


class TableOwner(Child):
    """Creates the `registry` table in `init`, as the gateway's registry does."""

    def init(self, args: object) -> None:
        super().init(args)
        self.table = self.new_table("registry")


@actor_test
async def test_protected_table_is_read_anywhere_and_written_by_its_owner_only(h: Harness):
    owner = h.spawn("owner")
    other = h.spawn("other")
    table = await h.call(owner, lambda s: s.new_table("sessions"))
    assert table.access == "protected"
    await h.call(owner, lambda s: table.insert("agent-1", 1))
    assert await h.call(owner, lambda s: table.insert_new("agent-1", 9)) is False
    assert await h.call(owner, lambda s: table.insert_new("agent-2", 2)) is True
    # Reads: from plain code and from another actor, no message to the owner.
    assert h.base.table("sessions") is table
    assert table["agent-1"] == 1
    assert table.get("missing") is None
    assert "agent-2" in table
    assert len(table) == 2
    assert sorted(table.items()) == [("agent-1", 1), ("agent-2", 2)]
    assert await h.call(other, lambda s: sorted(table.keys())) == ["agent-1", "agent-2"]
    # Writes from anyone else are refused, from code outside actors and from actors.
    for write in (
        lambda: table.insert("x", 0),
        lambda: table.insert_new("x", 0),
        lambda: table.delete("agent-1"),
        lambda: table.take("agent-1"),
    ):
        with pytest.raises(PermissionError):
            write()
        with pytest.raises(PermissionError):
            await h.call(other, lambda s, w=write: w())
    assert sorted(table.values()) == [1, 2]
    assert await h.call(owner, lambda s: table.take("agent-1")) == 1
    await h.call(owner, lambda s: table.delete("agent-2"))
    assert len(table) == 0


@actor_test
async def test_public_table_is_written_by_any_actor_and_by_plain_code(h: Harness):
    owner = h.spawn("owner")
    other = h.spawn("other")
    table = await h.call(owner, lambda s: s.new_table("owners", "public"))
    table.insert("from-code", 1)
    await h.call(other, lambda s: table.insert("from-other", 2))
    await h.call(owner, lambda s: table.insert("from-owner", 3))
    assert dict(table.items()) == {"from-code": 1, "from-other": 2, "from-owner": 3}
    await h.call(other, lambda s: table.delete("from-code"))
    assert "from-code" not in table


@actor_test
async def test_table_names_are_unique_on_the_node(h: Harness):
    owner = h.spawn("owner")
    other = h.spawn("other")
    await h.call(owner, lambda s: s.new_table("t"))
    with pytest.raises(ValueError):
        await h.call(other, lambda s: s.new_table("t"))


@pytest.mark.parametrize("end", [Exit(), Crash()])
@actor_test
async def test_table_dies_with_its_owner(h: Harness, end: object):
    owner = h.spawn("owner")
    table = await h.call(owner, lambda s: s.new_table("t", "public"))
    table.insert("k", "v")
    h.tell(owner, end)
    await h.settle()
    assert h.base.table("t") is None
    with pytest.raises(TableGone):
        table.get("k")
    with pytest.raises(TableGone):
        len(table)
    with pytest.raises(TableGone):
        table.insert("k", "again")
    # The name is free again.
    again = h.spawn("again")
    fresh = await h.call(again, lambda s: s.new_table("t"))
    assert fresh is not table
    assert len(fresh) == 0


@actor_test
async def test_a_restarted_owner_gets_a_fresh_empty_table(h: Harness):
    sup = h.create(
        Supervisor, SupSpec(SupFlags(intensity=5), (ChildSpec("reg", TableOwner, Args("reg")),))
    )
    [info] = await api.which_children(h.base, sup)
    assert info.address is not None
    old = h.base.table("registry")
    assert old is not None
    await h.call(info.address, lambda s: s.table.insert("agent", "row"))
    assert len(old) == 1
    h.tell(info.address, Crash())
    await h.settle()
    [restarted] = await api.which_children(h.base, sup)
    assert restarted.address not in (None, info.address)
    new = h.base.table("registry")
    assert new is not None
    assert new is not old
    assert len(new) == 0
    with pytest.raises(TableGone):
        old.get("agent")
    # The new owner writes its own table; the old object stays gone.
    await h.call(restarted.address, lambda s: s.table.insert("agent", "row2"))
    assert new["agent"] == "row2"
