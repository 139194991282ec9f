"""The distribution cookie guard (the manual's `check_distribution_cookie/0`).

The cookie is the only authentication between nodes and of the remote console: whoever has it
can run code on the node. So the guard fails closed:

- no cookie (YUZU_GW_COOKIE unset or empty, so vm.args falls back to the historical default),
  or the historical default written out: refused, `default_cookie`, because a known cookie is
  unauthenticated remote code execution (#659);
- a cookie shorter than 32 characters: refused, `short_cookie`, because DNS discovery dials
  addresses nobody chose by hand and the handshake's initiator sends the cookie hash first,
  so a short cookie can be brute-forced offline (#4555).

`YUZU_GW_ALLOW_DEFAULT_COOKIE=1` (exactly "1") excuses both, for dev/CI stacks whose
distribution is not exposed. Nothing here ever logs the cookie or its length.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from gateway.config.refusal import BOOT_LOGGER, BootRefused
from gateway.config.vm_args import HISTORICAL_DEFAULT_COOKIE, CookieSource, NodeArgs

MIN_COOKIE_CHARS = 32
ALLOW_DEFAULT_COOKIE_VAR = "YUZU_GW_ALLOW_DEFAULT_COOKIE"
COOKIE_VAR = "YUZU_GW_COOKIE"

DEFAULT_COOKIE = "default_cookie"
SHORT_COOKIE = "short_cookie"

_ADVICE = f'export {COOKIE_VAR}="$(openssl rand -hex 32)" (the same value on every node)'

log = logging.getLogger(BOOT_LOGGER)


def _defect(node: NodeArgs) -> BootRefused | None:
    if node.cookie_source is CookieSource.DEFAULT:
        variables = ", ".join(node.cookie_variables) or "no -setcookie value"
        return BootRefused(
            DEFAULT_COOKIE,
            f"no distribution cookie ({variables} unset or empty in {node.path}), so the"
            f" historical default would be used; {_ADVICE}",
        )
    if node.cookie == HISTORICAL_DEFAULT_COOKIE:
        return BootRefused(
            DEFAULT_COOKIE,
            f"the distribution cookie from the {node.cookie_source.value} is the historical"
            f" default; {_ADVICE}",
        )
    if len(node.cookie) < MIN_COOKIE_CHARS:
        return BootRefused(
            SHORT_COOKIE,
            f"the distribution cookie from the {node.cookie_source.value} is shorter than"
            f" {MIN_COOKIE_CHARS} characters; {_ADVICE}",
        )
    return None


def check_distribution_cookie(node: NodeArgs, env: Mapping[str, str]) -> None:
    """Raise BootRefused unless the cookie is strong or the dev/CI override is set."""
    refusal = _defect(node)
    if refusal is None:
        return
    if env.get(ALLOW_DEFAULT_COOKIE_VAR) == "1":
        log.warning(
            "%s=1 lets the node start with a weak distribution cookie (%s); never set it in"
            " production",
            ALLOW_DEFAULT_COOKIE_VAR,
            refusal.defect,
        )
        return
    raise refusal
