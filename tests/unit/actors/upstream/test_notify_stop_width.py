"""A planned stop's DISCONNECTEDs go out as wide as the flush from step 1 on (seed: "Planned stop"
steps 1, 3, 5): once nothing is admitted any more, the streams the 10-in-flight cap keeps free for
registrations and replays are idle, and 5,000 owners ending in step 3 would otherwise wait 10 at a
time behind one another until step 5."""

from __future__ import annotations

import asyncio

from actors.core.notify_store import FLUSH_BATCH, MAX_INFLIGHT, Event
from actors.upstream.actor import RaiseNotifyCap
from tests.support.actors import Harness, actor_test
from tests.unit.actors.upstream.test_upstream_notify import NOTIFY, lane, notify, start


@actor_test
async def test_after_the_stop_raises_the_cap_the_lane_sends_as_many_as_the_flush(
    h: Harness,
) -> None:
    actors, channel = start(h)
    channel.freeze()  # every send stays out: what is in flight is what the lane started
    for n in range(FLUSH_BATCH):
        h.tell(actors.upstream, notify(n, Event.DISCONNECTED))
    await h.wait_until(lambda: channel.in_flight == MAX_INFLIGHT, 2.0)
    await asyncio.sleep(0.1)
    assert channel.peak_in_flight == MAX_INFLIGHT  # running: the seed's 10
    h.tell(actors.upstream, RaiseNotifyCap(2 * FLUSH_BATCH))
    for n in range(FLUSH_BATCH, 2 * FLUSH_BATCH):
        h.tell(actors.upstream, notify(n, Event.DISCONNECTED))
    await h.wait_until(lambda: channel.in_flight == FLUSH_BATCH, 2.0)
    await asyncio.sleep(0.1)
    assert channel.peak_in_flight == FLUSH_BATCH
    assert lane(h, actors).store.inflight == FLUSH_BATCH
    channel.unfreeze()
    await h.wait_until(lambda: len(channel.calls(NOTIFY)) == 2 * FLUSH_BATCH, 5.0)
