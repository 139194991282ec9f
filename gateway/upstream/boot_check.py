"""The upstream client's boot checks: what needs the environment or the file system.

Run once by `gateway.node.boot.prepare`, after the configuration is resolved and before any
actor starts or any listener binds (seed, "What the gateway refuses at boot"; SPEC_INDEX
B17-B19, L35-L39). In order:

1. the lines the parser left (bad values replaced by defaults, ignored options);
2. no channel named `default_channel`: refused (`no_default_channel`) unless
   `{allow_no_upstream, true}`, the literal atom, acknowledges a gateway under test;
3. an https endpoint without `{verify, verify_peer}` and a CA of its own (`cacertfile` or
   `cacerts`): refused (`unverified_upstream_tls`) unless `YUZU_GW_ALLOW_UNVERIFIED_UPSTREAM=1`,
   which logs a warning instead. One verified endpoint does not excuse another: calls go
   round robin over all of them;
4. a TLS file that is a directory or not a regular file: refused (`unusable_upstream_tls_file`);
5. a TLS file that is missing, unreadable, empty or holds no PEM certificate (key): one WARNING
   per file, and the gateway starts (the server may create its certificates later);
6. per channel, the posture (mutual TLS, server-authenticated TLS, plaintext), and a WARNING
   when it has more than one connection ("Keep one upstream connection").

`check_at_boot` returns the lines for the caller to log, so tests read them as data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Final

from actors.core import LogLine
from actors.upstream.api import DEFAULT_CHANNEL
from gateway.config.config import Config
from gateway.config.keys.upstream import ALLOW_NO_UPSTREAM, UPSTREAM_CLIENT, UPSTREAM_TCP_NODELAY
from gateway.config.refusal import BootRefused
from gateway.config.upstream_client import DOCS_REF, ChannelSpec, ClientSpec
from gateway.upstream import tls_files

__all__ = [
    "ALLOW_UNVERIFIED_ENV",
    "NO_DEFAULT_CHANNEL",
    "UNUSABLE_UPSTREAM_TLS_FILE",
    "UNVERIFIED_UPSTREAM_TLS",
    "UPSTREAM_LOGGER",
    "check_at_boot",
    "check_upstream",
    "log_lines",
]

UPSTREAM_LOGGER: Final = "yuzu_gw.upstream"
ALLOW_UNVERIFIED_ENV: Final = "YUZU_GW_ALLOW_UNVERIFIED_UPSTREAM"
# The seed names no term for these two refusals; the names are ours.
NO_DEFAULT_CHANNEL: Final = "no_default_channel"
UNVERIFIED_UPSTREAM_TLS: Final = "unverified_upstream_tls"
UNUSABLE_UPSTREAM_TLS_FILE: Final = "unusable_upstream_tls_file"

UNVERIFIED_TEXT: Final = (
    "the upstream channel uses TLS (https) WITHOUT {verify,verify_peer} and a"
    " {cacertfile,...} of its own"
)
DIRECTORY_TEXT: Final = "a TLS file of an upstream endpoint is a directory or not a regular file"


def check_at_boot(
    spec: ClientSpec | None,
    *,
    allow_no_upstream: bool,
    env: Mapping[str, str],
    nodelay: bool = True,
    kind_problem: Callable[[str], str | None] = tls_files.kind_problem,
    content_problem: Callable[[tls_files.Role, str], str | None] = tls_files.content_problem,
) -> list[LogLine]:
    """Raise `BootRefused` for the first refusal; otherwise the lines to log."""
    lines: list[LogLine] = []
    channels = spec.channels if spec is not None else ()
    for channel in channels:
        lines.extend(channel.notes)
    lines.extend(_default_channel(spec, allow_no_upstream))
    for channel in channels:
        lines.extend(_unverified(channel, env))
    for channel in channels:
        _refuse_non_files(channel, kind_problem)
    for channel in channels:
        lines.extend(_file_warnings(channel, content_problem))
        lines.extend(_ignored_options(channel))
        lines.append(_posture(channel, nodelay))
        if channel.connections > 1:
            lines.append(_pool_warning(channel))
    return lines


def log_lines(lines: list[LogLine], logger: logging.Logger | None = None) -> None:
    target = logger or logging.getLogger(UPSTREAM_LOGGER)
    for line in lines:
        target.log(logging.getLevelName(line.level.upper()), "%s", line.text)


def _default_channel(spec: ClientSpec | None, allow_no_upstream: bool) -> list[LogLine]:
    if spec is not None and spec.channel(DEFAULT_CHANNEL) is not None:
        return []
    if not allow_no_upstream:
        raise BootRefused(
            NO_DEFAULT_CHANNEL,
            "no upstream channel is named default_channel, so the gateway would register no"
            " agent and forward no heartbeat while /readyz answered ready. Configure"
            " {upstream_client, #{channels => [{default_channel, Endpoints, Opts}]}}; only the"
            " literal {allow_no_upstream, true} excuses it, for a gateway under test",
        )
    return [
        LogLine(
            "warning",
            "No upstream channel is named default_channel; allow_no_upstream is true, so the"
            " gateway starts without one (a gateway under test): it registers no agent and"
            " forwards no heartbeat.",
        )
    ]


def _unverified(channel: ChannelSpec, env: Mapping[str, str]) -> list[LogLine]:
    weak = [n for n, e in enumerate(channel.endpoints, 1) if e.is_tls and not e.tls.verified]
    if not weak:
        return []
    which = ", ".join(f"#{n}" for n in weak)
    if env.get(ALLOW_UNVERIFIED_ENV) != "1":
        raise BootRefused(
            UNVERIFIED_UPSTREAM_TLS,
            f"{UNVERIFIED_TEXT} (channel {channel.name}, endpoint {which}). Without a CA of its"
            " own any publicly trusted certificate for the server's name would be accepted."
            f" Only the dev/CI override {ALLOW_UNVERIFIED_ENV}=1 excuses it",
        )
    labels = ", ".join(channel.endpoints[n - 1].label for n in weak)
    return [
        LogLine(
            "warning",
            f"{ALLOW_UNVERIFIED_ENV}=1: {UNVERIFIED_TEXT} (channel {channel.name}: {labels})."
            " The server is not authenticated as production requires; never set this in a"
            " deployment.",
        )
    ]


def _files(channel: ChannelSpec) -> list[tuple[str, tls_files.Role, str]]:
    """(endpoint label, role, path) of every TLS file of the channel's https endpoints."""
    return [
        (endpoint.label, tls_files.Role(name), path)
        for endpoint in channel.endpoints
        if endpoint.is_tls
        for name, path in endpoint.tls.files()
    ]


