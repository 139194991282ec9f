"""The reload of a TLS set (gateway/mgmt/auth/tls_reload.py) on files generated here: what is
loaded, what is refused and told once, the expiry gauge and the counter. What a live listener
then serves is tests/integration/test_tls_reload.py's."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.config.endpoint_options import TlsOptions
from gateway.config.listener_spec import TlsSpec
from gateway.mgmt.auth.tls_reload import (
    LOADED_EXPIRY,
    RELOADS,
    TlsReload,
    TlsSet,
    read_sets,
    reload_families,
)
from gateway.mgmt.auth.watcher import read_file
from gateway.upstream.tls_files import Role
from tests.support.certs import CertAuthority, Leaf


class Files:
    def __init__(self, directory: Path) -> None:
        self.ca = CertAuthority()
        self.ca_path, _ = self.ca.write(directory)
        self.leaf = self.issue("first")
        self.cert = directory / "tls.pem"
        self.key = directory / "tls.key"
        self.write(self.leaf)

    def issue(self, name: str) -> Leaf:
        return self.ca.issue(name, dns=["localhost"])

    def write(self, leaf: Leaf, *, cert: bool = True, key: bool = True) -> None:
        if cert:
            self.cert.write_bytes(leaf.cert_pem)
        if key:
            self.key.write_bytes(leaf.key_pem)


def reloader(tls_set: TlsSet) -> tuple[TlsReload, CollectorRegistry]:
    registry = CollectorRegistry()
    expiry, reloads = reload_families(registry)
    return TlsReload((tls_set,), expiry, reloads), registry


def listener_set(files: Files) -> TlsSet:
    spec = TlsSpec(str(files.cert), str(files.key), str(files.ca_path))
    files_ = ((Role.CERTFILE, spec.certfile), (Role.KEYFILE, spec.keyfile))
    return TlsSet("listener", "mgmt", (*files_, (Role.CACERTFILE, spec.cacertfile)), listener=spec)


def refresh(reload: TlsReload) -> list[tuple[str, str]]:
    lines = reload.apply(read_sets(reload.sets, read_file))
    return [(line.level, line.text) for line in lines]


def upstream_set(files: Files) -> TlsSet:
    tls = TlsOptions(
        cacertfile=str(files.ca_path),
        certfile=str(files.cert),
        keyfile=str(files.key),
        verify="verify_peer",
    )
    paths = ((Role.CERTFILE, str(files.cert)), (Role.KEYFILE, str(files.key)))
    return TlsSet("upstream", "yuzu", (*paths, (Role.CACERTFILE, str(files.ca_path))), upstream=tls)


def sample(registry: CollectorRegistry, family: str, **labels: str) -> float | None:
    return registry.get_sample_value(family, labels)


def test_a_complete_renewal_is_loaded_and_its_expiry_shown(tmp_path: Path) -> None:
    files = Files(tmp_path)
    tls_set = upstream_set(files)
    reload, registry = reloader(tls_set)
    reload.first(read_sets(reload.sets, read_file))
    labels = {"kind": "upstream", "name": "yuzu"}
    assert sample(registry, LOADED_EXPIRY, **labels) == (
        files.leaf.cert.not_valid_after_utc.timestamp()
    )
    assert refresh(reload) == []  # nothing changed
    renewed = files.ca.issue(
        "renewed",
        dns=["localhost"],
        not_after=files.leaf.cert.not_valid_after_utc.replace(year=2027),
    )
    files.write(renewed)
    [(level, message)] = refresh(reload)
    assert level == "info" and message.startswith("upstream channel yuzu: renewed certificate")
    assert sample(registry, LOADED_EXPIRY, **labels) == (
        renewed.cert.not_valid_after_utc.timestamp()
    )
    assert sample(registry, RELOADS, **labels, result="loaded") == 1
    assert refresh(reload) == []


def test_a_key_that_does_not_match_is_refused_once_and_the_completed_set_loads(
    tmp_path: Path,
) -> None:
    files = Files(tmp_path)
    reload, registry = reloader(listener_set(files))
    reload.first(read_sets(reload.sets, read_file))
    before = sample(registry, LOADED_EXPIRY, kind="listener", name="mgmt")
    renewed = files.issue("renewed")
    files.write(renewed, key=False)  # the certificate first, the key not yet
    [(level, message)] = refresh(reload)
    assert level == "warning"
    assert message == (
        f"gRPC listener mgmt: certificate reload refused, certfile {files.cert} does not go with"
        " its keyfile or CA file (KEY_VALUES_MISMATCH); the certificate loaded before stays in use"
    )
    assert refresh(reload) == []  # the same broken set: told once
    assert sample(registry, LOADED_EXPIRY, kind="listener", name="mgmt") == before
    files.write(renewed, cert=False)
    [(level, _)] = refresh(reload)
    assert level == "info"


def test_an_unreadable_key_is_named_by_its_role_only(tmp_path: Path) -> None:
    files = Files(tmp_path)
    reload, registry = reloader(listener_set(files))
    reload.first(read_sets(reload.sets, read_file))
    files.key.unlink()
    [(level, message)] = refresh(reload)
    assert level == "warning" and "keyfile cannot be read (No such file or directory)" in message
    assert str(files.key) not in message
    assert refresh(reload) == []
    assert sample(registry, RELOADS, kind="listener", name="mgmt", result="refused") == 1
    # Back to the bytes loaded: nothing to load, and a later breakage is told again.
    files.write(files.leaf, cert=False)
    assert refresh(reload) == []
    files.cert.write_text("-----BEGIN CERTIFICATE-----\nnot base64!\n")
    [(level, message)] = refresh(reload)
    assert level == "warning" and f"certfile {files.cert}" in message
