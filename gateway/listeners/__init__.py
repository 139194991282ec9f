"""The gRPC listeners: the agent and management edges of the gateway.

Kept import-light on purpose (the config schema imports `spec` while `gateway.config` is still
loading), so nothing is re-exported here. The modules:

- `spec`: `grpc_listeners` entries to frozen `ListenerSpec`s, every defect term;
- `overrides`: YUZU_GW_AGENT_PORT / YUZU_GW_MGMT_PORT and the no-listener refusal;
- `origin`, `proxy_header`: attribution rules, PROXY v1/v2 and x-forwarded-for, pure;
- `connection`: what a handler reads (`current_call()`: connection key, peer, origin);
- `protocol`, `server`, `tls`: the grpclib server, its limits, suspend and resume;
- `metrics`: the listener counters;
- `listener_actor`: `ListenerActor`, one per listener, and its messages;
- `tree`: `listener_child_specs(ctx, handlers)`, what the root supervisor starts.

docs/listeners.md is the operator's page.
"""
