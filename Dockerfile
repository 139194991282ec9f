# syntax=docker/dockerfile:1
# The Yuzu gateway image (docs/install.md, "Container image"):
#   docker build -t yuzu-gateway .
#   docker run --stop-timeout 40 -e YUZU_GW_COOKIE=... \
#       -v /etc/yuzu/gateway/sys.config:/etc/yuzu/gateway/sys.config:ro \
#       -v /etc/yuzu/certs:/etc/yuzu/certs:ro -p 50051:50051 yuzu-gateway
# deploy/docker/compose.yaml and deploy/kubernetes/ run it with the settings below.

# -- build: a virtualenv with the gateway and its dependencies -----------------------------------
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/yuzu-gateway
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY actors ./actors
COPY supervisors ./supervisors
COPY protos ./protos
RUN python -m venv .venv && .venv/bin/pip install -q .

# -- run: the same slim base, the venv and the release scripts, no compiler, no pip cache --------
FROM python:3.11-slim-bookworm
ARG UID=10001
# A fixed uid, so a mounted run directory or certificate volume can be owned by it.
RUN useradd --system --uid "${UID}" --user-group --home-dir /opt/yuzu-gateway \
        --shell /usr/sbin/nologin yuzu \
    && install -d -m 0700 -o yuzu -g yuzu /var/run/yuzu-gateway \
    && install -d -m 0755 /etc/yuzu/gateway /etc/yuzu/certs
WORKDIR /opt/yuzu-gateway
COPY --from=build /opt/yuzu-gateway/.venv ./.venv
COPY rel ./rel
# The shipped configurations; mount your own over /etc/yuzu/gateway/sys.config.
COPY sys_config ./sys_config
COPY sys_config/sys.config.prod /etc/yuzu/gateway/sys.config
COPY sys_config/vm.args /etc/yuzu/gateway/vm.args
ENV YUZU_GW_PYTHON=/opt/yuzu-gateway/.venv/bin/python \
    YUZU_GW_CONFIG=/etc/yuzu/gateway/sys.config \
    YUZU_GW_VM_ARGS=/etc/yuzu/gateway/vm.args \
    YUZU_GW_RUN_DIR=/var/run/yuzu-gateway \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER yuzu
# The agent listener, the management listener (firewall it to the server: docs/tls.md),
# /healthz and /readyz, /metrics (sys_config/sys.config.prod).
EXPOSE 50051 50063 8081 9568
# SIGTERM is the planned stop (the manual, "Planned stop"). The stop timeout cannot be set
# here: give `docker run --stop-timeout 40` or compose's `stop_grace_period: 40s`, above
# shutdown_flush_budget_ms (20 s; the manual, "Stop timeout coupling"). Docker's default
# 10 s kills the node mid-flush.
STOPSIGNAL SIGTERM
LABEL org.opencontainers.image.title="yuzu-gateway" \
      io.yuzu.gateway.stop-timeout-seconds="40"
# Liveness, as the manual's shipped healthchecks: /healthz on health_port (no curl in a slim
# image; the venv's Python fetches it).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["/opt/yuzu-gateway/.venv/bin/python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8081/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["/opt/yuzu-gateway/rel/entrypoint.sh"]
