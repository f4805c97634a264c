"""A resume's command line from its template (`resume_command`): used by the config (which
executor `auto` means) and by the resumer; a module of its own so that neither imports the
other for it."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["build_argv", "resolve_program"]


def resolve_program(name: str) -> str:
    """`delta` next to this interpreter first (the same virtualenv), then PATH."""
    if os.sep in name:
        return name
    sibling = Path(sys.executable).parent / name
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    return shutil.which(name) or name


def build_argv(template: list[str], workspace: Path, run_id: str | None) -> list[str]:
    argv = [
        part.replace("{workspace}", str(workspace)).replace("{run_id}", run_id or "")
        for part in template
    ]
    argv[0] = resolve_program(argv[0])
    return argv
