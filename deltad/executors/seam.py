"""The job-handle seam: what any executor — local processes, Slurm, Kubernetes — offers the daemon.

Modelled on Airflow's `BaseExecutor` (queue, sync, adopt, terminate, with events coming back)
and Dagster's run launchers (the engine's view of a run, not a pid): the daemon never sees a pid,
a pidfd or a job id, only a `Handle` it got back for a `RequestKey` it chose before submitting.

- `submit(spec)` is idempotent on `spec.key`: the key is computed before anything is started and
  becomes the job's name on the engine (a Slurm job name, a Kubernetes Job name), so a daemon that
  crashed between submitting and recording finds the job again instead of starting a second one.
- `poll(now)` reports what changed: a job that started running (the resume timeout counts from
  then, not from the queue) and jobs that ended, each with its exit meaning or "unknown".
- `cancel(handle, grace)` asks the engine to stop a job: TERM, then KILL after `grace`.
- `adopt()` asks the engine itself which of this daemon's jobs still exist after a restart.
- `poll_every` is how often `poll` must be called when nothing is readable on `fds()` (engines
  without file descriptors); None when `fds()` tells everything.

Two optional methods, looked up with `due` and `reload` below (an executor without them needs
neither): `due(now)`, the wall-clock time at which `poll` has something to do that no fd will
announce (a cancel's SIGKILL after its grace, a Started not yet reported), and `reload()`, the
daemon's configuration was reloaded (SIGHUP: the fork server starts afresh for new jobs).
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Protocol, runtime_checkable

from deltad.protocol import exitcodes


@dataclass(frozen=True, order=True)
class RequestKey:
    """Which resume this is: the workspace, its run, the request being answered, the attempt.

    `name` is short, deterministic and safe as an engine-side name (DNS-1123 for Kubernetes,
    a Slurm job name): the same resume always gets the same name, another never does."""

    workspace: Path
    run_id: str
    request: str  # the request id answered (or the reason: "expired", "interrupted", ...)
    attempt: int = 0

    @property
    def name(self) -> str:
        digest = hashlib.sha256()
        for part in (os.fsencode(self.workspace), self.run_id.encode(), self.request.encode()):
            digest.update(len(part).to_bytes(4, "big") + part)
        digest.update(self.attempt.to_bytes(4, "big"))
        return f"deltad-{digest.hexdigest()[:20]}"

    @property
    def workspace_tag(self) -> str:
        """A label value that finds every job of one workspace (hash of its path's bytes)."""
        return hashlib.sha256(os.fsencode(self.workspace)).hexdigest()[:16]


@dataclass(frozen=True)
class Identity:
    """Whom a job runs as: the workspace owner (uid, gid, supplementary groups)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    user: str | None = None  # the login name, where the engine wants one (sbatch --uid)


@dataclass(frozen=True)
class JobSpec:
    """One resume to run: the command, where, as whom, with which environment, for how long."""

    key: RequestKey
    argv: Sequence[str]
    identity: Identity
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 3600.0  # seconds of running (not queueing) before the daemon cancels it
    log: Path | None = None  # where the job's own stdout/stderr go (written as the owner)
    # HA (deltad/daemon/lease.py): may this daemon still submit? An executor whose submit takes
    # time before the engine's own call (look-ups) asks it right before that call
    # (`check_fence`): a daemon frozen in between may have lost the lease meanwhile.
    fence: Callable[[], bool] | None = field(default=None, compare=False, repr=False)


def check_fence(spec: JobSpec) -> None:
    """Raise SubmitError when the spec's fence says this daemon may no longer submit."""
    if spec.fence is not None and not spec.fence():
        raise SubmitError("fenced: this daemon's HA lease was not confirmed right before submit")


@dataclass(frozen=True)
class Handle:
    """What the daemon keeps for a submitted job: its key and the engine's own id for it."""

    key: RequestKey
    executor: str  # the registry name of the executor that made it
    ref: str  # the engine's id: a pid and start ticks, a Slurm job id, a Job's uid
    # What the daemon's log lines say of the job besides its ref (a local process's `pid`);
    # not part of its identity.
    shown: tuple[tuple[str, int | str], ...] = field(default=(), compare=False)


class JobState(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"
    UNKNOWN = "unknown"  # the engine no longer knows it (purged, node lost)


@dataclass(frozen=True)
class Started:
    """A job began running at `at` (wall clock): its resume timeout counts from here."""

    handle: Handle
    at: float


@dataclass(frozen=True)
class Exit:
    """A job ended. `rc` as a process's: a code, -signal, or None when it is not known (an
    adopted job, a purged record): then what the run left on disk decides."""

    handle: Handle
    rc: int | None
    timed_out: bool = False
    detail: str = ""  # the engine's words (Slurm's State/Reason, a pod's terminated reason)

    @property
    def meaning(self) -> str:
        return exit_meaning(self.rc)


Event = Started | Exit


@runtime_checkable
class JobExecutor(Protocol):
    """What the daemon needs of an executor. Called from the main loop only (single-threaded)."""

    name: str
    poll_every: float | None

    def submit(self, spec: JobSpec) -> Handle:
        """Start `spec` unless a job with `spec.key` already exists (then its handle).
        Raises `SubmitError` with a one-line reason when the engine refuses."""
        ...

    def poll(self, now: float) -> list[Event]:
        """What changed since the last call: jobs that started running, jobs that ended."""
        ...

    def cancel(self, handle: Handle, grace: float) -> None:
        """Ask the engine to stop the job: TERM now, KILL after `grace` seconds."""
        ...

    def adopt(self) -> list[Handle]:
        """This daemon's jobs the engine still knows of (after a restart), running or queued."""
        ...

    def fds(self) -> list[int]:
        """Readable when `poll` has something to say (empty for engines without descriptors)."""
        ...

    def close(self) -> None:
        """Let go of the engine (jobs keep running; a restarted daemon adopts them)."""
        ...


class SubmitError(Exception):
    """The engine refused a job; the message is one line for the log."""


def exit_meaning(rc: int | None) -> str:
    """completed, failed, busy, waiting, killed_by_SIGTERM, ... or unknown (rc None)."""
    if rc is None:
        return "unknown"
    if rc < 0:
        try:  # a real-time signal (or an engine's odd status) has no name: "killed"
            return f"killed_by_{signal.Signals(-rc).name}"
        except ValueError:
            return "killed"
    return exitcodes.MEANING.get(rc, "unexpected")


def due(executor: JobExecutor, now: float) -> float | None:
    """When (wall clock) `poll` must be called although no fd is readable: the executor's
    optional `due(now)`; None when it has none or nothing is due."""
    hook = getattr(executor, "due", None)
    return hook(now) if hook is not None else None


def reload(executor: JobExecutor) -> None:
    """Tell the executor the configuration was reloaded, when it wants to know."""
    if (hook := getattr(executor, "reload", None)) is not None:
        hook()
