"""The log events deltad emits, read from its source, and the catalog page that lists them.

Every event is a structlog call with a `snake_case` name (`log.warning("resume_failed", ...)`);
operators' alert rules and the tests match on those names, so docs/log-events.md lists each
one with its level, logger and module and a line saying what it means. The names, levels,
loggers and modules come from the code (`ast`, nothing imported); the meanings are written by
hand in the page and kept when it is regenerated:

    python -m deltad.logcatalog            # rewrite docs/log-events.md from the code
    python -m deltad.logcatalog --check    # exit 1 and say which names differ

What counts as an emit: a call of a level method (`debug`, `info`, `warning`, `error`,
`exception`, `critical`) on a logger a module made with `structlog.get_logger(NAME)` (or one
it bound from it, or `structlog.get_logger(NAME)` itself); a call of a name bound to such a
method (`say = log.info`), directly or by a function that returns one; the event name as a
string literal, a name a `for` loop takes from a literal tuple of literals, or an f-string
with a `# events: NAME NAME` comment on one of the three lines above its call. Anything else
with a logger's level method is an error naming its line: the catalog must see every event.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
PAGE = PACKAGE.parent / "docs" / "log-events.md"
COMMAND = "python -m deltad.logcatalog"
TO_WRITE = "(to write: what it means)"

LEVELS = {
    "debug": "debug",
    "info": "info",
    "warning": "warning",
    "warn": "warning",
    "error": "error",
    "exception": "error",
    "critical": "critical",
}
_ORDER = ("debug", "info", "warning", "error", "critical")
_NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
_ROW = re.compile(r"^\|\s*`(?P<event>[^`]+)`\s*\|(?P<rest>.*)\|\s*$")


class CatalogError(Exception):
    """An emit the catalog cannot read, or a page it cannot parse: one line, where and why."""


@dataclass(frozen=True)
class Emit:
    event: str
    level: str
    logger: str  # the `logger` field of the JSON line
    module: str  # the source file, relative to the package's parent (deltad/core/service.py)
    line: int


@dataclass(frozen=True)
class Entry:
    """One row of the catalog."""

    event: str
    levels: tuple[str, ...]
    loggers: tuple[str, ...]
    modules: tuple[str, ...]
    meaning: str


# -- reading the code ---------------------------------------------------------------------


def _get_logger(node: ast.expr) -> str | None:
    """The name in `structlog.get_logger("NAME")`, None for anything else."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get_logger"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "structlog"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return node.args[0].value
    return None


