"""docs/runbook.md names every WARNING and ERROR line the gateway can log (drift test); and
docs/README.md, the manual's index, lists every page of docs/.

The gateway's code (gateway/, actors/, supervisors/; not the dev stack or the operator CLI,
which are tools) is read with `ast`, never imported. A log line is

- a call `<logger>.warning|error|critical|exception(FORMAT, ...)`, the logger being a name
  or attribute `log`, `logger` or ending in `_log`;
- a call `<x>.log(LEVEL, FORMAT, ...)` whose LEVEL is not spelled `logging.INFO`/`DEBUG`;
- a `LogLine(LEVEL, TEXT)` effect of a pure core whose LEVEL is not "info" or "debug".

FORMAT or TEXT is followed through what the code says: a string, an f-string, a `.format()`
of one, `a + b`, `x if c else y`, a name assigned in the same function or a module constant
(of any scanned module). Its literal parts, split at every `%s`-style and `{}` placeholder,
with runs of blanks collapsed and parts shorter than four characters dropped, must appear in
that order on one line of the runbook. So the runbook quotes each line with its placeholders
written any way (`<agent>`), and a reworded log line fails here until the runbook follows.
A pure pass-through (`log.warning("%s", text)` of a text built elsewhere) has no literal part
of its own: its text is checked where it is built. A function that logs a text its caller
passes (`def warn(self, kind, line)`) makes each of its calls a log line with that argument's
text; a piece a caller splices into a wrapper's own line is not checked on its own.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[3]
RUNBOOK = ROOT / "docs" / "runbook.md"
SCANNED = ("gateway", "actors", "supervisors")
NOT_THE_GATEWAY = ("gateway/devstack/", "gateway/ctl/")
LEVEL_METHODS = frozenset({"warning", "error", "critical", "exception"})
QUIET_LEVELS = frozenset({"info", "debug", "INFO", "DEBUG"})
LOGGER = re.compile(r"(^|\.)(log|logger|_?\w*_log)$")
PLACEHOLDER = re.compile(r"%(\([^)]*\))?[-#0 +]*\d*(\.\d+)?[sdifgeErxXc]|\{[^{}]*\}")
MIN_PART = 4
# Log texts that reach the logger through an attribute, which the scan does not follow
# (actors/router/actor.py: log.warning("%s", resolved.warning)).
ALSO_LOGGED = ("INVALID_DEFAULT_LOG",)
# A scan that finds far fewer lines than the gateway logs is broken, not passing.
AT_LEAST = 60


@attrs.frozen
class LogSite:
    path: str
    line: int
    parts: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {' ... '.join(self.parts)}"


def normalise(text: str) -> str:
    return " ".join(text.replace("`", "").replace("\\|", "|").split())


def literal_parts(text: str) -> list[str]:
    pieces = (normalise(piece) for piece in PLACEHOLDER.split(text) if piece)
    return [piece for piece in pieces if len(piece) >= MIN_PART]


class Texts:
    """What a text expression can be, as alternatives of literal parts (None: not known).
    `constants` are every scanned module's; `functions` the module's own, whose return values
    a call of them (`self._text(...)`) is followed to."""

    def __init__(
        self, constants: dict[str, list[ast.expr]], functions: dict[str, list[Function]]
    ) -> None:
        self.constants = constants
        self.functions = functions

    def of(
        self, node: ast.expr, scope: ast.AST | None, seen: frozenset[str] = frozenset()
    ) -> list[list[str]] | None:
        match node:
            case ast.Constant(value=str() as value):
                return [literal_parts(value)]
            case ast.JoinedStr(values=values):
                parts: list[str] = []
                for value in values:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        parts += literal_parts(value.value)
                return [parts]
            case ast.Call(func=ast.Attribute(attr="format", value=template)):
                return self.of(template, scope, seen)
            case ast.Call(func=ast.Name(id=name) | ast.Attribute(attr=name)) if (
                name in self.functions and name not in seen
            ):
                returned = [
                    (ret.value, function)
                    for function in self.functions[name]
                    for ret in ast.walk(function)
                    if isinstance(ret, ast.Return) and ret.value is not None
                ]
                return _known(self.of(value, f, seen | {name}) for value, f in returned)
            case ast.BinOp(op=ast.Add(), left=left, right=right):
                lefts, rights = self.of(left, scope, seen), self.of(right, scope, seen)
                if lefts is None or rights is None:
                    return lefts or rights
                return [a + b for a in lefts for b in rights]
            case ast.IfExp(body=body, orelse=orelse):
                return _known([self.of(body, scope, seen), self.of(orelse, scope, seen)])
            case ast.Name(id=name) if name not in seen:
                values = [
                    value for value in _assigned(scope, name) if value is not None
                ] or self.constants.get(name, [])
                return _known(self.of(value, scope, seen | {name}) for value in values)
        return None

    def joined(self, nodes: list[ast.expr], scope: ast.AST | None) -> list[list[str]]:
        """The text of several arguments printed one after the other (`"%s%s", a, b`)."""
        alternatives: list[list[str]] = [[]]
        for node in nodes:
            found = self.of(node, scope)
            if found is not None:
                alternatives = [a + b for a in alternatives for b in found]
        return alternatives


Function = ast.FunctionDef | ast.AsyncFunctionDef


def _known(found: Iterable[list[list[str]] | None]) -> list[list[str]] | None:
    known = [alt for alts in found if alts is not None for alt in alts]
    return known or None


def _assigned(scope: ast.AST | None, name: str) -> list[ast.expr | None]:
    return [
        node.value
        for node in (ast.walk(scope) if scope is not None else ())
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and any(isinstance(t, ast.Name) and t.id == name for t in _targets(node))
    ]


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def _sources() -> Iterator[tuple[str, ast.Module]]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if not relative.startswith(NOT_THE_GATEWAY):
                yield relative, ast.parse(path.read_text(encoding="utf-8"), relative)


def _module_constants(modules: list[tuple[str, ast.Module]]) -> dict[str, list[ast.expr]]:
    constants: dict[str, list[ast.expr]] = {}
    for _, module in modules:
        for node in module.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                for target in _targets(node):
                    if isinstance(target, ast.Name):
                        constants.setdefault(target.id, []).append(node.value)
    return constants


def _functions(module: ast.Module) -> dict[str, list[Function]]:
    found: dict[str, list[Function]] = {}
    for node in ast.walk(module):
        if isinstance(node, Function):
            found.setdefault(node.name, []).append(node)
    return found


def _text_arguments(call: ast.Call) -> list[ast.expr] | None:
    """The format or text of a log call or LogLine, and after a format with no text of its own
    (`"%s%s"`) the arguments it prints; None when the call is not one or is INFO/DEBUG."""
    func, args = call.func, call.args
    text: list[ast.expr] | None = None
    if isinstance(func, ast.Attribute) and args:
        receiver = ast.unparse(func.value)
        if func.attr in LEVEL_METHODS and LOGGER.search(receiver):
            text = args
        elif func.attr == "log" and len(args) >= 2:
            level = ast.unparse(args[0]).rpartition(".")[2]
            text = None if level in QUIET_LEVELS else args[1:]
    elif isinstance(func, ast.Name) and func.id == "LogLine" and len(args) >= 2:
        level = args[0]
        quiet = isinstance(level, ast.Constant) and level.value in QUIET_LEVELS
        text = None if quiet else args[1:2]
    if text and isinstance(fmt := text[0], ast.Constant) and isinstance(fmt.value, str):
        return text[1:] if not literal_parts(fmt.value) else text[:1]
    return text[:1] if text else None


def _wrappers(modules: list[tuple[str, ast.Module]]) -> dict[str, tuple[int, str]]:
    """Functions that log a text their caller passes (`def warn(self, kind, line)`): name ->
    the position (after self) and name of that parameter."""
    wrappers: dict[str, tuple[int, str]] = {}
    for _, module in modules:
        for function in (n for n in ast.walk(module) if isinstance(n, Function)):
            params = [a.arg for a in function.args.args]
            if params[:1] in (["self"], ["cls"]):
                params = params[1:]
            for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
                for text in _text_arguments(call) or []:
                    # The parameter is the text, or its start (`line + "%s"`).
                    start = text
                    while isinstance(start, ast.BinOp):
                        start = start.left
                    if isinstance(start, ast.Name) and start.id in params:
                        wrappers[function.name] = (params.index(start.id), start.id)
    return wrappers


def _wrapped_text(call: ast.Call, wrappers: dict[str, tuple[int, str]]) -> list[ast.expr] | None:
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name not in wrappers or ast.unparse(func).startswith("warnings."):
        return None
    index, param = wrappers[name]
    if index < len(call.args):
        return [call.args[index]]
    return [k.value for k in call.keywords if k.arg == param] or None


def log_sites() -> list[LogSite]:
    modules = list(_sources())
    constants, wrappers = _module_constants(modules), _wrappers(modules)
    sites: dict[tuple[str, ...], LogSite] = {}
    for path, module in modules:
        texts = Texts(constants, _functions(module))
        scopes: list[tuple[ast.AST | None, Iterable[ast.AST]]] = [(None, _module_level(module))]
        scopes += [(f, ast.walk(f)) for f in ast.walk(module) if isinstance(f, Function)]
        for scope, nodes in scopes:
            for node in nodes:
                if not isinstance(node, ast.Call):
                    continue
                text = _text_arguments(node) or _wrapped_text(node, wrappers)
                for parts in texts.joined(text, scope) if text else []:
                    if parts:
                        sites.setdefault(tuple(parts), LogSite(path, node.lineno, tuple(parts)))
    for name in ALSO_LOGGED:
        [value] = constants[name]
        for parts in Texts(constants, {}).of(value, None) or []:
            sites.setdefault(tuple(parts), LogSite(name, value.lineno, tuple(parts)))
    return sorted(sites.values(), key=lambda s: (s.path, s.line))


def _module_level(module: ast.Module) -> Iterator[ast.AST]:
    """The nodes of a module outside its functions (the functions are their own scopes)."""
    stack: list[ast.AST] = list(module.body)
    while stack:
        node = stack.pop()
        if isinstance(node, Function):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def documented(site: LogSite, lines: list[str]) -> bool:
    for line in lines:
        at = 0
        for part in site.parts:
            at = line.find(part, at)
            if at < 0:
                break
            at += len(part)
        else:
            return True
    return False


def test_every_warning_and_error_line_is_in_the_runbook() -> None:
    sites = log_sites()
    assert len(sites) >= AT_LEAST, f"the scan found only {len(sites)} log lines"
    lines = [normalise(line) for line in RUNBOOK.read_text(encoding="utf-8").splitlines()]
    missing = [str(site) for site in sites if not documented(site, lines)]
    assert not missing, "docs/runbook.md lacks these log lines:\n" + "\n".join(missing)


def test_the_scan_follows_formats_through_the_code() -> None:
    source = """
