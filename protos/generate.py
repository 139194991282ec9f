"""Regenerate the Python code of the wire contract from ``protos/**/*.proto``.

Usage (from the repository root, with the project's virtualenv)::

    python -m protos.generate          # regenerate in place
    python -m protos.generate --check  # regenerate into a temp dir, list what differs

Outputs, next to each ``.proto``:

* ``<name>_pb2.py`` and ``<name>_pb2.pyi``: protobuf message classes (``--python_out``,
  ``--pyi_out`` of the ``protoc`` bundled with grpcio-tools);
* ``<name>_grpc.py``: grpclib service bases and stubs (``protoc-gen-grpclib_python``);
* ``protos/typed/``: betterproto2 dataclasses and grpclib client stubs of the management API
  (``protoc-gen-python_betterproto2``, for the operator client, where volume is low), one
  package per proto package (``protos.typed.yuzu.server.v1``). The plugin formats its output
  with the ``ruff`` beside the interpreter, so the ruff version is part of the toolchain.

The repository root is the only include path, and the ``.proto`` files import each other as
``"protos/yuzu/..."``, so every generated import is rooted at the top-level ``protos`` package
(``import protos.yuzu.common.v1.common_pb2``). See docs/dev/protos.md.

``--check`` exits with status 1 and lists the generated files that are stale, missing or no
longer produced by any source; ``tests/unit/protos/test_protos_generated.py`` runs the same check.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTOS_DIR = REPO_ROOT / "protos"

GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_grpc.py")
PLUGIN_NAME = "protoc-gen-grpclib_python"
# The typed (betterproto2) package: every file under it is generated.
TYPED_DIR = Path("protos") / "typed"
TYPED_PLUGIN = "protoc-gen-python_betterproto2"
TYPED_SOURCES = ("protos/yuzu/server/v1/management.proto",)
# grpclib clients only: no grpcio import, no server bases (the gateway serves with upb).
TYPED_OPTIONS = "client_generation=async,server_generation=none"


class GenerationError(RuntimeError):
    """protoc or its plugin could not run, or rejected the sources."""


def proto_sources() -> list[Path]:
    """Every ``.proto`` under ``PROTOS_DIR``, sorted, as absolute paths."""
    return sorted(PROTOS_DIR.rglob("*.proto"))


def _is_generated(path: Path, root: Path) -> bool:
    if not path.is_file() or "__pycache__" in path.parts:
        return False
    return path.name.endswith(GENERATED_SUFFIXES) or path.relative_to(root).is_relative_to(
        TYPED_DIR
    )


def _generated_files(root: Path) -> set[Path]:
    """Generated files under ``root / "protos"``, relative to ``root``."""
    base = root / "protos"
    if not base.is_dir():
        return set()
    return {p.relative_to(root) for p in base.rglob("*") if _is_generated(p, root)}


def _package_inits(sources: Sequence[Path]) -> set[Path]:
    """``__init__.py`` files (relative to the repo root) making each source dir a package."""
    inits: set[Path] = set()
    for source in sources:
        directory = source.parent.relative_to(REPO_ROOT)
        while directory.parts:
            inits.add(directory / "__init__.py")
            directory = directory.parent
    return inits


def find_plugin(name: str = PLUGIN_NAME) -> Path:
    """Locate a protoc plugin: beside the running interpreter, else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return beside
    found = shutil.which(name)
    if found is None:
        raise GenerationError(
            f"{name} not found; install the test extra (grpclib, betterproto2-compiler)"
        )
    return Path(found)


# The betterproto2 plugin formats with `ruff` run in protoc's working directory, which would
# pick up whatever configuration is found there: protoc runs in a scratch directory holding
# only this one, so the output does not depend on where the tree is.
RUFF_CONFIG = "line-length = 100\n"


def _protoc(command: list[str]) -> None:
    # The plugin runs the `ruff` on PATH: the one of this environment first.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    with tempfile.TemporaryDirectory(prefix="yuzu-protoc-") as cwd:
        (Path(cwd) / "ruff.toml").write_text(RUFF_CONFIG)
        result = subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={REPO_ROOT}", *command],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
    if result.returncode != 0:
        raise GenerationError(
            f"protoc failed with status {result.returncode}:\n{result.stderr.strip()}"
        )


def run_protoc(out_dir: Path, sources: Sequence[Path] | None = None) -> None:
    """Generate every output for ``sources`` into ``out_dir`` (which mirrors the repo root)."""
    if sources is None:
        sources = proto_sources()
    if not sources:
        raise GenerationError(f"no .proto files under {PROTOS_DIR}")
    paths = [str(p) for p in sources]
    _protoc(
        [
            f"--plugin={PLUGIN_NAME}={find_plugin()}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpclib_python_out={out_dir}",
            *paths,
        ]
    )
    typed = out_dir / TYPED_DIR
    typed.mkdir(parents=True, exist_ok=True)
    _protoc(
        [
            f"--plugin={TYPED_PLUGIN}={find_plugin(TYPED_PLUGIN)}",
            f"--python_betterproto2_out={typed}",
            f"--python_betterproto2_opt={TYPED_OPTIONS}",
            *(str(REPO_ROOT / source) for source in TYPED_SOURCES),
        ]
    )


def check() -> list[str]:
    """Differences between the committed generated code and what the sources produce.

    Returns human-readable lines (empty when everything is up to date).
    """
    sources = proto_sources()
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="yuzu-protos-") as tmp:
        out_dir = Path(tmp)
        run_protoc(out_dir, sources)
        expected = _generated_files(out_dir)
        committed = _generated_files(REPO_ROOT)
        for rel in sorted(expected):
            target = REPO_ROOT / rel
            if not target.is_file():
                problems.append(f"{rel}: missing")
            elif not filecmp.cmp(out_dir / rel, target, shallow=False):
                problems.append(f"{rel}: differs from what the sources produce")
        problems.extend(
            f"{rel}: no source produces it any more" for rel in sorted(committed - expected)
        )
    problems.extend(
        f"{rel}: missing package marker"
        for rel in sorted(_package_inits(sources))
        if not (REPO_ROOT / rel).is_file()
    )
    return problems


def generate() -> list[Path]:
    """Regenerate in place. Returns the repo-relative paths written or removed."""
    sources = proto_sources()
    touched: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="yuzu-protos-") as tmp:
        out_dir = Path(tmp)
        run_protoc(out_dir, sources)
        expected = _generated_files(out_dir)
        for rel in sorted(expected):
            target = REPO_ROOT / rel
            if target.is_file() and filecmp.cmp(out_dir / rel, target, shallow=False):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(out_dir / rel, target)
            touched.append(rel)
        for rel in sorted(_generated_files(REPO_ROOT) - expected):
            (REPO_ROOT / rel).unlink()
            touched.append(rel)
    for rel in sorted(_package_inits(sources)):
        target = REPO_ROOT / rel
        if not target.exists():
            target.touch()
            touched.append(rel)
    return touched


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m protos.generate", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="generate into a temporary directory and fail if the committed code differs",
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = check()
            for line in problems:
                print(line)
            if problems:
                print("generated code is stale: run `python -m protos.generate`", file=sys.stderr)
                return 1
            print("generated code is up to date")
            return 0
        for rel in generate():
            print(f"updated {rel}")
    except GenerationError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