def _binding(node: ast.AST) -> tuple[str, ast.expr] | None:
    """`name = value` (plain, annotated or `:=`) as (name, value)."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        if isinstance(node.targets[0], ast.Name):
            return node.targets[0].id, node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        if isinstance(node.target, ast.Name):
            return node.target.id, node.value
    elif isinstance(node, ast.NamedExpr):
        return node.target.id, node.value
    return None


def _bindings(body: Iterable[ast.AST]) -> Iterator[tuple[str, ast.expr]]:
    """Every binding under `body`."""
    for top in body:
        for node in ast.walk(top):
            if (found := _binding(node)) is not None:
                yield found


_Method = tuple[str, frozenset[str]]  # a logger's name, the levels a call of it logs at


class _Module:
    """One module's loggers, and what in it hands out their methods. One walk of the tree;
    parents (for a name's scope) only when a module needs them, which few do."""

    def __init__(self, tree: ast.Module, module: str) -> None:
        self.lines: list[str] = []  # the source's lines (a made event name's `# events:`)
        self.module = module
        self.tree = tree
        self.nodes = list(ast.walk(tree))
        self._parents: dict[ast.AST, ast.AST] | None = None
        self.loggers: dict[str, str] = {}
        for stmt in tree.body:
            if (bound := _binding(stmt)) and (logger := _get_logger(bound[1])) is not None:
                self.loggers[bound[0]] = logger
        bindings = [b for node in self.nodes if (b := _binding(node)) is not None]
        methods = {name: m for name, value in bindings if (m := self.method(value)) is not None}
        # Module functions that hand out a logger's method (`def _say(quiet): return log.info`).
        found: dict[str, list[_Method]] = defaultdict(list)
        for node in self.nodes:
            if isinstance(node, ast.Return) and node.value is not None:
                given = self._methods_in(node.value, methods)
                fn = self.enclosing(node) if given else None
                if isinstance(fn, ast.FunctionDef) and self.parents.get(fn) is tree:
                    found[fn.name] += given
        self.factories: dict[str, _Method] = {}
        for name, given in found.items():
            loggers = {logger for logger, _ in given}
            if len(loggers) == 1:
                self.factories[name] = (loggers.pop(), frozenset().union(*(lv for _, lv in given)))
        # Names bound to a method or a factory's result: only a call of one of these can be
        # an emit by name (no other call needs a look at its scope).
        self.bound = {
            name
            for name, value in bindings
            if name in methods
            or (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in self.factories
            )
        }

    @property
    def parents(self) -> dict[ast.AST, ast.AST]:
        if self._parents is None:
            self._parents = {
                child: parent for parent in self.nodes for child in ast.iter_child_nodes(parent)
            }
        return self._parents

    def logger_of(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.loggers.get(node.id)
        if (direct := _get_logger(node)) is not None:
            return direct
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("bind", "new")
        ):
            return self.logger_of(node.func.value)
        return None

    def method(self, node: ast.expr) -> _Method | None:
        """(logger, levels) when `node` is a logger's level method: `log.info`."""
        if isinstance(node, ast.Attribute) and node.attr in LEVELS:
            logger = self.logger_of(node.value)
            if logger is not None:
                return logger, frozenset({LEVELS[node.attr]})
        return None

    def _methods_in(self, node: ast.expr, local: dict[str, _Method]) -> list[_Method]:
        if isinstance(node, ast.IfExp):
            return self._methods_in(node.body, local) + self._methods_in(node.orelse, local)
        if isinstance(node, ast.Name) and node.id in local:
            return [local[node.id]]
        direct = self.method(node)
        return [direct] if direct is not None else []

    def enclosing(self, node: ast.AST) -> ast.AST | None:
        while (node := self.parents.get(node)) is not None:  # type: ignore[assignment]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return None

    def callee(self, call: ast.Call) -> _Method | None:
        """(logger, levels) when `call` emits a log event."""
        if (direct := self.method(call.func)) is not None:
            return direct
        if not isinstance(call.func, ast.Name) or call.func.id not in self.bound:
            return None
        scope = self.enclosing(call)
        body = scope.body if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef) else []
        for name, value in _bindings(body):
            if name != call.func.id:
                continue
            if (bound := self.method(value)) is not None:
                return bound
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in self.factories
            ):
                return self.factories[value.func.id]
        return None

    def event_names(self, call: ast.Call) -> list[str]:
        arg: ast.expr | None = call.args[0] if call.args else None
        for kw in call.keywords:
            if kw.arg == "event":
                arg = kw.value
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return [arg.value]
        if isinstance(arg, ast.Name) and (names := self._loop_names(call, arg.id)):
            return names
        if arg is not None and (names := self._said_names(call)):
            return names
        raise CatalogError(
            f"{self.module}:{call.lineno}: an event name the catalog cannot read"
            f" ({ast.unparse(call)[:60]}...): write it as a string literal"
        )

    def _said_names(self, call: ast.Call) -> list[str]:
        """An event name the code makes (an f-string, a field) says the names it can be in a
        comment on one of the three lines above the call: `# events: notify_sent channel_sent`."""
        for n in range(call.lineno - 2, max(call.lineno - 5, -1), -1):
            line = self.lines[n].strip() if 0 <= n < len(self.lines) else ""
            if line.startswith("# events:"):
                return line.removeprefix("# events:").split()
        return []

    def _loop_names(self, call: ast.Call, name: str) -> list[str]:
        """The literals a `for` loop around `call` binds to `name`, from a literal tuple (or a
        name bound to one in the same function)."""
        node: ast.AST | None = call
        while (node := self.parents.get(node)) is not None:  # type: ignore[arg-type]
            if not isinstance(node, ast.For):
                continue
            position = _position(node.target, name)
            if position is None:
                continue
            rows = node.iter
            if isinstance(rows, ast.Name):
                scope = self.enclosing(node)
                body = scope.body if isinstance(scope, ast.FunctionDef) else []
                rows = next((v for n, v in _bindings(body) if n == rows.id), rows)
            if not isinstance(rows, ast.Tuple | ast.List):
                return []
            names: list[str] = []
            for row in rows.elts:
                item = row if position < 0 else _element(row, position)
                if not (isinstance(item, ast.Constant) and isinstance(item.value, str)):
                    return []
                names.append(item.value)
            return names
        return []


def _position(target: ast.expr, name: str) -> int | None:
    """-1 when the loop binds `name` itself, its index when a tuple target holds it."""
    if isinstance(target, ast.Name):
        return -1 if target.id == name else None
    if isinstance(target, ast.Tuple):
        for i, elt in enumerate(target.elts):
            if isinstance(elt, ast.Name) and elt.id == name:
                return i
    return None


def _element(row: ast.expr, i: int) -> ast.expr | None:
    if isinstance(row, ast.Tuple | ast.List) and i < len(row.elts):
        return row.elts[i]
    return None


