"""A new process per resume: `resume_command` started with Popen as the workspace's owner.

`fresh` is the client itself (`delta run`); `command` is the same mechanism for a template
that wraps it (`systemd-run --wait ...`): the exit code is the wrapper's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from deltad.clock import SYSTEM, Clock

from .local import LocalJobs, Proc, switch_to
from .registry import LocalFactory
from .seam import JobSpec, SubmitError


class FreshExecutor(LocalJobs):
    name = "fresh"

    def __init__(self, state_dir: Path, clock: Clock = SYSTEM) -> None:
        super().__init__(state_dir, clock)
        self._popen: dict[int, subprocess.Popen[bytes]] = {}  # our children, by pid

    def start(self, spec: JobSpec, log_fd: int) -> tuple[int, str]:
        return self.popen(spec, log_fd), self.name

    def popen(self, spec: JobSpec, log_fd: int) -> int:
        switch = switch_to(spec.identity, os.geteuid())
        try:
            proc = subprocess.Popen(
                list(spec.argv),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                cwd=spec.key.workspace,
                env=dict(spec.env),
                user=switch.uid if switch else None,
                group=switch.gid if switch else None,
                extra_groups=list(switch.groups) if switch else None,
                umask=0o077,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            raise SubmitError(f"{spec.argv[0]}: {e.strerror or e}") from None
        self._popen[proc.pid] = proc
        return proc.pid

    def collect(self, proc: Proc) -> None:
        child = self._popen.get(proc.pid)
        if child is None:
            super().collect(proc)
            return
        rc = child.poll()
        if rc is not None:
            del self._popen[proc.pid]
            proc.rc, proc.exited = rc, True

    def close(self) -> None:
        self._popen.clear()  # they run on; the next daemon adopts them
        super().close()


class CommandExecutor(FreshExecutor):
    name = "command"


make_fresh = LocalFactory("fresh", FreshExecutor)
make_command = LocalFactory("command", CommandExecutor)
