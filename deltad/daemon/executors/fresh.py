"""A new process per resume: `resume_command` started with Popen as the workspace's owner.

`fresh` is the client itself (`delta run`); `command` is the same mechanism for a template
that wraps it (`systemd-run --wait ...`): the exit code is the wrapper's.
"""

from __future__ import annotations

import os
import subprocess

import structlog

from deltad.protocol.printable import show_path

from .base import Child, Job, Tracker
from .registry import LocalFactory

log = structlog.get_logger("deltad.resumer")


class FreshExecutor(Tracker):
    name = "fresh"

    def __init__(self, max_parallel: int) -> None:
        super().__init__(max_parallel)
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    def submit(self, job: Job) -> Child | None:
        if (running := self.children.get(job.workspace)) is not None:
            return running
        out = open_log(job)
        who = job.launch.identity
        try:
            proc = subprocess.Popen(
                job.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                cwd=job.workspace,
                env=job.launch.env,
                user=who.user,
                group=who.group,
                extra_groups=who.extra_groups,
                umask=0o077,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            spawn_failed(job, e.strerror or str(e))
            return None
        finally:
            if out >= 0:
                os.close(out)
        self._procs[proc.pid] = proc
        return self.track(job, proc.pid)

    def collect(self, child: Child) -> None:
        proc = self._procs.get(child.pid)
        if proc is None:
            super().collect(child)
            return
        rc = proc.poll()
        if rc is not None:
            del self._procs[child.pid]
            child.exit_code, child.exited = rc, True

    def forget_processes(self) -> None:
        self._procs.clear()

    def detach_all(self) -> list[int]:
        self.forget_processes()
        return super().detach_all()


class CommandExecutor(FreshExecutor):
    name = "command"


def open_log(job: Job) -> int:
    """The child's stdout/stderr: the append-only resume log, or /dev/null if it cannot be
    opened (logged). The caller closes it once the child has its copy."""
    if job.log is not None:
        try:
            job.log.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(job.log, flags, 0o600)
            os.write(fd, f"--- {_now()} resume {show_path(job.workspace)}\n".encode())
            return fd
        except OSError as e:
            log.error("resume_log_unavailable", workspace=str(job.workspace), error=e.strerror)
    return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)


def spawn_failed(job: Job, error: str) -> None:
    log.error(
        "resume_spawn_failed",
        workspace=str(job.workspace),
        run_id=job.run_id,
        program=job.argv[0],
        error=error,
    )


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


make_fresh = LocalFactory("fresh", FreshExecutor)
make_command = LocalFactory("command", CommandExecutor)
