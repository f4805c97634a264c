"""What a resume is for (its key): resume backoff is per key (`decide.py`).

A resume "fails" when the child could not do its job (crash, timeout, usage error) or when it
exited and the very same answer is still waiting (the client did not take it). A different
answer, or a run that moved on, has another key and starts from scratch.
"""

from __future__ import annotations

from dataclasses import dataclass

AnswerSig = tuple[int, int, int]  # the answer file's (inode, size, mtime_ns)


# What a resume was for; a different key starts the backoff afresh.
@dataclass(frozen=True)
class AnswerKey:
    sig: AnswerSig | None


@dataclass(frozen=True)
class ExpiredKey:
    request_id: str | None


@dataclass(frozen=True)
class InterruptedKey:
    run_id: str | None


@dataclass(frozen=True)
class ModelRetryKey:
    run_id: str | None
    attempt: int


ResumeKey = AnswerKey | ExpiredKey | InterruptedKey | ModelRetryKey
