"""deltad/'s import graph, read with `ast` from the source (tests/unit/test_layers.py's rules):
every import counts, at the top, inside a function or under TYPE_CHECKING alike."""

from __future__ import annotations

import ast
from pathlib import Path

import deltad

ROOT = Path(deltad.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def parse() -> dict[str, list[str]]:
    """Each module of deltad/ -> the deltad modules (or packages) it imports (sorted)."""
    files = {_module_name(p): p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts}
    graph: dict[str, list[str]] = {}
    for name, path in files.items():
        is_pkg = path.stem == "__init__"
        here = name if is_pkg else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(here.split(".")[: len(here.split(".")) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                candidates = [f"{target}.{a.name}" for a in node.names]
                found |= {c for c in candidates if c in files} or ({target} & set(files))
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in files}
        found.discard(name)
        graph[name] = sorted(found)
    return graph
