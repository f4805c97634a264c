"""Sensitive answers: stored 0600 under the run, referred to by handle everywhere else.

The model and the journal only ever see `${secret:<action_id>}`. The value is substituted
into tool arguments at execution time and redacted from tool output before it is recorded.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deltad.protocol import atomic_write, read_regular_text, safefs

HANDLE = re.compile(r"\$\{secret:([^}]{1,200})\}")


def handle(action_id: str) -> str:
    return f"${{secret:{action_id}}}"


class SecretStore:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._cache: dict[str, str] | None = None

    def _file(self, action_id: str) -> Path:
        return self.dir / hashlib.sha256(action_id.encode()).hexdigest()[:32]

    def put(self, action_id: str, value: str) -> None:
        atomic_write(self._file(action_id), value.encode("utf-8"))  # 0600 by the mode rule
        if self._cache is not None:
            self._cache[action_id] = value

    def get(self, action_id: str) -> str | None:
        try:
            return read_regular_text(self._file(action_id))
        except FileNotFoundError:
            return None

    def values(self) -> list[str]:
        if self._cache is None:
            self._cache = {}
            for name in safefs.listdir(self.dir):
                if not name.startswith("."):  # an atomic write's temp file
                    self._cache[name] = read_regular_text(self.dir / name)
        return [v for v in self._cache.values() if v]

    def reveal(self, args: Any) -> Any:
        """Replace handles in (nested) tool arguments with their values."""
        if isinstance(args, str):
            return HANDLE.sub(lambda m: self.get(m.group(1)) or m.group(0), args)
        if isinstance(args, dict):
            return {k: self.reveal(v) for k, v in args.items()}
        if isinstance(args, list):
            return [self.reveal(v) for v in args]
        return args

    def redactor(self) -> Callable[[str], str]:
        secrets = sorted(self.values(), key=len, reverse=True)

        def redact(text: str) -> str:
            for value in secrets:
                text = text.replace(value, "[REDACTED]")
            return text

        return redact
