"""Logging for a node: one line per event on stderr (the release script sends it to the
log file), level from `YUZU_GW_LOG_LEVEL` (default INFO)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(env: Mapping[str, str]) -> None:
    level = env.get("YUZU_GW_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO), format=LOG_FORMAT, force=True)