def _refuse_non_files(channel: ChannelSpec, kind_problem: Callable[[str], str | None]) -> None:
    for label, role, path in _files(channel):
        reason = kind_problem(path)
        if reason is not None:
            raise BootRefused(
                UNUSABLE_UPSTREAM_TLS_FILE,
                f"{DIRECTORY_TEXT} (channel {channel.name} endpoint {label}:"
                f" {tls_files.describe(role, path, reason)}). It cannot become a file by"
                " waiting; a container runtime creates a directory in place of a bind-mounted"
                " file that does not exist on the host",
            )


def _file_warnings(
    channel: ChannelSpec, content_problem: Callable[[tls_files.Role, str], str | None]
) -> list[LogLine]:
    lines = []
    for label, role, path in _files(channel):
        reason = content_problem(role, path)
        if reason is not None:
            lines.append(
                LogLine(
                    "warning",
                    f"Upstream channel {channel.name} endpoint {label}:"
                    f" {tls_files.describe(role, path, reason)}. Every connection to it fails"
                    " until this is fixed. The gateway starts anyway: the server may create"
                    " its certificates after the gateway starts, and the channel keeps"
                    " retrying.",
                )
            )
    return lines


def _ignored_options(channel: ChannelSpec) -> list[LogLine]:
    lines = []
    for endpoint in channel.endpoints:
        ignored = (*endpoint.tls.ignored, *endpoint.socket.ignored)
        if not endpoint.is_tls and (endpoint.tls.files() or endpoint.tls.verify):
            ignored = ("the SSL options of an http endpoint", *ignored)
        if ignored:
            lines.append(
                LogLine(
                    "info",
                    f"Upstream channel {channel.name} endpoint {endpoint.label}: options"
                    f" accepted and not used by this gateway: {', '.join(ignored)}",
                )
            )
    return lines


def _posture(channel: ChannelSpec, nodelay: bool) -> LogLine:
    endpoints = channel.endpoints
    if not channel.is_tls:
        posture = "plaintext HTTP/2 (http; a dev or UAT posture)"
    elif not all(e.tls.verified for e in endpoints):
        posture = f"TLS WITHOUT a verified server ({ALLOW_UNVERIFIED_ENV}=1; a dev or CI posture)"
    elif all(e.tls.client_certificate for e in endpoints):
        posture = "mutual TLS (verify_peer, a CA of its own, a client certificate)"
    else:
        posture = (
            "server-authenticated TLS (verify_peer and a CA of its own, no client certificate;"
            " a server that requires one refuses the gateway)"
        )
    timeout = (
        "infinity" if channel.connect_timeout_ms is None else f"{channel.connect_timeout_ms} ms"
    )
    return LogLine(
        "info",
        f"Upstream channel {channel.name}: {posture} to"
        f" {', '.join(e.label for e in endpoints)}; pool_size {channel.pool_size},"
        f" connect_timeout {timeout}, max_receive_message_bytes"
        f" {channel.max_receive_message_bytes}, TCP_NODELAY {'on' if nodelay else 'off'}",
    )


def _pool_warning(channel: ChannelSpec) -> LogLine:
    return LogLine(
        "warning",
        f"Upstream channel {channel.name} has {channel.connections} connections (pool_size"
        f" {channel.pool_size}, {len(channel.endpoints)} endpoint(s)). The server's stream limit"
        " applies to each connection on its own while the gateway sizes its permits from their"
        " sum, and after a certificate change the connections redial one by one, so some calls"
        " can be refused while others succeed. Keep pool_size 1 and one endpoint"
        f" ({DOCS_REF} 'Keep one upstream connection').",
    )


def check_upstream(config: Config, env: Mapping[str, str]) -> None:
    """The boot entry point: check the resolved configuration, log what the checks say."""
    lines = check_at_boot(
        config[UPSTREAM_CLIENT],
        allow_no_upstream=config[ALLOW_NO_UPSTREAM],
        env=env,
        nodelay=config[UPSTREAM_TCP_NODELAY],
    )
    log_lines(lines)
