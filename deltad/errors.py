"""Client errors, each mapped to an exit code by the CLI. Messages are one line."""

from __future__ import annotations


class DeltaError(Exception):
    exit_code = 1


class UsageError(DeltaError):
    exit_code = 2


class UsageErrors(UsageError):
    """Several problems at once (a refused pipeline's): one `delta: error:` line each."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


class ConfigError(UsageError):
    """The agent definition is missing or invalid; names the file and the field."""


class LLMError(DeltaError):
    """The model endpoint failed in a way retries did not fix."""
