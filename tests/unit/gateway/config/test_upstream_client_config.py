"""`upstream_client`: parsing, every boot refusal, every bad-value warning, the boot checks."""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

import pytest

from gateway.config.keys import upstream
from gateway.config.loader import PROJECT_ROOT, load_config
from gateway.config.refusal import BootRefused
from gateway.config.terms import parse_term
from gateway.config.upstream_client import (
    CONNECT_TIMEOUT_MS_DEFAULT,
    MAX_RECEIVE_DEFAULT,
    ClientSpec,
    parse_client_config,
)
from gateway.node.boot import prepare
from gateway.upstream import tls_files
from gateway.upstream.boot_check import (
    ALLOW_UNVERIFIED_ENV,
    NO_DEFAULT_CHANNEL,
    UNUSABLE_UPSTREAM_TLS_FILE,
    UNVERIFIED_UPSTREAM_TLS,
    check_at_boot,
)
from gateway.upstream.tls_context import build_context, server_hostname
from tests.support.certs import write_pki
from tests.support.node import node_env

SEED_EXAMPLE = """#{channels => [
    {default_channel,
     [{https, "yuzu-server.example.com", 50055, [
          {cacertfile, "/etc/yuzu/certs/default-ca.pem"},
          {certfile,   "/etc/yuzu/certs/default-gateway.pem"},
          {keyfile,    "/etc/yuzu/certs/default-gateway.key"},
          {verify, verify_peer}]}],
     #{pool_size => 1}}
]}."""

DOC = "(docs/upstream-channel.md 'Bad values replaced by defaults')."


def parse(text: str) -> ClientSpec:
    spec = parse_client_config(parse_term(text if text.endswith(".") else text + "."))
    assert spec is not None
    return spec


def channel_term(endpoints: str, options: str = "#{}", name: str = "default_channel") -> str:
    return f"#{{channels => [{{{name}, [{endpoints}], {options}}}]}}"


def http(options: str = "#{}") -> ClientSpec:
    return parse(channel_term('{http, "127.0.0.1", 50055, []}', options))


def refusal(text: str) -> BootRefused:
    with pytest.raises(BootRefused) as caught:
        parse_client_config(parse_term(text + "."))
    return caught.value


def check(spec: ClientSpec | None, *, allow: bool = False, env: dict[str, str] | None = None):
    return check_at_boot(spec, allow_no_upstream=allow, env=env or {})


def texts(lines, level: str) -> list[str]:
    return [line.text for line in lines if line.level == level]


# -- parsing ------------------------------------------------------------------------------------


def test_the_seed_example_parses() -> None:
    spec = parse(SEED_EXAMPLE)
    [channel] = spec.channels
    assert channel.name == "default_channel"
    assert spec.channel("default_channel") is channel
    assert (channel.pool_size, channel.connect_timeout_ms) == (1, 5000)
    assert channel.max_receive_message_bytes == MAX_RECEIVE_DEFAULT
    [endpoint] = channel.endpoints
    assert (endpoint.scheme, endpoint.host, endpoint.port) == (
        "https",
        "yuzu-server.example.com",
        50055,
    )
    assert endpoint.label == "yuzu-server.example.com:50055"
    assert endpoint.tls.verified and endpoint.tls.client_certificate
    assert endpoint.tls.files() == [
        ("cacertfile", "/etc/yuzu/certs/default-ca.pem"),
        ("certfile", "/etc/yuzu/certs/default-gateway.pem"),
        ("keyfile", "/etc/yuzu/certs/default-gateway.key"),
    ]
    assert channel.notes == ()


def test_undefined_means_no_client_and_is_the_default() -> None:
    assert parse_client_config(parse_term("undefined.")) is None
    assert upstream.UPSTREAM_CLIENT.default_value is None


