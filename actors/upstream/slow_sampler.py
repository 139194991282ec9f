"""`slow_server` (`SLOW_SERVER_NAME`, actors/upstream/api.py): the sampler that tells a slow
server from the lanes' backpressure.

The Erlang gateway's slow-server sampler (seed: "What happens when the server restarts > Slow
server"; SPEC_INDEX M18, K58, CB-17). Every 100 ms it reads whether any upstream lane is
saturated, feeds the `SlowServer` core (actors/core/slow_server.py: credit, buckets, duty cycle)
and sets `yuzu_gw_upstream_slow` (actors/upstream/slow_metrics.py).

It never calls the lanes' owners. Each owner publishes its lane's saturation, on change, in its
own protected table, and this actor reads the tables:

- `upstream_regulator_state`, key `SlowLane.PERMITS`: a live Register or inventory report waits
  for a permit (actors/upstream/regulator.py);
- `upstream_state`, keys `SlowLane.NOTIFY` and `SlowLane.GUARDIAN`: every notification slot (10),
  every Guardian slot (50) is held (actors/upstream/notify.py, actors/upstream/guardian.py).

A table that is missing (its owner is not running) reads as not saturated: a dead regulator has
nobody waiting. The figure changes nothing the gateway does and is not a readiness input.

It starts with `SlowSamplerArgs`: the registry its gauge lives in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs
from prometheus_client import CollectorRegistry
from thespian.actors import WakeupMessage

from actors.core.slow_server import SAMPLE_INTERVAL_S, SlowLane, SlowServer
from actors.upstream.actor import STATE_TABLE as UPSTREAM_TABLE
from actors.upstream.regulator import STATE_TABLE as REGULATOR_TABLE
from actors.upstream.slow_metrics import SlowMetrics, slow_metrics
from supervisors.errors import TableGone
from supervisors.process import Process

if TYPE_CHECKING:
    from supervisors.address import Address
    from supervisors.reason import ExitReason
    from supervisors.runtime import LoopSystemBase

__all__ = ["LANE_TABLES", "SlowSampler", "SlowSamplerArgs", "saturated_lanes"]

# Where each lane's owner publishes its saturation.
LANE_TABLES: Final = (
    (REGULATOR_TABLE, SlowLane.PERMITS),
    (UPSTREAM_TABLE, SlowLane.NOTIFY),
    (UPSTREAM_TABLE, SlowLane.GUARDIAN),
)
_SAMPLE = "slow_sample"


def saturated_lanes(runtime: LoopSystemBase) -> frozenset[SlowLane]:
    """The lanes whose owners publish them saturated now (table reads, no message)."""
    saturated = set()
    for table_name, lane in LANE_TABLES:
        table = runtime.table(table_name)
        if table is None:
            continue
        try:
            if table.get(lane):
                saturated.add(lane)
        except TableGone:
            continue  # its owner ended between the lookup and the read
    return frozenset(saturated)


@attrs.frozen
class SlowSamplerArgs:
    """The registry of `yuzu_gw_upstream_slow` (actors/upstream/slow_metrics.py)."""

    registry: CollectorRegistry


class SlowSampler(Process):
    # The sampling period; a class attribute so a test can sample faster.
    interval_s: ClassVar[float] = SAMPLE_INTERVAL_S

    def init(self, args: SlowSamplerArgs) -> None:
        self.window = SlowServer()
        self.metrics: SlowMetrics = slow_metrics(args.registry)
        self.lanes: frozenset[SlowLane] = frozenset()
        self._sample()

    def receiveMessage(self, msg: Any, sender: Address) -> None:
        match msg:
            case WakeupMessage(payload=payload) if payload == _SAMPLE:
                self._sample()
            case _:
                pass

    def terminate(self, reason: ExitReason) -> None:
        # The window dies with this actor; a restarted sampler starts low, from 0.
        self.metrics.set_slow(False)

    def format_status(self) -> Mapping[str, Any]:
        return {
            "duty_cycle": round(self.window.duty_cycle, 3),
            "slow": self.window.slow,
            "saturated_lanes": sorted(lane.value for lane in self.lanes),
        }

    def _sample(self) -> None:
        self.lanes = saturated_lanes(self.runtime)
        reading = self.window.sample(self.now(), bool(self.lanes))
        self.metrics.set_slow(reading.slow)
        self.wakeupAfter(self.interval_s, _SAMPLE)
