"""Refusing to boot: one exception type for every part of the gateway that can refuse.

The operator manual's rule for a refusal is a single critical log line that names the defect
by a term (`unknown_keys`, `tls_incomplete`, `{invalid_cluster_id, env}`, ...) and never
prints a secret value. Config loading, the listeners and the upstream client all raise
`BootRefused`; the boot sequence catches it once, logs it with `log_refusal` and exits.

Whoever raises it owns the promise that `detail` holds no secret: name the key, the source,
the shape of the mistake, never the value itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

BOOT_LOGGER = "yuzu_gw.boot"


class BootRefused(Exception):
    """The gateway must not start.

    `defect` is the Erlang-style defect atom (`unknown_keys`, `config_syntax`,
    `invalid_cluster_id`); `context` holds further atoms of the defect term when the term is a
    tuple, so `BootRefused("invalid_cluster_id", ..., context=("env",))` is the term
    `{invalid_cluster_id,env}`. `detail` says what to change, on one line, with no secret.
    """

    def __init__(self, defect: str, detail: str, *, context: tuple[str, ...] = ()) -> None:
        # One log line per refusal: a newline in a detail would split it in journald.
        self.defect = defect
        self.context = context
        self.detail = " ".join(detail.split())
        super().__init__(f"{self.term}: {self.detail}")

    @property
    def term(self) -> str:
        """The defect as Erlang would print it: `unknown_keys` or `{invalid_cluster_id,env}`."""
        if not self.context:
            return self.defect
        return "{" + ",".join((self.defect, *self.context)) + "}"

    def log_line(self) -> str:
        return f"Refusing to start: {self.term}: {self.detail}"


def log_refusal(refusal: BootRefused, logger: logging.Logger | None = None) -> None:
    """Write the refusal as ONE CRITICAL line on `yuzu_gw.boot`."""
    (logger or logging.getLogger(BOOT_LOGGER)).critical("%s", refusal.log_line())


@contextmanager
def refusing_boot(logger: logging.Logger | None = None) -> Iterator[None]:
    """Log any `BootRefused` raised inside the block, then let it propagate to the caller,
    which decides the exit status."""
    try:
        yield
    except BootRefused as refusal:
        log_refusal(refusal, logger)
        raise
