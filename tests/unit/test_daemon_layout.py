"""deltad/daemon has no import circle: each module's imports (at the top, inside functions and
under TYPE_CHECKING alike) read with `ast`, and the graph among the package's modules checked
for a cycle. The loop's parts are objects composed by the service (`Lifecycle`, `Walker`), not
modules that import it back."""

from __future__ import annotations

import ast
from pathlib import Path

import deltad.core

PACKAGE = "deltad.core"


def imports_within(package_dir: Path, package: str) -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports, however it imports."""
    mods = {
        package if p.stem == "__init__" else f"{package}.{p.stem}": p
        for p in package_dir.glob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        here = name if path.stem == "__init__" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = here.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                names = [target, *(f"{target}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found |= {n for n in names if n in mods and n != name}
        graph[name] = found
    return graph


def a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return [*path[path.index(d) :], d]
            if d not in state and (found := visit(d)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_the_daemon_package_has_no_import_circle() -> None:
    graph = imports_within(Path(deltad.core.__file__).parent, PACKAGE)
    assert graph.get(f"{PACKAGE}.service")  # it did read them
    assert a_cycle(graph) is None, " -> ".join(a_cycle(graph) or [])


def test_the_check_finds_a_circle_through_type_checking_and_a_function(tmp_path: Path) -> None:
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n"
    )
    (tmp_path / "c.py").write_text("def f():\n    from pkg.a import x\n")
    graph = imports_within(tmp_path, "pkg")
    assert a_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    (tmp_path / "c.py").write_text("import os\n")
    assert a_cycle(imports_within(tmp_path, "pkg")) is None
