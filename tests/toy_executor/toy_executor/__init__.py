"""A toy `JobExecutor`: each job a local process, found again by its key, seen only by polling.

It knows nothing of the daemon but what `deltad.executors` exports: it is what a third-party
executor looks like (`tests/contract` runs `deltad.testing.executor_contract` over it). Its
factory declares `options_model`, so the daemon validates `executors: {toy: ...}` when it reads
its config (a misspelt key is one line naming the closest option) and the factory gets the
model. Option `journal`: a file where it appends one JSON line per thing it did (submitted,
started, ended), so a test can tell it was used.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from deltad.executors import (
    BaseJobExecutor,
    Event,
    ExecutorOptions,
    Exit,
    Handle,
    JobSpec,
    Started,
    SubmitError,
)


class ToyOptions(ExecutorOptions):
    journal: Path | None = None


class ToyExecutor(BaseJobExecutor):
    name = "toy"
    poll_every: float | None = 0.05  # no descriptors: the daemon polls

    def __init__(self, journal: Path | None) -> None:
        self.journal = journal
        self.jobs: dict[str, tuple[Handle, subprocess.Popen[bytes]]] = {}
        self.unstarted: set[str] = set()

    def _note(self, what: str, handle: Handle, **more: Any) -> None:
        if self.journal is not None:
            row = {"what": what, "name": handle.key.name, "workspace": str(handle.key.workspace)}
            with self.journal.open("a") as f:
                f.write(json.dumps(row | more) + "\n")

    def submit(self, spec: JobSpec) -> Handle:
        if (known := self.jobs.get(spec.key.name)) is not None:
            return known[0]  # idempotent on the key
        who = spec.identity
        try:
            proc = subprocess.Popen(
                list(spec.argv),
                cwd=spec.key.workspace,
                env=dict(spec.env),
                user=who.uid,
                group=who.gid,
                extra_groups=list(who.groups),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            raise SubmitError(f"toy: cannot start {spec.argv[0]}: {e.strerror}") from None
        handle = Handle(spec.key, self.name, str(proc.pid))
        self.jobs[spec.key.name] = (handle, proc)
        self.unstarted.add(spec.key.name)
        self._note("submitted", handle)
        return handle

    def poll(self, now: float) -> list[Event]:
        events: list[Event] = []
        for name, (handle, proc) in list(self.jobs.items()):
            if name in self.unstarted:
                self.unstarted.discard(name)
                events.append(Started(handle, time.time()))  # Started.at is wall clock
                self._note("started", handle)
            if (rc := proc.poll()) is not None:
                del self.jobs[name]
                events.append(Exit(handle, rc))
                self._note("ended", handle, rc=rc)
        return events

    def cancel(self, handle: Handle, force: bool) -> None:
        if (job := self.jobs.get(handle.key.name)) is not None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.killpg(job[1].pid, signal.SIGKILL if force else signal.SIGTERM)

    def close(self) -> None:
        self.jobs.clear()


def make(options: ToyOptions) -> ToyExecutor:
    return ToyExecutor(options.journal)


make.options_model = ToyOptions  # type: ignore[attr-defined]
