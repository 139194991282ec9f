"""Certificate reload without a restart (docs/tls.md "Certificate reload").

The certificate watcher (watcher.py) reads, on every refresh, the certificate, key and CA file
of each TLS listener and of each upstream endpoint, and hands the bytes here:

- a set whose bytes are those already loaded (or already refused) does nothing;
- a changed set is first loaded, from private copies of exactly the bytes read, into a
  scratch context; only when that succeeds (every file readable, the key matching the
  certificate, the CA file PEM) are the same copies loaded into the listener's live context:
  new handshakes present the new certificate, established connections keep theirs;
- a set that fails changes nothing and logs one WARNING naming the file (a key file by its
  role only: the logs never carry a key's path); the same broken bytes are not retried, a
  further change is;
- `yuzu_gw_tls_loaded_cert_expiry_timestamp_seconds{kind,name}` is the earliest notAfter of
  the certificate chain loaded (kind `listener`: the listener's name; `upstream`: the channel's).

An upstream endpoint builds its context at each dial (gateway/upstream/tls_context.py), so a
validated set is what the next dial presents; there is no live context to load into.

The reads happen in the watcher's worker thread (`read_sets`); `apply` runs on the loop, the
only thread that uses a listener's context.
"""

from __future__ import annotations

import contextlib
import hashlib
import ssl
import tempfile
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import attrs
from prometheus_client import CollectorRegistry, Counter, Gauge

from actors.core import LogLine
from gateway.config.certs import PemError, certificates, earliest_not_after
from gateway.config.config import Config
from gateway.config.endpoint_options import TlsOptions
from gateway.config.keys.listeners import GRPC_LISTENERS
from gateway.config.keys.upstream import UPSTREAM_CLIENT
from gateway.config.listener_spec import TlsSpec
from gateway.listeners.tls import TlsFilesUnusable, build_server_context, reload_live
from gateway.upstream.tls_context import build_context
from gateway.upstream.tls_files import Role, content_problem, describe

__all__ = [
    "LOADED_EXPIRY",
    "RELOADS",
    "TlsReload",
    "TlsSet",
    "read_sets",
    "reload_families",
    "tls_sets",
]

LOADED_EXPIRY = "yuzu_gw_tls_loaded_cert_expiry_timestamp_seconds"
RELOADS = "yuzu_gw_tls_reloads_total"

Kind = Literal["listener", "upstream"]


@attrs.frozen
class TlsSet:
    """The files one context is loaded from: a listener's (`listener` set) or an upstream
    endpoint's (`upstream` set)."""

    kind: Kind
    name: str
    files: tuple[tuple[Role, str], ...]
    listener: TlsSpec | None = None
    upstream: TlsOptions | None = None

    def where(self) -> str:
        if self.kind == "listener":
            return f"gRPC listener {self.name}"
        return f"upstream channel {self.name}"


def tls_sets(config: Config) -> tuple[TlsSet, ...]:
    """Every TLS listener's set, and every upstream endpoint's that presents a certificate."""
    sets: list[TlsSet] = []
    for spec in config[GRPC_LISTENERS]:
        if spec.tls is None:
            continue
        files = [(Role.CERTFILE, spec.tls.certfile), (Role.KEYFILE, spec.tls.keyfile)]
        if spec.tls.verify == "verify_peer":
            files.append((Role.CACERTFILE, spec.tls.cacertfile))
        sets.append(TlsSet("listener", spec.name, tuple(files), listener=spec.tls))
    client = config[UPSTREAM_CLIENT]
    for channel in client.channels if client is not None else ():
        for endpoint in channel.endpoints:
            tls = endpoint.tls if endpoint.is_tls else None
            if tls is None or tls.certfile is None:
                continue  # no client certificate: nothing of the gateway's own to renew
            files = [(Role.CERTFILE, tls.certfile), (Role.KEYFILE, tls.keyfile or tls.certfile)]
            if tls.cacertfile is not None:
                files.append((Role.CACERTFILE, tls.cacertfile))
            sets.append(TlsSet("upstream", channel.name, tuple(files), upstream=tls))
    return tuple(dict.fromkeys(sets))


@attrs.frozen
class Unreadable:
    role: Role
    path: str
    why: str


SetRead = tuple[bytes, ...] | Unreadable


def read_sets(sets: tuple[TlsSet, ...], read: Callable[[str], bytes]) -> dict[TlsSet, SetRead]:
    """Each set's file bytes in `files` order, or the first file that cannot be read."""
    reads: dict[TlsSet, SetRead] = {}
    for tls_set in sets:
        data: list[bytes] = []
        for role, path in tls_set.files:
            try:
                data.append(read(path))
            except OSError as exc:
                reads[tls_set] = Unreadable(role, path, exc.strerror or type(exc).__name__)
                break
        else:
            reads[tls_set] = tuple(data)
    return reads


@attrs.define
class _State:
    loaded: bytes | None = None  # digest of the bytes loaded (at start: as first read)
    refused: object = None  # the digest or the Unreadable last warned about


