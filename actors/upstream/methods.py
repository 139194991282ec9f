"""The GatewayUpstream methods the gateway calls (gRPC routes on the full path)."""

from __future__ import annotations

from typing import Final

SERVICE: Final = "yuzu.gateway.v1.GatewayUpstream"
PROXY_REGISTER: Final = f"/{SERVICE}/ProxyRegister"
BATCH_HEARTBEAT: Final = f"/{SERVICE}/BatchHeartbeat"
PROXY_INVENTORY: Final = f"/{SERVICE}/ProxyInventory"
NOTIFY_STREAM_STATUS: Final = f"/{SERVICE}/NotifyStreamStatus"
FORWARD_GUARDIAN_MESSAGE: Final = f"/{SERVICE}/ForwardGuardianMessage"

# The metadata key that presents a session on a replay or an owner recovery (WIRE.md).
SESSION_ID_METADATA: Final = "x-yuzu-session-id"
