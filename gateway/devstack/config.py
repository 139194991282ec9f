"""The dev stack node's configuration, derived from the shipped sys_config/sys.config.

Pure: the shipped file's sections go in (as `gateway.config.loader.read_sections` reads them),
the node's sections come out, and `render` writes them back as Erlang terms. What changes:

- `health_port`, `prometheus_port` and each listener's `listen.port` take the stack's ports;
- `allow_no_upstream` goes, and `upstream_client` points `default_channel` at the fake server
  (plaintext `http`, or with TLS `https` with verify_peer, the CA and the gateway's leaf:
  mutual TLS, the production posture);
- the management listener is added when the shipped file has none;
- with TLS: the agent listener gets one-way TLS (verify_none, the agents have no certificate)
  and the management listener strict mutual TLS with peer authorisation by identity
  (`mgmt_peer_auth_mode` `identity`, the identity derived from the listener's cacertfile, which
  holds the one CA).

Every other key is kept as shipped, so the stack runs what a newcomer's node would run.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from gateway.config.listener_spec import AGENT_SERVICE, DEFAULT_MGMT_PORT, MGMT_SERVICE
from gateway.config.terms import Atom, ExternalFun, Term, format_term
from gateway.devstack.pki import DevPki

__all__ = ["HOST", "UPSTREAM_PORT", "Ports", "derive", "render", "shipped_ports"]

HOST = "127.0.0.1"
LOOPBACK = (127, 0, 0, 1)
# The Yuzu server's GatewayUpstream port (WIRE.md; the commented endpoint in sys.config).
UPSTREAM_PORT = 50055
SECTION = "yuzu_gw"

Section = tuple[str, list[Term]]


@attrs.frozen
class Ports:
    """Where each part of the stack listens (all on loopback but the node's HTTP endpoints,
    which bind every interface as in production)."""

    agent: int
    mgmt: int
    health: int
    metrics: int
    upstream: int

    def all(self) -> tuple[int, ...]:
        return (self.upstream, self.agent, self.mgmt, self.health, self.metrics)


def _a(name: str) -> Atom:
    return Atom(name)


def _entries(sections: Sequence[Section]) -> list[Term]:
    for app, body in sections:
        if app == SECTION:
            return body
    return []


def _value(entries: Sequence[Term], key: str) -> Term | None:
    for entry in entries:
        if isinstance(entry, tuple) and entry[0] == _a(key):
            return entry[1]
    return None


def _serves(listener: Term, service: str) -> bool:
    services = listener.get(_a("services"), {}) if isinstance(listener, dict) else {}
    return isinstance(services, dict) and _a(service) in services


def _listeners(entries: Sequence[Term]) -> list[dict[Term, Term]]:
    value = _value(entries, "grpc_listeners")
    return [entry for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def _listen_port(listeners: Sequence[dict[Term, Term]], service: str, default: int) -> int:
    for listener in listeners:
        listen = listener.get(_a("listen"), {})
        if _serves(listener, service) and isinstance(listen, dict):
            port = listen.get(_a("port"))
            return port if isinstance(port, int) else default
    return default


def shipped_ports(sections: Sequence[Section]) -> Ports:
    """The ports the shipped file gives: a newcomer's `curl localhost:8081/readyz` works."""
    entries = _entries(sections)
    listeners = _listeners(entries)
    health, metrics = _value(entries, "health_port"), _value(entries, "prometheus_port")
    return Ports(
        agent=_listen_port(listeners, AGENT_SERVICE, 50051),
        mgmt=_listen_port(listeners, MGMT_SERVICE, DEFAULT_MGMT_PORT),
        health=health if isinstance(health, int) else 8081,
        metrics=metrics if isinstance(metrics, int) else 9568,
        upstream=UPSTREAM_PORT,
    )


def _mgmt_listener() -> dict[Term, Term]:
    return {
        _a("name"): _a("mgmt"),
        _a("service_protos"): [_a("management_pb")],
        _a("services"): {_a(MGMT_SERVICE): _a("yuzu_gw_mgmt_service")},
    }


def _tls(pki: DevPki, *, one_way: bool) -> dict[Term, Term]:
    files: dict[Term, Term] = {
        _a("certfile"): str(pki.gateway.cert_path),
        _a("keyfile"): str(pki.gateway.key_path),
        _a("cacertfile"): str(pki.ca_cert_path),
    }
    if one_way:
        files[_a("verify")] = _a("verify_none")
        files[_a("fail_if_no_peer_cert")] = False
    return files


def _listener(listener: dict[Term, Term], ports: Ports, pki: DevPki | None) -> dict[Term, Term]:
    agent = _serves(listener, AGENT_SERVICE)
    out = dict(listener)
    out[_a("listen")] = {_a("port"): ports.agent if agent else ports.mgmt, _a("ip"): LOOPBACK}
    if pki is not None:
        out[_a("tls")] = _tls(pki, one_way=agent)
        if not agent:
            # As sys.config.prod has it (the gate judges every TLS management listener).
            out[_a("auth_fun")] = ExternalFun("yuzu_gw_authz", "check_mgmt_peer", 1)
    return out


def _upstream_client(ports: Ports, pki: DevPki | None) -> Term:
    if pki is None:
        endpoint: Term = (_a("http"), HOST, ports.upstream, [])
    else:
        options: list[Term] = [
            (_a("verify"), _a("verify_peer")),
            (_a("cacertfile"), str(pki.ca_cert_path)),
            (_a("certfile"), str(pki.gateway.cert_path)),
            (_a("keyfile"), str(pki.gateway.key_path)),
        ]
        endpoint = (_a("https"), HOST, ports.upstream, options)
    channel = (_a("default_channel"), [endpoint], {_a("pool_size"): 1})
    return {_a("channels"): [channel]}


def derive(sections: Sequence[Section], ports: Ports, pki: DevPki | None) -> list[Section]:
    """The node's sections (module doc); other applications' sections are kept as they are."""
    entries = _entries(sections)
    listeners = _listeners(entries)
    if not any(_serves(listener, MGMT_SERVICE) for listener in listeners):
        listeners.append(_mgmt_listener())
    replaced: dict[str, Term] = {
        "health_port": ports.health,
        "prometheus_port": ports.metrics,
        "grpc_listeners": [_listener(listener, ports, pki) for listener in listeners],
        "upstream_client": _upstream_client(ports, pki),
    }
    if pki is not None:
        replaced["mgmt_peer_auth_mode"] = _a("identity")
    body: list[Term] = []
    for entry in entries:
        key = entry[0].name if isinstance(entry, tuple) and isinstance(entry[0], Atom) else ""
        if key in replaced:
            body.append((entry[0], replaced.pop(key)))
        elif key != "allow_no_upstream":
            body.append(entry)
    body += [(_a(key), value) for key, value in replaced.items()]
    return [*((app, e) for app, e in sections if app != SECTION), (SECTION, body)]


def render(sections: Sequence[Section], source: str) -> str:
    """A config file: one `{App, [...]}` per section, one key per line."""
    blocks = []
    for app, body in sections:
        lines = ",\n".join(f"    {format_term(entry)}" for entry in body)
        blocks.append(f" {{{app}, [\n{lines}\n ]}}")
    joined = ",\n".join(blocks)
    return (
        f"%% Written by the dev stack at each start, derived from {source}\n"
        f"%% (docs/devstack.md). Edits are lost at the next start.\n[\n{joined}\n].\n"
    )