@attrs.define(eq=False)
class TlsReload:
    sets: tuple[TlsSet, ...]
    expiry: Gauge
    reloads: Counter
    _state: dict[TlsSet, _State] = attrs.field(init=False, factory=dict)

    @classmethod
    def of(cls, config: Config, registry: CollectorRegistry) -> TlsReload:
        expiry, reloads = reload_families(registry)
        return cls(tls_sets(config), expiry, reloads)

    def first(self, reads: Mapping[TlsSet, SetRead]) -> None:
        """The files as the listeners load them when they start, right after the watcher's
        first read: nothing to load, the gauges set."""
        for tls_set, read in reads.items():
            state = self._state.setdefault(tls_set, _State())
            if isinstance(read, tuple):
                state.loaded = _digest(read)
                self._set_expiry(tls_set, read)

    def apply(self, reads: Mapping[TlsSet, SetRead]) -> list[LogLine]:
        lines: list[LogLine] = []
        for tls_set, read in reads.items():
            line = self._apply_one(tls_set, read)
            if line is not None:
                lines.append(line)
        return lines

    def _apply_one(self, tls_set: TlsSet, read: SetRead) -> LogLine | None:
        state = self._state.setdefault(tls_set, _State())
        if isinstance(read, Unreadable):
            if state.refused == read:
                return None
            state.refused = read
            return self._refused(
                tls_set, describe(read.role, read.path, f"cannot be read ({read.why})")
            )
        digest = _digest(read)
        if digest == state.loaded:
            state.refused = None  # back to the loaded set: a later breakage is told again
            return None
        if digest == state.refused:
            return None
        problem = self._load(tls_set, read)
        if problem is not None:
            state.refused = digest
            return self._refused(tls_set, problem)
        state.loaded, state.refused = digest, None
        self.reloads.labels(tls_set.kind, tls_set.name, "loaded").inc()
        self._set_expiry(tls_set, read)
        if tls_set.kind == "listener":
            told = "new handshakes present it, established connections keep theirs"
        else:
            told = "the next connection to the server presents it (each dial loads the files)"
        return LogLine("info", f"{tls_set.where()}: renewed certificate loaded; {told}")

    def _refused(self, tls_set: TlsSet, problem: str) -> LogLine:
        self.reloads.labels(tls_set.kind, tls_set.name, "refused").inc()
        kept = "the certificate loaded before stays in use"
        return LogLine(
            "warning", f"{tls_set.where()}: certificate reload refused, {problem}; {kept}"
        )

    def _load(self, tls_set: TlsSet, read: tuple[bytes, ...]) -> str | None:
        """Validate copies of `read` in a scratch context and load them into the live one; why
        not, naming the file."""
        with tempfile.TemporaryDirectory(prefix="yuzu-tls-") as tmp:
            copies = {}
            for (role, _), data in zip(tls_set.files, read, strict=True):
                copy = Path(tmp) / role.value
                copy.write_bytes(data)
                copies[role] = str(copy)
            try:
                if tls_set.listener is not None:
                    files = attrs.evolve(
                        tls_set.listener,
                        certfile=copies[Role.CERTFILE],
                        keyfile=copies[Role.KEYFILE],
                        cacertfile=copies.get(Role.CACERTFILE, tls_set.listener.cacertfile),
                    )
                    build_server_context(files, tls_set.name)
                    reload_live(tls_set.listener, files)
                elif tls_set.upstream is not None:
                    build_context(
                        attrs.evolve(
                            tls_set.upstream,
                            certfile=copies[Role.CERTFILE],
                            keyfile=copies[Role.KEYFILE],
                            cacertfile=copies.get(Role.CACERTFILE),
                        )
                    )
            except (TlsFilesUnusable, OSError, ssl.SSLError, ValueError) as exc:
                return _which_file(tls_set, copies, exc)
        return None

    def _set_expiry(self, tls_set: TlsSet, read: tuple[bytes, ...]) -> None:
        try:
            expiry = earliest_not_after(certificates(read[0]))
        except PemError:
            expiry = None
        if expiry is None:
            with contextlib.suppress(KeyError):
                self.expiry.remove(tls_set.kind, tls_set.name)
        else:
            self.expiry.labels(tls_set.kind, tls_set.name).set(expiry)


def _digest(read: tuple[bytes, ...]) -> bytes:
    digest = hashlib.sha256()
    for data in read:
        digest.update(hashlib.sha256(data).digest())
    return digest.digest()


def _which_file(tls_set: TlsSet, copies: Mapping[Role, str], exc: Exception) -> str:
    """The file to blame: the first whose contents are wrong for its role, else the
    certificate and key that do not go together."""
    for role, path in tls_set.files:
        problem = content_problem(role, copies[role])
        if problem is not None:
            return describe(role, path, problem)
    certfile = dict(tls_set.files)[Role.CERTFILE]
    # TlsFilesUnusable names the class only; the SSL error it replaced says what is wrong.
    cause = exc.__context__ if isinstance(exc, TlsFilesUnusable) else exc
    reason = (
        cause.reason if isinstance(cause, ssl.SSLError) and cause.reason else type(exc).__name__
    )
    return f"certfile {certfile} does not go with its keyfile or CA file ({reason})"


_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, tuple[Gauge, Counter]] = (
    weakref.WeakKeyDictionary()
)


def reload_families(registry: CollectorRegistry) -> tuple[Gauge, Counter]:
    """One pair per registry: a restarted watcher finds its families again."""
    families = _BY_REGISTRY.get(registry)
    if families is None:
        families = _BY_REGISTRY[registry] = (
            Gauge(
                LOADED_EXPIRY,
                "Earliest notAfter of the certificate chain a TLS listener or upstream endpoint"
                " has loaded, in Unix seconds.",
                ("kind", "name"),
                registry=registry,
            ),
            Counter(
                RELOADS,
                "Certificate reloads of a TLS listener or upstream endpoint, by result (loaded,"
                " refused).",
                ("kind", "name", "result"),
                registry=registry,
            ),
        )
    return families
