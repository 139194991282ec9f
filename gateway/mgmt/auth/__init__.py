"""Peer authorisation of the management listener (seed: "Authorizing the server by its identity",
"Certificate rotation and expiry"; SPEC_INDEX MG-01..18, CW-01..08).

What the configuration decides at boot is in gateway/config/: the four keys and their values
(`keys/mgmt.py`, `mgmt_auth_settings.py`, the modes among them), the boot check
(`mgmt_auth_boot.py`) and the facts read from certificates (`certs.py`). The modules here:

- `reasons`: the closed set of rejection reasons and the admission methods;
- `decide`: the pure decision for one management stream;
- `watch`: the pure core of the certificate watcher (pins, last known good, the gauges);
- `watcher`: `PinWatcher`, the actor `yuzu_gw_mgmt_pins`;
- `gate`: `PeerGate`, the per-stream check and the guard around the management routes;
- `metrics`: the metric families;
- `tree`: what gateway_sup starts for it and hands the listeners.

docs/mgmt-auth.md is the operator's page.
"""