def test_defaults_and_accepted_option_forms() -> None:
    spec = parse(
        channel_term(
            '{http, <<"gw.example">>, 1, []}, {http, localhost, 65535, [], #{}},'
            " {http, {10,0,0,1}, 2, []}",
            "#{connect_timeout => infinity, max_receive_message_bytes => 1024, pool_size => 64}",
        )
    )
    [channel] = spec.channels
    assert [e.host for e in channel.endpoints] == ["gw.example", "localhost", "10.0.0.1"]
    assert (channel.pool_size, channel.connect_timeout_ms, channel.connect_timeout_s) == (
        64,
        None,
        None,
    )
    assert channel.max_receive_message_bytes == 1024
    assert channel.connections == 192
    assert http().channels[0].connect_timeout_s == CONNECT_TIMEOUT_MS_DEFAULT / 1000


def test_ssl_options_mapped_and_unknown_ones_named() -> None:
    spec = parse(
        channel_term(
            '{https, "h", 1, [{verify, verify_peer}, {cacerts, [<<1,2>>]}, {depth, 3},'
            ' {server_name_indication, "srv.example"}, {password, "s3cret"},'
            " {versions, ['tlsv1.3']}, {cacertfile, \"/second/is/ignored\"}, reuse_sessions,"
            ' {cacertfile, "/x"}]}'
        )
    )
    tls = spec.channels[0].endpoints[0].tls
    assert tls.cacerts == (b"\x01\x02",)
    assert tls.verified and not tls.client_certificate
    assert tls.server_name == "srv.example"
    assert tls.versions == (ssl.TLSVersion.TLSv1_3,)
    assert tls.cacertfile == "/second/is/ignored"  # the first occurrence wins, as proplists
    assert tls.ignored == ("depth", "reuse_sessions")
    assert "s3cret" not in repr(tls)
    lines = check(spec)
    [note] = [t for t in texts(lines, "info") if "not used" in t]
    assert "depth, reuse_sessions" in note and "s3cret" not in note


def test_socket_options() -> None:
    spec = parse(
        channel_term(
            '{http, "::1", 1, [], #{socket_options => [inet6, {nodelay, false},'
            " {keepalive, true}, {recbuf, 65536}, {sndbuf, 4096}, binary, {active, once}]}}"
        )
    )
    options = spec.channels[0].endpoints[0].socket
    assert options.inet6 and options.nodelay is False and options.keepalive
    assert (options.recbuf, options.sndbuf) == (65536, 4096)
    assert options.ignored == ("binary", "active")


def test_ipv6_literals_are_not_refused() -> None:
    # The seed: they fail name resolution at each dial unless inet6 is given; not a refusal.
    hosts = [
        e.host
        for e in parse(channel_term('{http, "::1", 1, []}, {http, "[::1]", 1, []}'))
        .channels[0]
        .endpoints
    ]
    assert hosts == ["::1", "[::1]"]


def test_two_channels_and_the_lookup() -> None:
    spec = parse(
        '#{channels => [{default_channel, [{http, "a", 1, []}], #{}},'
        ' {other, [{https, "b", 2, [{verify, verify_peer}, {cacertfile, "/ca"}]}], #{}}]}'
    )
    assert [c.name for c in spec.channels] == ["default_channel", "other"]
    assert spec.channel("other").is_tls and not spec.channel("default_channel").is_tls
    assert spec.channel("nope") is None


# -- refusals: the shape of the first defect, never the value -----------------------------------

