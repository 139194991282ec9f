"""The gateway's version, as every entry point's `--version` prints it: the installed
distribution's (`pyproject.toml`), or `unknown` for a checkout that was never installed."""

from __future__ import annotations

import argparse
import importlib.metadata

__all__ = ["DISTRIBUTION", "add_version_option", "version"]

DISTRIBUTION = "yuzu-gateway"
UNKNOWN = "unknown"


def version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def add_version_option(parser: argparse.ArgumentParser) -> None:
    """`--version`: `<prog> <version>` on stdout, exit 0."""
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version()}", help="print the version"
    )
