"""The cluster links' TLS contexts and refusals (gateway/config/cluster_tls.py) and the keys'
boot check (gateway/config/keys/cluster.py)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from gateway.config.cluster_tls import (
    INCOMPLETE,
    UNUSABLE,
    ClusterTls,
    check_complete,
    link_contexts,
)
from gateway.config.keys import cluster
from gateway.config.loader import load_config
from gateway.config.refusal import BootRefused
from tests.support.certs import CertAuthority


@pytest.fixture
def files(tmp_path: Path) -> ClusterTls:
    ca = CertAuthority()
    ca_path, _ = ca.write(tmp_path)
    leaf = ca.issue("node").write(tmp_path, "node")
    return ClusterTls(str(leaf.cert_path), str(leaf.key_path), str(ca_path))


def test_no_file_is_the_plaintext_posture() -> None:
    assert link_contexts(ClusterTls(None, None, None)) is None


def test_both_contexts_require_the_peers_certificate_and_skip_the_host_name(
    files: ClusterTls,
) -> None:
    contexts = link_contexts(files)
    assert contexts is not None
    for context in (contexts.server, contexts.client):
        assert context.verify_mode is ssl.CERT_REQUIRED
        assert not context.check_hostname
        assert context.minimum_version is ssl.TLSVersion.TLSv1_2
        assert context.get_ca_certs()  # the install CA is the trust store
    assert contexts.server.protocol is ssl.PROTOCOL_TLS_SERVER
    assert contexts.client.protocol is ssl.PROTOCOL_TLS_CLIENT


@pytest.mark.parametrize(
    ("drop", "named"),
    [
        ("certfile", "cluster_tls_certfile"),
        ("keyfile", "cluster_tls_keyfile"),
        ("cacertfile", "cluster_tls_cacertfile"),
    ],
)
def test_some_but_not_all_files_refuse_incomplete(files: ClusterTls, drop: str, named: str) -> None:
    partial = ClusterTls(**{**_fields(files), drop: None})
    with pytest.raises(BootRefused) as refused:
        check_complete(partial)
    assert refused.value.term == INCOMPLETE and named in refused.value.detail
    with pytest.raises(BootRefused):
        link_contexts(partial)


def test_an_unreadable_certificate_refuses_naming_it_but_never_the_key(
    files: ClusterTls, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.pem"
    broken.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
    with pytest.raises(BootRefused) as refused:
        link_contexts(ClusterTls(str(broken), files.keyfile, files.cacertfile))
    assert refused.value.term == f"{{{UNUSABLE},certfile}}"
    assert str(broken) in refused.value.detail
    assert str(files.keyfile) not in refused.value.detail


def test_a_key_that_does_not_match_refuses_as_the_certificate(
    files: ClusterTls, tmp_path: Path
) -> None:
    other = CertAuthority().issue("other").write(tmp_path, "other")
    with pytest.raises(BootRefused) as refused:
        link_contexts(ClusterTls(files.certfile, str(other.key_path), files.cacertfile))
    assert refused.value.term == f"{{{UNUSABLE},certfile}}"
    assert str(other.key_path) not in refused.value.detail


def test_a_missing_or_empty_ca_refuses_naming_it(files: ClusterTls, tmp_path: Path) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    for path in (tmp_path / "absent.pem", empty):
        with pytest.raises(BootRefused) as refused:
            link_contexts(ClusterTls(files.certfile, files.keyfile, str(path)))
        assert refused.value.term == f"{{{UNUSABLE},cacertfile}}"
        assert str(path) in refused.value.detail


def test_the_config_check_refuses_an_incomplete_set_and_reads_no_file(tmp_path: Path) -> None:
    config = tmp_path / "sys.config"
    config.write_text(
        "[{yuzu_gw, [{allow_no_listeners, true},"
        ' {cluster_tls_certfile, "/nonexistent/node.pem"}]}].\n',
        encoding="utf-8",
    )
    with pytest.raises(BootRefused) as refused:
        load_config(config, {})
    assert refused.value.term == INCOMPLETE
    complete = tmp_path / "complete.config"
    complete.write_text(
        "[{yuzu_gw, [{allow_no_listeners, true},"
        ' {cluster_tls_certfile, "/nonexistent/node.pem"},'
        ' {cluster_tls_keyfile, "/nonexistent/node.key"},'
        ' {cluster_tls_cacertfile, "/nonexistent/ca.pem"}]}].\n',
        encoding="utf-8",
    )
    # The files are read when the cluster child starts, not here (a restart reads them again).
    loaded = load_config(complete, {})
    assert not cluster.cluster_tls(loaded).plaintext


def test_a_path_that_is_not_text_refuses(tmp_path: Path) -> None:
    config = tmp_path / "sys.config"
    config.write_text(
        "[{yuzu_gw, [{allow_no_listeners, true}, {cluster_tls_certfile, 42}]}].\n",
        encoding="utf-8",
    )
    with pytest.raises(BootRefused) as refused:
        load_config(config, {})
    assert refused.value.term == "invalid_cluster_tls_certfile"


def test_the_production_config_runs_the_links_over_tls_and_the_dev_one_does_not() -> None:
    root = Path(__file__).resolve().parents[4] / "sys_config"
    prod = cluster.cluster_tls(load_config(root / "sys.config.prod", {}))
    assert (prod.certfile, prod.keyfile, prod.cacertfile) == (
        "/etc/yuzu/certs/default-gateway.pem",
        "/etc/yuzu/certs/default-gateway.key",
        "/etc/yuzu/certs/default-ca.pem",
    )
    assert cluster.cluster_tls(load_config(root / "sys.config", {})).plaintext
    assert cluster.cluster_tls(load_config(root / "test.config", {})).plaintext


def _fields(files: ClusterTls) -> dict[str, str | None]:
    return {"certfile": files.certfile, "keyfile": files.keyfile, "cacertfile": files.cacertfile}