REFUSALS = [
    ("bad_client_config", "[{channels, []}]"),
    ("bad_client_config", "#{}"),
    ("bad_client_config", "#{channels => #{}}"),
    ("bad_client_config", "#{channels => [], pool_size => 1}"),
    ("bad_channel", "#{channels => [{default_channel, []}]}"),
    ("bad_channel", '#{channels => [{"default_channel", [{http, "h", 1, []}], #{}}]}'),
    ("bad_channel", "#{channels => [{default_channel, [], #{}}]}"),
    ("bad_channel", '#{channels => [{default_channel, {http, "h", 1, []}, #{}}]}'),
    ("bad_channel", '#{channels => [{default_channel, [{http, "h", 1, []}], [{pool_size, 1}]}]}'),
    (
        "bad_channel",
        '#{channels => [{c, [{http, "h", 1, []}], #{}}, {c, [{http, "h", 2, []}], #{}}]}',
    ),
    ("bad_endpoint", channel_term('{http, "h", 1}')),
    ("bad_endpoint", channel_term('{http, "h", 1, [], #{}, extra}')),
    ("bad_endpoint", channel_term('"http://h:1"')),
    ("bad_endpoint", channel_term('{grpc, "h", 1, []}')),
    ("bad_endpoint", channel_term('{http, "h", 0, []}')),
    ("bad_endpoint", channel_term('{http, "h", 65536, []}')),
    ("bad_endpoint", channel_term('{http, "h", "50055", []}')),
    ("bad_endpoint", channel_term('{https, "h", 1, #{verify => verify_peer}}')),
    ("bad_endpoint", channel_term('{https, "h", 1, [{verify, verify_peer, extra}]}')),
    ("bad_endpoint", channel_term('{https, "h", 1, [{verify, yes}]}')),
    ("bad_endpoint", channel_term('{https, "h", 1, [{cacertfile, 42}]}')),
    ("bad_endpoint", channel_term('{https, "h", 1, [{cacerts, ["not binary"]}]}')),
    ("bad_endpoint", channel_term("{https, \"h\", 1, [{versions, ['tlsv1.1']}]}")),
    ("bad_endpoint", channel_term('{http, "h", 1, [], [{socket_options, []}]}')),
    ("bad_endpoint", channel_term('{http, "h", 1, [], #{socket_opts => []}}')),
    ("bad_host", channel_term("{http, 42, 1, []}")),
    ("bad_host", channel_term('{http, "", 1, []}')),
    ("bad_host", channel_term('{http, "a host", 1, []}')),
    ("bad_host", channel_term('{http, "a,b", 1, []}')),
    ("bad_host", channel_term("{http, {256,0,0,1}, 1, []}")),
    ("bad_socket_options", channel_term('{http, "h", 1, [], #{socket_options => nodelay}}')),
    ("bad_socket_options", channel_term('{http, "h", 1, [], #{socket_options => ["x"]}}')),
    ("bad_socket_options", channel_term('{http, "h", 1, [], #{socket_options => [{nodelay, 1}]}}')),
    ("bad_socket_options", channel_term('{http, "h", 1, [], #{socket_options => [{recbuf, -1}]}}')),
    ("mixed_upstream_endpoints", channel_term('{http, "a", 1, []}, {https, "b", 2, []}')),
]


@pytest.mark.parametrize(("defect", "text"), REFUSALS)
def test_every_shape_defect_is_refused_by_name(defect: str, text: str) -> None:
    assert refusal(text).defect == defect


def test_a_refusal_never_prints_the_value() -> None:
    secret = "/etc/yuzu/very-secret-key-path.key"
    for text in (
        channel_term(f'{{https, "h", 1, [{{keyfile, "{secret}"}}, {{verify, perhaps}}]}}'),
        channel_term(f'{{https, "h", 1, [{{keyfile, "{secret}"}}, bad, "x"]}}'),
        channel_term(f'{{http, "{secret} x", 1, []}}'),
        f'#{{channels => [{{default_channel, [{{http, "h", 1, ["{secret}"]}}], #{{}}, x}}]}}',
    ):
        problem = refusal(text)
        assert secret not in problem.log_line()
        assert "very-secret" not in problem.log_line()


def test_mixed_endpoints_text_is_the_seeds() -> None:
    problem = refusal(channel_term('{http, "a", 1, []}, {https, "b", 2, []}'))
    assert problem.log_line().startswith(
        "Refusing to start: mixed_upstream_endpoints: the upstream channel default_channel lists"
        " both plaintext (http) and TLS (https) endpoints"
    )


