"""The agent directory's frames (gateway/cluster/directory.py): records survive a round trip in
order, frames stay within their bound, a malformed frame is refused, and the feed gives a new
reader the snapshot before any later record."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from actors.core.agent_directory import AgentDirectory, Join, Leave, Record, SyncBegin, SyncEnd
from gateway.cluster.directory import MAX_FRAME_BYTES, RECORD, DirectoryFeed, decode, encode

ids = st.text(min_size=1, max_size=300)
records = st.lists(
    st.one_of(
        st.builds(Join, ids, st.integers(0, 2**63)),
        st.builds(Leave, ids, st.integers(0, 2**63)),
        st.just(SyncBegin()),
        st.just(SyncEnd()),
    ),
    max_size=400,
)


@given(records)
def test_records_round_trip_in_order_within_the_frame_bound(sent: list[Record]) -> None:
    frames = encode(sent)
    assert all(len(frame) <= MAX_FRAME_BYTES for frame in frames)
    got = [record for frame in frames for record in decode(frame) or [None]]
    assert got == sent


@given(st.builds(Join, ids, st.integers(0, 2**63)), st.data())
def test_a_frame_cut_inside_a_record_is_refused(join: Join, data: st.DataObject) -> None:
    [frame] = encode([SyncBegin(), join])
    cut = data.draw(st.integers(RECORD.size + 1, len(frame) - 1))
    assert decode(frame[:cut]) is None


def test_an_unknown_kind_or_bad_utf8_is_refused() -> None:
    assert decode(RECORD.pack(b"X", 0, 0)) is None
    assert decode(RECORD.pack(b"J", 1, 1) + b"\xff") is None


def test_a_new_reader_gets_the_snapshot_then_the_later_records() -> None:
    async def body() -> list[Record]:
        directory = AgentDirectory()
        directory.observe(["a"], 10)
        refreshed: list[bool] = []
        feed = DirectoryFeed(directory, lambda: refreshed.append(True))
        reader = feed.serve()
        first = decode(await anext(reader))
        feed.publish(directory.observe(["a", "b"], 20))
        second = decode(await anext(reader))
        assert refreshed == [True] and feed.readers == 1
        await reader.aclose()
        assert feed.readers == 0
        return [*(first or []), *(second or [])]

    assert asyncio.run(body()) == [SyncBegin(), Join("a", 10), SyncEnd(), Join("b", 20)]
