"""Asking on the terminal (`delta run -i`). Piped stdin works; EOF means "no answer here"."""

from __future__ import annotations

import getpass
from typing import TextIO

from deltad.protocol import InputType, InteractionRequest

YES = {"y", "yes"}
NO = {"n", "no"}


def normalize_confirmation(text: str) -> str | None:
    word = text.strip().lower()
    return "yes" if word in YES else "no" if word in NO else None


class Console:
    def __init__(self, stdin: TextIO, stdout: TextIO) -> None:
        self.stdin = stdin
        self.stdout = stdout

    def _read(self, hidden: bool) -> str | None:
        if hidden and self.stdin.isatty():
            try:
                return getpass.getpass("> ", stream=self.stdout)
            except EOFError:
                return None
        self.stdout.write("> ")
        self.stdout.flush()
        line = self.stdin.readline()
        return None if line == "" else line.rstrip("\r\n")

    def ask(self, req: InteractionRequest) -> str | None:
        self.stdout.write(f"\n[ask_human] {req.prompt}\n")
        if req.input_type == InputType.CONFIRMATION:
            while True:
                self.stdout.write("Please answer yes or no.\n")
                line = self._read(hidden=False)
                if line is None:
                    return None
                if (answer := normalize_confirmation(line)) is not None:
                    return answer
        answer = self._read(hidden=req.is_secret)
        if answer is None:
            return None
        return answer if req.is_secret else answer.strip()
