"""`/metrics` in the format and encoding the scraper asks for, the request's header fields, and
the node's own families (build info, a gauge per readiness check)."""

from __future__ import annotations

import gzip

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from actors.node.api import Readiness
from gateway.http import server as http
from gateway.http.endpoints import metrics_routes
from gateway.http.metrics import register_node_metrics


def scrape(registry: CollectorRegistry, **headers: str) -> http.Response:
    request = http.Request({name.replace("_", "-").lower(): v for name, v in headers.items()})
    return metrics_routes(registry)["/metrics"](request)


def test_metrics_honours_accept_and_gzip() -> None:
    registry = CollectorRegistry()
    Counter("yuzu_gw_probe", "A probe.", registry=registry).inc()
    plain = scrape(registry)
    assert plain.content_type.startswith("text/plain; version=0.0.4")
    assert plain.headers == () and b"yuzu_gw_probe_total 1.0" in plain.body
    open_metrics = scrape(registry, Accept="application/openmetrics-text; version=1.0.0")
    assert open_metrics.content_type.startswith("application/openmetrics-text")
    assert open_metrics.body.rstrip().endswith(b"# EOF")
    zipped = scrape(registry, Accept_Encoding="gzip, deflate")
    assert zipped.headers == (("Content-Encoding", "gzip"),)
    assert gzip.decompress(zipped.body) == plain.body


def test_a_request_head_is_routed_with_its_header_fields() -> None:
    seen: list[http.Request] = []

    def handler(request: http.Request) -> http.Response:
        seen.append(request)
        return http.Response(200, b"x", headers=(("Content-Encoding", "gzip"),))

    head = b"GET /m?x=1 HTTP/1.1\r\nHost: h\r\nAccept-Encoding:  gzip \r\n\r\n"
    response, head_only = http._route(head, {"/m": handler})
    assert not head_only and seen[0].header("accept-encoding") == "gzip"
    assert seen[0].header("Accept") == ""
    assert b"Content-Encoding: gzip\r\n" in http._render(response, head_only=False)


def test_build_info_and_one_gauge_per_readiness_check() -> None:
    registry, readiness = CollectorRegistry(), Readiness()
    state = {"router": True}
    readiness.register("router", lambda: state["router"])
    readiness.register("broken", lambda: 1 / 0 > 0)  # a check that raises is failing
    register_node_metrics(registry, readiness)
    register_node_metrics(registry, readiness)  # once per registry
    state["router"] = False
    text = scrape(registry).body.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    checks = {s.labels["check"]: s.value for s in families["yuzu_gw_readiness_check"].samples}
    assert checks == {"router": 0.0, "broken": 0.0}
    [info] = families["yuzu_gw_build_info"].samples
    assert info.value == 1 and set(info.labels) == {"version", "python", "grpclib", "protobuf"}
