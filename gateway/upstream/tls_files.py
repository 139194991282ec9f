"""What is wrong with a CA, certificate or key file an https endpoint names.

Seed, "A CA, certificate or key file that is wrong": the TLS stack only says the option set
cannot be used, which names no file, so the gateway looks at the files itself. Two questions,
two functions:

* `kind_problem(path)`: is it a directory or another non-file? That is the one file defect that
  refuses boot (`unusable_upstream_tls_file`): it cannot become a file by waiting, and a
  container runtime creates a directory in place of a bind-mounted file that does not exist.
* `content_problem(role, path)`: missing, unreadable, empty, or without the PEM block it must
  hold. Not refused (the server may create its certificates after the gateway starts); it
  gives the boot WARNING, the rate-limited ERROR and the `upstream_tls_files` readiness check.

A reason is one of the seed's phrases, or the POSIX name of any other error (`eio`). The path
of a keyfile is never printed (`describe`): the line says `keyfile`.

Reads are bounded: a file is parsed only up to `MAX_READ_BYTES`. These functions do blocking
file I/O; the channel runs them in a thread.
"""

from __future__ import annotations

import base64
import binascii
import enum
import errno
import os
import re
import stat
from collections.abc import Callable

__all__ = [
    "MAX_READ_BYTES",
    "Role",
    "content_problem",
    "describe",
    "kind_problem",
]

# Seed: "parses it only up to 4 MiB". A CA bundle is tens of KiB; more is not a PEM file.
MAX_READ_BYTES = 4 * 1024 * 1024

DOES_NOT_EXIST = "does not exist (yet)"
PERMISSION_DENIED = "cannot be read (permission denied)"
IS_A_DIRECTORY = "is a directory, not a file"
NOT_REGULAR = "is not a regular file"
EMPTY = "is empty"
NO_CERTIFICATE = "contains no PEM certificate"
NO_PRIVATE_KEY = "contains no PEM private key"


class Role(enum.Enum):
    """The SSL option that names the file."""

    CACERTFILE = "cacertfile"
    CERTFILE = "certfile"
    KEYFILE = "keyfile"


# A PEM block: the label on BEGIN and END must match, the body is base64 (legacy encrypted
# keys carry `Proc-Type:`/`DEK-Info:` header lines before it).
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)-----END \1-----", re.DOTALL)
_HEADER_LINE = re.compile(rb"^[A-Za-z-]+:.*$", re.MULTILINE)


def describe(role: Role, path: str, reason: str) -> str:
    """`cacertfile /etc/yuzu/ca.pem does not exist (yet)`; a keyfile without its path."""
    if role is Role.KEYFILE:
        return f"{role.value} {reason}"
    return f"{role.value} {path} {reason}"


def _posix_name(error: OSError) -> str:
    if error.errno is not None and error.errno in errno.errorcode:
        return errno.errorcode[error.errno].lower()
    return "unreadable"


def _stat_reason(error: OSError) -> str:
    if isinstance(error, FileNotFoundError):
        return DOES_NOT_EXIST
    if isinstance(error, PermissionError):
        return PERMISSION_DENIED
    if isinstance(error, NotADirectoryError):
        # A path through a file (`/etc/ca.pem/x`): nothing exists at it.
        return DOES_NOT_EXIST
    return _posix_name(error)


def kind_problem(path: str, stat_fn: Callable[[str], os.stat_result] = os.stat) -> str | None:
    """`is a directory, not a file` or `is not a regular file` when the path (following
    links) is one; None for a regular file and for anything that cannot be looked at (a
    missing file is a content problem, not a refusal)."""
    try:
        mode = stat_fn(path).st_mode
    except OSError:
        return None
    if stat.S_ISDIR(mode):
        return IS_A_DIRECTORY
    if not stat.S_ISREG(mode):
        return NOT_REGULAR
    return None


def _has_block(data: bytes, wanted: Callable[[str], bool]) -> bool:
    for match in _PEM_BLOCK.finditer(data):
        label = match.group(1).decode("ascii")
        if not wanted(label):
            continue
        body = _HEADER_LINE.sub(b"", match.group(2))
        try:
            decoded = base64.b64decode(b"".join(body.split()), validate=True)
        except (binascii.Error, ValueError):
            continue
        if decoded:
            return True
    return False


def _is_certificate(label: str) -> bool:
    return label in ("CERTIFICATE", "TRUSTED CERTIFICATE", "X509 CERTIFICATE")


def _is_private_key(label: str) -> bool:
    # PRIVATE KEY (PKCS#8), ENCRYPTED PRIVATE KEY, RSA/EC/DSA PRIVATE KEY (legacy forms).
    return label.endswith("PRIVATE KEY")


def content_problem(role: Role, path: str) -> str | None:
    """Why the file cannot serve as `role`, or None when it holds what it must."""
    kind = kind_problem(path)
    if kind is not None:
        return kind
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_READ_BYTES)
    except OSError as error:
        return _stat_reason(error)
    if not data:
        return EMPTY
    if role is Role.KEYFILE:
        return None if _has_block(data, _is_private_key) else NO_PRIVATE_KEY
    return None if _has_block(data, _is_certificate) else NO_CERTIFICATE