LINE = "Replay: {agent} failed ({why}); later"
def f(log, flag):
    log.warning("Upstream %s: connection to %s down (%s); redialling in %.1f s", a, b, c, d)
    log.info("not this one %s", x)
    log.warning("%s%s", line, suffix)
    self.log.log(level, "cannot connect to %s (%s); retrying", a, b)
    text = f"memory at {used} bytes" if flag else "memory unknown"
    effects.append(LogLine("warning", text))
    effects.append(LogLine("info", "quiet"))
    crash_log.error("%s", LINE.format(agent=a, why=w))
"""
    module = ast.parse(source)
    texts = Texts(_module_constants([("m", module)]), _functions(module))
    [function] = [n for n in module.body if isinstance(n, ast.FunctionDef)]
    found = [
        parts
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and (text := _text_arguments(node)) is not None
        for parts in texts.joined(text, function)
    ]
    assert sorted(found) == [
        [],  # "%s%s" of texts built elsewhere
        ["Replay:", "failed (", "); later"],
        ["Upstream", ": connection to", "down (", "); redialling in"],
        ["cannot connect to", "); retrying"],
        ["memory at", "bytes"],
        ["memory unknown"],
    ]
    lines = [normalise("| `Replay: <agent> failed (<why>); later` | what to do |")]
    assert documented(LogSite("m", 1, ("Replay:", "failed (", "); later")), lines)
    assert not documented(LogSite("m", 1, ("); later", "Replay:")), lines)


def test_a_function_that_logs_its_callers_text_makes_each_call_a_log_line() -> None:
    source = """
class Plane:
    def warn(self, kind, line):
        log.warning("%s%s", line, suffix)
def handler(plane):
    plane.warn("k", "Register refused: the id is empty")
    plane.warn("k", line=f"Upstream {method} failed: {why}")
    warnings.warn("not a log line")
"""
    module = ast.parse(source)
    wrappers = _wrappers([("m", module)])
    assert wrappers == {"warn": (1, "line")}
    texts = Texts({}, _functions(module))
    found = [
        parts
        for node in ast.walk(module)
        if isinstance(node, ast.Call) and (text := _wrapped_text(node, wrappers)) is not None
        for parts in texts.joined(text, None)
    ]
    assert sorted(found) == [["Register refused: the id is empty"], ["Upstream", "failed:"]]


def test_the_manual_index_links_every_page() -> None:
    # docs/README.md is the operator manual's table of contents: a page it does not list is
    # a page nobody finds.
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    pages = {path.name for path in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages - linked == set(), "docs/README.md does not list these pages"
    assert linked - pages == set(), "docs/README.md links pages that do not exist"
