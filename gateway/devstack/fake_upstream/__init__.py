"""A fake Yuzu server: the ``yuzu.gateway.v1.GatewayUpstream`` service on grpcio's asyncio server.

The gateway is a grpclib client of this service; the fake runs on grpcio (Google's C-core, the
stack of the real C++ server), so tests check interoperability against code the project did
not write. It is part of the product for the dev stack (``rel/yuzu_gw devstack``) and needs
grpcio, the ``dev`` extra; the gateway itself never imports it. It runs in the caller's event
loop::

    async with FakeUpstream() as fake:           # 127.0.0.1, a free port
        gateway_config["upstream"] = fake.address
        fake.fail("ProxyRegister", grpc.StatusCode.UNAVAILABLE, times=2)
        ...
        [call] = await fake.wait_for_calls("NotifyStreamStatus")
        assert call.request.event == CONNECTED

or standalone, for a dev stack::

    python -m gateway.devstack.fake_upstream --port 50055 [--latency-ms ProxyRegister=200 ...]
        [--tls-dir DIR] [--max-streams N] [--verbose]

Standalone, it runs on uvloop where uvloop installs (as the node does): grpcio's asyncio server
then costs about 15% less CPU per call (docs/upstream-calls.md, "What a call costs"), and the
benchmarks that run it beside the gateway measure the gateway rather than the fake.

How an RPC is answered, in order (every step can be changed while the server runs):

1. it is recorded (:meth:`FakeUpstream.calls`), with its metadata, deadline and peer;
2. it waits while its method is frozen (:meth:`FakeUpstream.freeze`), then for its latency;
3. the next scripted outcome of its method, if any (:meth:`FakeUpstream.script`), else the
   method's rule (:meth:`FakeUpstream.set_rule`) if it gives an outcome;
4. else the default behaviour, modelled on the server (docs/dev/testing.md, "The fake server").

The fake keeps two session tables: ``sessions`` (the server's in-memory registry, emptied by
:meth:`restart`) and the route directory (durable, survives a restart), so that after a restart
heartbeats are still acknowledged but their sessions are listed in ``unknown_session_ids``.
"""

from gateway.devstack.fake_upstream.records import (
    METHODS,
    SESSION_METADATA_KEY,
    SESSION_PREFIX,
    Call,
    Fault,
    Presented,
    method_path,
)
from gateway.devstack.fake_upstream.server import FakeUpstream

__all__ = [
    "METHODS",
    "SESSION_METADATA_KEY",
    "SESSION_PREFIX",
    "Call",
    "FakeUpstream",
    "Fault",
    "Presented",
    "method_path",
]
