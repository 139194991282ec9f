"""Logging for a node: one line per event on stderr (the release script sends it to the
log file), level from `YUZU_GW_LOG_LEVEL` (default INFO), shape from `log_format`.

- `text` (the default): `<time> <LEVEL> <logger>: <message>`, then a traceback when the record
  carries one.
- `json`: one object a line, `{"time", "level", "logger", "message"}` and, when the record
  carries them, `"exc_info"` and `"stack_info"` (the text the text format would print after the
  message). `time` is UTC, ISO 8601 with milliseconds.

Both render the same record, after the crash redaction (gateway/node/crash_redaction.py), which
runs in the log record factory before any formatter sees a record: what the text format would
never print, the JSON format never prints either.

`YUZU_GW_LOG_FORMAT` applies from the first line; the `log_format` key of sys.config from the
moment the file is read (`configure_logging` is called again with the Config), so the lines
about reading the file itself are written in the variable's format (text unless it is set).
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Mapping

from gateway.config import Config
from gateway.config.keys.node import JSON, LOG_FORMAT, TEXT

__all__ = ["FORMAT_VAR", "TEXT_FORMAT", "JsonFormatter", "configure_logging", "formatter_for"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMAT_VAR = "YUZU_GW_LOG_FORMAT"
LEVEL_VAR = "YUZU_GW_LOG_LEVEL"


class JsonFormatter(logging.Formatter):
    """One JSON object per record (module doc); never a line break inside it."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False)


def formatter_for(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == JSON else logging.Formatter(TEXT_FORMAT)


def _format_of(env: Mapping[str, str], config: Config | None) -> str:
    if config is not None:
        return config[LOG_FORMAT]  # the variable, when set, has replaced the key already
    wanted = env.get(FORMAT_VAR, "").strip().lower()
    return wanted if wanted in (TEXT, JSON) else TEXT


def configure_logging(env: Mapping[str, str], config: Config | None = None) -> None:
    """The root logger's one stderr handler, at the level and in the format asked for."""
    level = env.get(LEVEL_VAR, "INFO").upper()
    handler = logging.StreamHandler()
    handler.setFormatter(formatter_for(_format_of(env, config)))
    logging.basicConfig(level=getattr(logging, level, logging.INFO), handlers=[handler], force=True)
