"""Peer authorisation of the management listener (seed: "Authorizing the server by its identity",
"Certificate rotation and expiry"; SPEC_INDEX MG-01..18, CW-01..08).

The config schema imports `settings` and `boot` while `gateway.config` is loading, so this
package imports `gateway.config` first and re-exports nothing: whichever is imported first, the
schema finishes before a module here needs it. The modules:

- `reasons`: the closed set of rejection reasons, the admission methods and the modes;
- `certs`: PEM blocks and the facts read from a certificate (SPKI hash, serial, URI SANs, EKU);
- `decide`: the pure decision for one management stream;
- `settings`: the converters of the four keys and the values they produce;
- `boot`: the boot check (the identity, every refusal and warning, the one INFO line);
- `watch`: the pure core of the certificate watcher (pins, last known good, the gauges);
- `watcher`: `PinWatcher`, the actor `yuzu_gw_mgmt_pins`;
- `gate`: `PeerGate`, the per-stream check and the guard around the management routes;
- `metrics`: the metric families;
- `tree`: what gateway_sup starts for it and hands the listeners.

docs/mgmt-auth.md is the operator's page.
"""

import gateway.config  # noqa: F401  (see above: the schema loads first)
