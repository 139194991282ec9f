"""ReportInventory: a request process (seed: "Inventory Proxy", "Heartbeat admission" >
ReportInventory, "Known limits"; SPEC_INDEX S21-S23, ADM-12).

1. Admission, the heartbeat's rule on `InventoryReport.session_id`, before any permit is asked
   for, so a peer that never registered cannot hold the inventory permits or their queue:
   refused is NOT_FOUND "unknown session", `yuzu_gw_inventory_rejected_total{reason}` (a
   connection mismatch included) and a warn-limited WARNING without the session id. No audit
   row: there is no principal to attribute one to. A report whose text is not valid UTF-8 is
   read leniently for it: a session id that is not valid UTF-8 is no session held here.
2. An admitted report whose text is not valid UTF-8 (`undecodable`), or one larger than the
   server's 4194304-byte receive limit (`refuse_oversize`), is refused locally, INTERNAL (the
   seed's local encode refusal). A daily sync can reach about 5.6 MiB; the agent retries at its
   own 30 s floor. Neither local refusal calls upstream or moves the breaker.
3. ProxyInventory with an `inventory` permit; the server's answer relayed as is. Breaker open,
   queue full, deadline, planned stop: UNAVAILABLE.
"""

from __future__ import annotations

from typing import Any

from grpclib.server import Stream

from actors.core.breaker import Lane
from actors.core.heartbeat_sanitise import lenient_class
from actors.core.permits import Caller
from actors.registry.api import UNKNOWN_SESSION_DETAILS, admit
from actors.upstream.api import PROXY_INVENTORY
from gateway.agent.lenient import Undecoded, escaped
from gateway.agent.plane import (
    AgentPlane,
    conn_key,
    loosened,
    receive,
    refuse_oversize,
    undecodable,
)
from gateway.agent.register import proxy_call
from gateway.agent.status import not_found
from protos.yuzu.agent.v1 import agent_pb2

__all__ = ["report_inventory"]

# A report with text that is not valid UTF-8, read for its session id.
_LENIENT_REPORT: Any = lenient_class(agent_pb2.InventoryReport.DESCRIPTOR)


async def report_inventory(
    plane: AgentPlane, stream: Stream[agent_pb2.InventoryReport, agent_pb2.InventoryAck]
) -> None:
    received = await receive(stream)
    if isinstance(received, Undecoded):
        loose = loosened(plane, received, _LENIENT_REPORT, Lane.INVENTORY, PROXY_INVENTORY)
        session_id = escaped(loose.session_id)
    else:
        session_id = received.session_id
    reason = admit(plane.runtime, session_id, conn_key())
    if reason is not None:
        plane.metrics.inventory_refused(reason)
        plane.warn(
            "inventory_admission",
            "ReportInventory refused before forwarding: no session held on this connection"
            f" ({reason})",
        )
        raise not_found(UNKNOWN_SESSION_DETAILS)
    if isinstance(received, Undecoded):
        raise undecodable(plane, Lane.INVENTORY, PROXY_INVENTORY)
    report = received
    refuse_oversize(plane, report, Lane.INVENTORY, PROXY_INVENTORY)
    ack = await proxy_call(
        plane,
        stream,
        report,
        agent_pb2.InventoryAck,
        caller=Caller.INVENTORY,
        method=PROXY_INVENTORY,
        rpc="ReportInventory",
        warn_kind="inventory_upstream",
    )
    await stream.send_message(ack)