# -- bad values replaced by defaults ------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "written", "shown", "expected", "default"),
    [
        ("pool_size", "100", "100", "an integer from 1 to 64", "1"),
        ("pool_size", "0", "0", "an integer from 1 to 64", "1"),
        ("pool_size", '"4"', "a list", "an integer from 1 to 64", "1"),
        ("pool_size", "2.0", "a float", "an integer from 1 to 64", "1"),
        ("pool_size", "true", "true", "an integer from 1 to 64", "1"),
        ("pool_size", "lots", "lots", "an integer from 1 to 64", "1"),
        (
            "connect_timeout",
            "forever",
            "forever",
            "an integer from 1 to 3600000 or infinity",
            "5000",
        ),
        ("connect_timeout", "-5", "-5", "an integer from 1 to 3600000 or infinity", "5000"),
        (
            "connect_timeout",
            '<<"5s">>',
            "a binary",
            "an integer from 1 to 3600000 or infinity",
            "5000",
        ),
        (
            "max_receive_message_bytes",
            "#{}",
            "a map",
            "an integer from 1 to 2147483647",
            "4194304",
        ),
        (
            "max_receive_message_bytes",
            "{4, mb}",
            "a tuple",
            "an integer from 1 to 2147483647",
            "4194304",
        ),
    ],
)
def test_a_bad_value_is_replaced_with_the_seeds_warning(
    option: str, written: str, shown: str, expected: str, default: str
) -> None:
    spec = http(f"#{{{option} => {written}}}")
    [channel] = spec.channels
    assert (channel.pool_size, channel.connect_timeout_ms, channel.max_receive_message_bytes) == (
        1,
        5000,
        MAX_RECEIVE_DEFAULT,
    )
    [note] = channel.notes
    assert note.level == "warning"
    assert note.text == (
        f"Upstream channel default_channel: {option} is {shown}, not {expected}; the default"
        f" {default} is used instead {DOC}"
    )


def test_the_seeds_example_line_word_for_word() -> None:
    [note] = http("#{pool_size => 100}").channels[0].notes
    assert note.text == (
        "Upstream channel default_channel: pool_size is 100, not an integer from 1 to 64; the"
        f" default 1 is used instead {DOC}"
    )


def test_one_warning_per_bad_option_and_they_reach_the_boot_log() -> None:
    spec = http("#{pool_size => 100, connect_timeout => x, max_receive_message_bytes => 0}")
    assert len(spec.channels[0].notes) == 3
    warnings = texts(check(spec), "warning")
    assert sum("is used instead" in t for t in warnings) == 3


def test_grpcbox_options_are_accepted_and_ignored_unknown_ones_silently() -> None:
    [channel] = http("#{balancer => round_robin, encoding => gzip, sync_start => true}").channels
    [note] = channel.notes
    assert note.level == "info"
    assert "balancer, encoding, sync_start" in note.text
    # A misspelt option is not a bad value: it is simply not read, and nothing is logged.
    assert http("#{poolsize => 100}").channels[0].notes == ()


# -- boot checks --------------------------------------------------------------------------------


def test_no_default_channel_is_refused_unless_acknowledged() -> None:
    other = parse(channel_term('{http, "h", 1, []}', name="other"))
    for spec in (None, other, parse("#{channels => []}")):
        with pytest.raises(BootRefused) as caught:
            check(spec)
        assert caught.value.defect == NO_DEFAULT_CHANNEL
        [warning] = texts(check(spec, allow=True), "warning")
        assert "allow_no_upstream is true" in warning


def https(options: str) -> str:
    return f'{{https, "gw.example", 50055, [{options}]}}'


@pytest.mark.parametrize(
    "options",
    [
        '{cacertfile, "/ca.pem"}',  # no verify
        '{verify, verify_none}, {cacertfile, "/ca.pem"}',
        "{verify, verify_peer}",  # no CA of its own: the OS store would trust anyone public
    ],
)
def test_unverified_https_is_refused(options: str) -> None:
    spec = parse(channel_term(https(options)))
    with pytest.raises(BootRefused) as caught:
        check(spec, env={ALLOW_UNVERIFIED_ENV: "yes"})
    assert caught.value.defect == UNVERIFIED_UPSTREAM_TLS
    assert (
        "the upstream channel uses TLS (https) WITHOUT {verify,verify_peer} and a"
        " {cacertfile,...} of its own" in caught.value.log_line()
    )


