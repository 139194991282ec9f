"""The layering rules of docs/dev/architecture.md, checked on every run.

import-linter judges the imports (pyproject.toml, `[tool.importlinter]`): the layers
`gateway > actors > supervisors` with type-checking imports counted, what `supervisors` and
`actors.core` may not import, features that meet only through their `api` leaves, and no cycle
between sibling packages at any depth. This file runs it, checks that those contracts are still
the ones configured, and adds what import-linter cannot see: imports hidden inside functions,
module length, the size of gateway/'s top level and the api leaves' own imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "actors", "supervisors")
PROJECT = (*PACKAGES, "protos")
FEATURES = (
    "agents",
    "cluster",
    "heartbeat",
    "listeners",
    "memory",
    "node",
    "registry",
    "router",
    "upstream",
)
MAX_LINES = 600
# A module may pass MAX_LINES only with a reason here (path relative to the repository root).
LONG_MODULES: dict[str, str] = {
    "actors/core/notify_store.py": (
        "one pure state machine (held notifications, probe, cap, resend keys): its transitions "
        "are read and property-tested together, as h11 keeps its state machine in one file"
    ),
    "actors/core/heartbeat_buffer.py": (
        "one pure core (coalescing, byte cap, chunked flush, shutdown flush) whose rules share "
        "the buffer's invariants; split, each half would restate them"
    ),
    "supervisors/runtime.py": (
        "the system base: the run queues, actor lifecycle and lookups share its private state, "
        "and a second module would need it back for its types (a cycle)"
    ),
}


def _sources() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "__pycache__" not in path.parts
    )


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def test_import_linter_finds_no_violation() -> None:
    run = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_the_contracts_are_the_documented_ones() -> None:
    by_type: dict[str, list[dict[str, object]]] = {}
    for contract in _contracts():
        by_type.setdefault(str(contract["type"]), []).append(contract)
    (layers,) = by_type["layers"]
    assert layers["layers"] == ["gateway", "actors", "supervisors"]
    # Type-checking imports count: a layer may not name a higher one even for a type.
    assert not layers.get("exclude_type_checking_imports", False)
    forbidden = {str(c["source_modules"][0]): c["forbidden_modules"] for c in by_type["forbidden"]}
    assert {"gateway", "actors"} <= set(forbidden["supervisors"])
    assert {"thespian", "asyncio", "supervisors", "socket", "time"} <= set(forbidden["actors.core"])
    (independence,) = by_type["independence"]
    assert sorted(independence["modules"]) == [f"actors.{name}" for name in FEATURES]
    assert independence["ignore_imports"] == ["actors.** -> actors.*.api"]
    (acyclic,) = by_type["acyclic_siblings"]
    assert set(acyclic["ancestors"]) == set(PACKAGES)


def test_no_project_import_is_hidden_inside_a_function() -> None:
    """An import inside a function is how a cycle hides from the contracts."""
    hidden = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                if any(name.split(".")[0] in PROJECT for name in names):
                    hidden.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert hidden == []


def test_no_project_import_silences_a_lint() -> None:
    """A `noqa` on an import of the project's own modules hides an unused or out-of-order import
    that something depends on for its side effect. (Optional third-party imports inside a
    function, such as uvloop, are not the project's modules.)"""
    silenced = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _sources()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "noqa" in line
        and line.lstrip().startswith(
            tuple(f"{verb} {package}" for verb in ("import", "from") for package in PROJECT)
        )
    ]
    assert silenced == []


def test_modules_are_short_unless_a_reason_is_written_down() -> None:
    lengths = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in _sources()
    }
    too_long = {p: n for p, n in lengths.items() if n > MAX_LINES and p not in LONG_MODULES}
    assert too_long == {}
    # An entry for a module that shrank or went is stale: the list says only what is true.
    stale = [p for p in LONG_MODULES if lengths.get(p, 0) <= MAX_LINES]
    assert stale == []


def test_gateway_has_at_most_three_top_level_modules() -> None:
    top = sorted(path.name for path in (ROOT / "gateway").glob("*.py"))
    assert len(top) <= 3, top


def test_every_feature_has_an_api_leaf() -> None:
    """A feature's api imports nothing of its own feature and, of other features, only their
    api: so any module may import it without pulling an actor in."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    leaks = {}
    for feature in FEATURES:
        api = f"actors.{feature}.api"
        assert api in graph.modules, f"{api} is missing"
        inside = {
            imported
            for imported in graph.find_modules_directly_imported_by(api)
            if imported.startswith("actors.")
            and not imported.startswith("actors.core")
            and not imported.endswith(".api")
        }
        if inside:
            leaks[api] = sorted(inside)
    assert leaks == {}