def _effect(call: ast.Call, effects: frozenset[str]) -> tuple[str, str] | None:
    """(level, event) when `call` makes a log effect (`Log("warning", "resume_backoff", ...)`,
    what a functional core returns for its shell to log)."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    if name not in effects:
        return None
    given = dict(zip(("level", "event"), call.args, strict=False))
    given |= {kw.arg: kw.value for kw in call.keywords if kw.arg in ("level", "event")}
    level, event = given.get("level"), given.get("event")
    if not (
        isinstance(level, ast.Constant)
        and isinstance(event, ast.Constant)
        and isinstance(event.value, str)
        and level.value in LEVELS
    ):
        raise CatalogError(
            f"{ast.unparse(call)[:60]}...: a log effect's level and event must be string literals"
        )
    return LEVELS[level.value], event.value


def _dispatch(call: ast.Call, mod: _Module) -> str | None:
    """The logger of `getattr(LOGGER, level)(event, ...)`: where a shell logs its core's log
    effects (their events are read where the effects are made)."""
    func = call.func
    if (
        isinstance(func, ast.Call)
        and isinstance(func.func, ast.Name)
        and func.func.id == "getattr"
        and func.args
    ):
        return mod.logger_of(func.args[0])
    return None


@dataclass
class _Scan:
    emits: list[Emit]
    effects: list[Emit]  # logged by a dispatch: its logger is filled in by emitted()
    dispatches: set[str]


def _scan(source: str, module: str, effects: frozenset[str]) -> _Scan:
    tree = ast.parse(source)
    mod = _Module(tree, module)
    mod.lines = source.splitlines()
    out = _Scan([], [], set())
    for node in mod.nodes:
        if not isinstance(node, ast.Call):
            continue
        if (effect := _effect(node, effects)) is not None:
            level, event = effect
            out.effects.append(Emit(_named(event, module, node), level, "", module, node.lineno))
            continue
        if (dispatcher := _dispatch(node, mod)) is not None:
            out.dispatches.add(dispatcher)
            continue
        callee = mod.callee(node)
        if callee is None:
            _untraced(node, module)
            continue
        logger, levels = callee
        for event in mod.event_names(node):
            name = _named(event, module, node)
            out.emits += [Emit(name, level, logger, module, node.lineno) for level in levels]
    return out


def _named(event: str, module: str, node: ast.Call) -> str:
    if not _NAME.fullmatch(event):
        raise CatalogError(f"{module}:{node.lineno}: event {event!r} is not snake_case")
    return event


def emits_in(source: str, module: str, effects: frozenset[str] = frozenset()) -> list[Emit]:
    """Every event one module's source emits itself (`module`: its path, for the catalog); its
    log effects (of the classes named in `effects`) with the logger its own dispatch gives."""
    scan = _scan(source, module, effects)
    logger = ", ".join(sorted(scan.dispatches))
    return scan.emits + [replace(e, logger=logger) for e in scan.effects]


# A module can log only if it makes a logger, calls a log-like receiver's level method or makes
# a log effect: the others (most of them) are not parsed.
_MAY_LOG = r"structlog|log\w*\s*\.\s*(?:" + "|".join(LEVELS) + r")\s*\("
# A log effect's class: a dataclass whose first fields are `level` and `event`.
_EFFECT_FIELDS = re.compile(r"^\s+level: .*\n\s+event: str\b", re.MULTILINE)


def _effect_classes(sources: dict[str, str]) -> frozenset[str]:
    names: set[str] = set()
    for source in sources.values():
        if not _EFFECT_FIELDS.search(source):
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                fields = [
                    s.target.id
                    for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                ]
                if fields[:2] == ["level", "event"]:
                    names.add(node.name)
    return frozenset(names)


def _untraced(call: ast.Call, module: str) -> None:
    """A level method of something named like a logger that no `get_logger` made here (a
    logger passed in, an attribute): its events would be missed, so it is an error."""
    func = call.func
    if (
        isinstance(func, ast.Attribute)
        and func.attr in LEVELS
        and re.search(r"log\w*$", ast.unparse(func.value))
        and call.args
        and isinstance(call.args[0], ast.Constant)
        and isinstance(call.args[0].value, str)
    ):
        raise CatalogError(
            f"{module}:{call.lineno}: {ast.unparse(func)}: a logger the catalog cannot trace"
            " to structlog.get_logger in this module"
        )


def emitted(package: Path = PACKAGE) -> list[Emit]:
    """Every event the package emits; a log effect's logger is that of the shell that logs it."""
    sources = {
        path.relative_to(package.parent).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(package.rglob("*.py"))
    }
    effects = _effect_classes(sources)
    may_log = re.compile(
        "|".join([_MAY_LOG, *(rf"\b{re.escape(name)}\(" for name in sorted(effects))])
    )
    emits: list[Emit] = []
    made: list[Emit] = []
    dispatches: set[str] = set()
    for module, source in sources.items():
        if may_log.search(source):
            scan = _scan(source, module, effects)
            emits += scan.emits
            made += scan.effects
            dispatches |= scan.dispatches
    if made and not dispatches:
        raise CatalogError(
            f"{made[0].module}:{made[0].line}: a log effect, and no `getattr(log, level)(...)`"
            " logs effects"
        )
    logger = ", ".join(sorted(dispatches))
    return emits + [replace(e, logger=logger) for e in made]