def test_one_verified_endpoint_does_not_excuse_another(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    good = https(f'{{verify, verify_peer}}, {{cacertfile, "{ca}"}}')
    spec = parse(channel_term(f"{good}, {https('{verify, verify_none}')}"))
    with pytest.raises(BootRefused) as caught:
        check(spec)
    assert caught.value.defect == UNVERIFIED_UPSTREAM_TLS
    assert "endpoint #2" in caught.value.detail


def test_the_dev_override_turns_the_refusal_into_a_warning() -> None:
    spec = parse(channel_term(https("{verify, verify_none}")))
    lines = check(spec, env={ALLOW_UNVERIFIED_ENV: "1"})
    assert any(
        t.startswith(f"{ALLOW_UNVERIFIED_ENV}=1: the upstream channel uses TLS")
        for t in texts(lines, "warning")
    )
    assert any("TLS WITHOUT a verified server" in t for t in texts(lines, "info"))


def verified(tmp_path: Path, *, ca: Path, cert: Path | None = None, key: Path | None = None):
    options = f'{{verify, verify_peer}}, {{cacertfile, "{ca}"}}'
    if cert is not None:
        options += f', {{certfile, "{cert}"}}'
    if key is not None:
        options += f', {{keyfile, "{key}"}}'
    return parse(channel_term(https(options)))


def test_a_directory_where_a_tls_file_belongs_refuses_boot(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)
    directory = tmp_path / "ca.pem.d"
    directory.mkdir()
    for field in ("ca", "cert", "key"):
        files = {"ca": pki.ca_cert_path, "cert": pki.client.cert_path, "key": pki.client.key_path}
        files[field] = directory
        with pytest.raises(BootRefused) as caught:
            check(verified(tmp_path, **files))
        assert caught.value.defect == UNUSABLE_UPSTREAM_TLS_FILE
        line = caught.value.log_line()
        assert "a TLS file of an upstream endpoint is a directory or not a regular file" in line
        assert "is a directory, not a file" in line
        if field == "key":
            assert str(directory) not in line  # a keyfile's path is never printed
        else:
            assert str(directory) in line


def test_a_fifo_where_a_tls_file_belongs_refuses_boot(tmp_path: Path) -> None:
    fifo = tmp_path / "ca.fifo"
    os.mkfifo(fifo)
    with pytest.raises(BootRefused) as caught:
        check(verified(tmp_path, ca=fifo))
    assert caught.value.defect == UNUSABLE_UPSTREAM_TLS_FILE
    assert "is not a regular file" in caught.value.detail


def test_missing_empty_or_pem_less_files_warn_once_each_and_boot(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a certificate\n")
    key_without_key = tmp_path / "client.key"
    key_without_key.write_bytes(write_pki(tmp_path / "pki").ca_cert_pem)  # a cert, no key
    spec = verified(tmp_path, ca=tmp_path / "missing-ca.pem", cert=empty, key=key_without_key)
    warnings = texts(check(spec), "warning")
    assert warnings == [
        f"Upstream channel default_channel endpoint gw.example:50055: cacertfile"
        f" {tmp_path / 'missing-ca.pem'} does not exist (yet). Every connection to it fails until"
        " this is fixed. The gateway starts anyway: the server may create its certificates after"
        " the gateway starts, and the channel keeps retrying.",
        f"Upstream channel default_channel endpoint gw.example:50055: certfile {empty} is empty."
        " Every connection to it fails until this is fixed. The gateway starts anyway: the"
        " server may create its certificates after the gateway starts, and the channel keeps"
        " retrying.",
        "Upstream channel default_channel endpoint gw.example:50055: keyfile contains no PEM"
        " private key. Every connection to it fails until this is fixed. The gateway starts"
        " anyway: the server may create its certificates after the gateway starts, and the"
        " channel keeps retrying.",
    ]
    assert str(key_without_key) not in " ".join(warnings)
    spec = verified(tmp_path, ca=garbage)
    [warning] = texts(check(spec), "warning")
    assert f"cacertfile {garbage} contains no PEM certificate." in warning


def test_the_file_reasons(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)
    role = tls_files.Role
    assert tls_files.content_problem(role.CACERTFILE, str(pki.ca_cert_path)) is None
    assert tls_files.content_problem(role.KEYFILE, str(pki.client.key_path)) is None
    assert tls_files.content_problem(role.KEYFILE, str(pki.ca_cert_path)) == (
        "contains no PEM private key"
    )
    assert tls_files.content_problem(role.CERTFILE, str(pki.client.key_path)) == (
        "contains no PEM certificate"
    )
    assert tls_files.content_problem(role.CERTFILE, str(tmp_path / "x" / "y")) == (
        "does not exist (yet)"
    )
    through_a_file = str(pki.ca_cert_path / "child")
    assert tls_files.content_problem(role.CERTFILE, through_a_file) == "does not exist (yet)"
    assert tls_files.content_problem(role.CERTFILE, str(tmp_path)) == "is a directory, not a file"
    broken = tmp_path / "broken.pem"
    broken.write_bytes(b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n")
    assert tls_files.content_problem(role.CERTFILE, str(broken)) == "contains no PEM certificate"
    assert tls_files.describe(role.KEYFILE, "/k", "is empty") == "keyfile is empty"
    assert tls_files.describe(role.CERTFILE, "/c", "is empty") == "certfile /c is empty"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)
    pki.ca_cert_path.chmod(0)
    reason = tls_files.content_problem(tls_files.Role.CACERTFILE, str(pki.ca_cert_path))
    assert reason == "cannot be read (permission denied)"


def test_the_posture_lines(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)
    mutual = verified(
        tmp_path, ca=pki.ca_cert_path, cert=pki.client.cert_path, key=pki.client.key_path
    )
    [line] = texts(check(mutual), "info")
    assert line.startswith("Upstream channel default_channel: mutual TLS")
    assert "pool_size 1, connect_timeout 5000 ms" in line and "TCP_NODELAY on" in line
    assert texts(check(mutual), "warning") == []  # files fine, one connection
    [line] = texts(check(verified(tmp_path, ca=pki.ca_cert_path)), "info")
    assert "server-authenticated TLS" in line
    [line] = texts(check_at_boot(http(), allow_no_upstream=False, env={}, nodelay=False), "info")
    assert "plaintext HTTP/2" in line and "TCP_NODELAY off" in line


@pytest.mark.parametrize(
    ("endpoints", "options"),
    [
        ('{http, "h", 1, []}', "#{pool_size => 2}"),
        ('{http, "a", 1, []}, {http, "b", 1, []}', "#{}"),
    ],
)
def test_more_than_one_connection_warns(endpoints: str, options: str) -> None:
    [warning] = texts(check(parse(channel_term(endpoints, options))), "warning")
    assert "Keep pool_size 1 and one endpoint" in warning
    assert "has 2 connections" in warning


# -- the shipped files and the boot path ----------------------------------------------------------

SYS_CONFIG = PROJECT_ROOT / "sys_config"


def test_the_shipped_prod_config_is_mutual_tls_and_boots_refusal_free() -> None:
    config = load_config(SYS_CONFIG / "sys.config.prod", {})
    spec = config[upstream.UPSTREAM_CLIENT]
    channel = spec.channel("default_channel")
    assert channel is not None and channel.pool_size == 1
    [endpoint] = channel.endpoints
    assert endpoint.is_tls and endpoint.tls.verified and endpoint.tls.client_certificate
    assert not config[upstream.ALLOW_NO_UPSTREAM]
    lines = check_at_boot(spec, allow_no_upstream=False, env={})  # no refusal
    assert "mutual TLS" in texts(lines, "info")[0]
    # Where the files do not exist (this machine), one WARNING each, and no keyfile path.
    warnings = texts(lines, "warning")
    if not Path(endpoint.tls.cacertfile).exists():
        assert len(warnings) == 3
    assert all("default-gateway.key" not in w for w in warnings)


def test_the_dev_config_boots_without_a_channel_and_shows_an_example() -> None:
    config = load_config(SYS_CONFIG / "sys.config", {})
    assert config[upstream.UPSTREAM_CLIENT] is None and config[upstream.ALLOW_NO_UPSTREAM]
    text = (SYS_CONFIG / "sys.config").read_text()
    assert "%% {upstream_client, #{channels => [" in text
    # The commented example, uncommented, is a valid refusal-free channel.
    example = "\n".join(
        line.strip().removeprefix("%%").strip()
        for line in text.splitlines()
        if line.strip().startswith("%%")
        and ("channels" in line or "default_channel" in line or line.strip() == "%% ]}},")
    )
    entry = parse_term(example[example.index("{") : example.rindex("}") + 1] + ".")
    spec = parse_client_config(entry[1])
    assert texts(check(spec), "warning") == []


def write_config(tmp_path: Path, upstream_entry: str, extra: str = "") -> Path:
    path = tmp_path / "gw.config"
    path.write_text(
        "[{yuzu_gw, [{health_port, 0}, {prometheus_port, 0}, {allow_no_listeners, true}"
        f"{extra},"
        f" {{upstream_client, {upstream_entry}}}]}}].",
        encoding="utf-8",
    )
    return path


def test_refusals_reach_the_boot_path(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    no_default = write_config(tmp_path, channel_term('{http, "h", 1, []}', name="other"))
    with pytest.raises(BootRefused) as caught:
        prepare(node_env(tmp_path, config=no_default))
    assert caught.value.defect == NO_DEFAULT_CHANNEL
    acknowledged = write_config(
        tmp_path, channel_term('{http, "h", 1, []}', name="other"), ", {allow_no_upstream, true}"
    )
    prepare(node_env(tmp_path, config=acknowledged))
    assert any("allow_no_upstream is true" in r.getMessage() for r in caplog.records)
    bad = write_config(tmp_path, channel_term('{http, "h", 1, []}', "#{pool_size => 100}"))
    caplog.clear()
    prepare(node_env(tmp_path, config=bad))
    [warning] = [r for r in caplog.records if "pool_size is 100" in r.getMessage()]
    assert warning.levelno == logging.WARNING and warning.name == "yuzu_gw.upstream"
    shape = write_config(tmp_path, channel_term('{http, "h", 1}'))
    with pytest.raises(BootRefused) as caught:
        prepare(node_env(tmp_path, config=shape))
    assert caught.value.defect == "bad_endpoint"


def test_a_leftover_grpcbox_client_block_is_refused_by_the_loader(tmp_path: Path) -> None:
    path = tmp_path / "gw.config"
    path.write_text(
        "[{yuzu_gw, [{allow_no_upstream, true}]},"
        ' {grpcbox, [{client, #{channels => [{default_channel, [{http, "h", 1, []}], #{}}]}}]}].'
    )
    with pytest.raises(BootRefused) as caught:
        load_config(path, {})
    assert caught.value.defect == "legacy_grpcbox_config"


# -- the SSL context built from the options -------------------------------------------------------


def test_the_ssl_context_follows_the_options(tmp_path: Path) -> None:
    pki = write_pki(tmp_path)
    spec = verified(
        tmp_path, ca=pki.ca_cert_path, cert=pki.client.cert_path, key=pki.client.key_path
    )
    tls = spec.channels[0].endpoints[0].tls
    context = build_context(tls)
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert server_hostname(tls, "gw.example") == "gw.example"
    unverified = parse(
        channel_term(https("{verify, verify_none}, {server_name_indication, disable}"))
    )
    tls = unverified.channels[0].endpoints[0].tls
    context = build_context(tls)
    assert context.verify_mode is ssl.CERT_NONE and not context.check_hostname
    assert server_hostname(tls, "gw.example") is None
    missing = verified(tmp_path, ca=tmp_path / "nope.pem")
    with pytest.raises(OSError):
        build_context(missing.channels[0].endpoints[0].tls)
