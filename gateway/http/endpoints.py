"""The health (`/healthz`, `/readyz`) and Prometheus (`/metrics`) endpoints.

Both are the first children of the root supervisor: up before everything else and
stopped last, so `/metrics` answers through a planned stop until the very end.

`/metrics` speaks what the scraper asks for, through prometheus_client's own functions: the
OpenMetrics text when its `Accept` names `application/openmetrics-text` (`choose_encoder`),
the Prometheus text otherwise, gzip-compressed when its `Accept-Encoding` takes gzip
(`gzip_accepted`).
"""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from actors.node.api import Readiness
from gateway.http import server as http
from supervisors.process import Process
from supervisors.reason import ExitReason

log = logging.getLogger("yuzu_gw.endpoints")

GZIP = ("Content-Encoding", "gzip")
# The scrape is compressed on the event loop: level 1 takes a fraction of the default's time
# for a body of repeated text, which it still shrinks several times over.
GZIP_LEVEL = 1


@attrs.frozen
class EndpointArgs:
    name: str
    host: str
    port: int
    routes: Mapping[str, http.Handler]
    # Told the address actually bound (port 0 picks a free one, as tests do).
    on_bound: Callable[[str, tuple[str, int]], None]


class HttpEndpoint(Process):
    def init(self, args: EndpointArgs) -> None:
        self.name = args.name
        self.sock = http.bind(args.host, args.port)
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        args.on_bound(args.name, self.address)
        log.info("%s endpoint listening on %s:%d", args.name, *self.address)
        self.run_worker(http.serve(self.sock, args.routes), "serve")

    def terminate(self, reason: ExitReason) -> None:
        # The serve task is cancelled by the runtime; the socket is ours to close.
        self.sock.close()

    def format_status(self) -> Mapping[str, Any]:
        return {"endpoint": self.name, "port": self.address[1]}


def health_routes(readiness: Readiness) -> dict[str, http.Handler]:
    def healthz(request: http.Request) -> http.Response:
        return http.Response(200, b"ok\n")

    def readyz(request: http.Request) -> http.Response:
        checks = readiness.evaluate()
        failing = sorted(name for name, ok in checks.items() if not ok)
        body: dict[str, Any] = {"status": "not_ready" if failing else "ready", "checks": checks}
        if failing:
            body["failing"] = failing
        return http.Response(
            503 if failing else 200, json.dumps(body).encode() + b"\n", "application/json"
        )

    return {"/healthz": healthz, "/readyz": readyz}


def metrics_routes(registry: CollectorRegistry) -> dict[str, http.Handler]:
    def metrics(request: http.Request) -> http.Response:
        encoder, content_type = choose_encoder(request.header("Accept"))
        body = encoder(registry)
        if gzip_accepted(request.header("Accept-Encoding")):
            return http.Response(200, gzip.compress(body, GZIP_LEVEL), content_type, (GZIP,))
        return http.Response(200, body, content_type)

    return {"/metrics": metrics}