# -- the page -----------------------------------------------------------------------------

HEADER = """# Log events

Every event `deltad` and `delta` log, one JSON line each (`event`, `level`, `logger`,
`timestamp` and the event's own keys; docs/daemon.md, "Logs"). Alert rules and tests match on
the `event` name. The event, level, logger and module columns are generated from the code by
`python -m deltad.logcatalog` (it keeps the meanings written here);
tests/unit_slow/test_log_catalog.py fails when the code emits an event this page does not list,
or the page lists one the code no longer emits.

| event | level | logger | module | meaning |
|---|---|---|---|---|
"""


def entries(emits: Iterable[Emit], meanings: dict[str, str]) -> list[Entry]:
    levels: dict[str, set[str]] = defaultdict(set)
    loggers: dict[str, set[str]] = defaultdict(set)
    modules: dict[str, set[str]] = defaultdict(set)
    for e in emits:
        levels[e.event].add(e.level)
        loggers[e.event].add(e.logger)
        modules[e.event].add(e.module)
    return [
        Entry(
            event,
            tuple(lv for lv in _ORDER if lv in levels[event]),
            tuple(sorted(loggers[event])),
            tuple(sorted(modules[event])),
            meanings.get(event) or TO_WRITE,
        )
        for event in sorted(levels)
    ]


def render(rows: Iterable[Entry]) -> str:
    lines = [HEADER.rstrip("\n")]
    for r in rows:
        cells = (
            f"`{r.event}`",
            ", ".join(r.levels),
            ", ".join(r.loggers),
            "<br>".join(r.modules),
            r.meaning.replace("|", "\\|"),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def read_page(text: str) -> dict[str, str]:
    """The page's rows: event name -> meaning (the last cell)."""
    rows: dict[str, str] = {}
    for number, line in enumerate(text.split("\n"), 1):
        m = _ROW.match(line)
        if m is None:
            continue
        cells = re.split(r"(?<!\\)\|", m["rest"])
        if len(cells) != 4:
            raise CatalogError(f"log-events.md:{number}: a row of {len(cells) + 1} cells, not 5")
        rows[m["event"]] = cells[-1].strip().replace("\\|", "|")
    return rows


@dataclass(frozen=True)
class Drift:
    missing: list[str]  # emitted, not in the page
    gone: list[str]  # in the page, not emitted
    unwritten: list[str]  # listed without a meaning

    def __bool__(self) -> bool:
        return bool(self.missing or self.gone or self.unwritten)

    def explain(self) -> str:
        parts = []
        if self.missing:
            parts.append(
                "emitted by the code, not in docs/log-events.md: " + ", ".join(self.missing)
            )
        if self.gone:
            parts.append("in docs/log-events.md, emitted nowhere: " + ", ".join(self.gone))
        if self.unwritten:
            parts.append("listed without a meaning: " + ", ".join(self.unwritten))
        parts.append(
            f"Fix: `{COMMAND}` rewrites the page from the code (keeping the meanings), then"
            f" write the meaning of each row that says {TO_WRITE!r}."
        )
        return "\n".join(parts)


def drift(emits: Iterable[Emit], page: dict[str, str]) -> Drift:
    names = {e.event for e in emits}
    return Drift(
        sorted(names - page.keys()),
        sorted(page.keys() - names),
        sorted(n for n, said in page.items() if n in names and said in ("", TO_WRITE)),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description="The log-event catalog, from the code.")
    ap.add_argument("--check", action="store_true", help="say what differs, change nothing")
    ap.add_argument("--page", type=Path, default=PAGE, help=f"the catalog (default: {PAGE})")
    args = ap.parse_args(argv)
    try:
        emits = emitted()
        old = read_page(args.page.read_text(encoding="utf-8")) if args.page.exists() else {}
    except (CatalogError, OSError) as e:
        print(f"logcatalog: {e}", file=sys.stderr)
        return 2
    if args.check:
        found = drift(emits, old)
        if found:
            print(found.explain(), file=sys.stderr)
            return 1
        return 0
    rows = entries(emits, old)
    args.page.write_text(render(rows), encoding="utf-8")
    unwritten = [r.event for r in rows if r.meaning == TO_WRITE]
    print(
        f"{args.page}: {len(rows)} events"
        + (f"; write the meaning of {', '.join(unwritten)}" if unwritten else "")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
