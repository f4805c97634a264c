"""The job-handle seam: what any executor — local processes, Slurm, Kubernetes — offers the daemon.

Modelled on Airflow's `BaseExecutor` (queue, sync, adopt, terminate, with events coming back)
and Dagster's run launchers (the engine's view of a run, not a pid): the daemon never sees a pid,
a pidfd or a job id, only a `Handle` it got back for a `RequestKey` it chose before submitting.

The contract (`deltad.testing.executor_contract` checks it; subclass `BaseJobExecutor` for the
optional members' defaults):

- Every method is called from the daemon's one loop and must return within milliseconds: an
  executor that talks to a remote engine does so from a worker of its own (`remote.py`) and
  tells the loop through `fds()` that `poll` has news. The loop never waits on an engine.
- Time given to the executor is monotonic (`clock.monotonic()`): `poll(now)` and `due(now)`
  take it and `due` returns it. Only `Started.at` is wall clock (an engine reports starts so).
- `submit(spec)` is idempotent on `spec.key`: the key is computed before anything is started, so
  a daemon that crashed between submitting and recording finds the job again instead of starting
  a second one. It raises `SubmitError` when the engine refuses now; an executor that submits
  from a worker reports a later refusal as a `Refused` event. Either way the resumer tries the
  resume again after a `Pacing` delay, and says so once.
- `poll(now)` reports what changed: a job that started running (`Started`: the resume timeout
  counts from then, not from the queue), jobs that ended (`Exit`, with its exit meaning or
  "unknown"), submits the engine refused (`Refused`).
- `cancel(handle, force)`: stop the job, with TERM (the engine's graceful stop) when `force` is
  False, KILL when True. The resumer owns the escalation: it sends `force=True` itself when no
  `Exit` came within its grace; an executor keeps no kill timer.
- `adopt()` asks the engine which of this daemon's jobs exist after a restart: queued, running
  and ended ones (the ended ones' `Exit` comes at the next `poll`, so a job that ended while no
  daemon ran is still judged). It raises `SubmitError` when the engine cannot be asked (the
  resumer asks again later) and `AdoptPending` while a worker's first answer is on its way.
- Only the jobs this daemon submitted are its own (`adopt`, `poll`, an idempotent `submit`):
  another user's job with a matching name or comment is never taken.
- Any exception from an executor fails that resume (or that one call) with a logged reason;
  it never ends the daemon. Still, `poll` should not raise on engine trouble: say it once.
- `poll_every` is how often `poll` must be called when nothing is readable on `fds()` (engines
  without file descriptors); None when `fds()` tells everything. `due(now)` is when `poll` has
  something to do that no fd will announce (a Started not yet reported); `reload()` says the
  daemon's configuration was reloaded (SIGHUP); `close()` lets go (jobs keep running).
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
    # HA (deltad/core/lease.py): may this daemon still submit? An executor whose submit takes
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


@dataclass(frozen=True)
class Refused:
    """The engine did not take a submitted job (an executor that submits from a worker); the
    resumer tries the resume again after a `Pacing` delay. `reason` is one line."""

    handle: Handle
    reason: str


Event = Started | Exit | Refused


@runtime_checkable
class JobExecutor(Protocol):
    """What the daemon needs of an executor (the module's docstring is the contract). Called
    from the daemon's one loop only; every call returns within milliseconds."""

    name: str
    poll_every: float | None

    def submit(self, spec: JobSpec) -> Handle:
        """Start `spec` unless a job with `spec.key` already exists (then its handle).
        Raises `SubmitError` with a one-line reason when the engine refuses."""
        ...

    def poll(self, now: float) -> list[Event]:
        """What changed since the last call (`now` is monotonic): Started, Exit, Refused."""
        ...

    def cancel(self, handle: Handle, force: bool) -> None:
        """Stop the job: TERM (graceful) when `force` is False, KILL when True. The resumer
        escalates; an unknown or ended handle is no error."""
        ...

    def adopt(self) -> list[Handle]:
        """This daemon's jobs the engine still knows of (after a restart), queued, running or
        ended (an ended one's Exit comes at the next poll)."""
        ...

    def fds(self) -> list[int]:
        """Readable when `poll` has something to say (empty for engines without descriptors)."""
        ...

    def due(self, now: float) -> float | None:
        """When (monotonic) `poll` must be called although no fd is readable; None: no need."""
        ...

    def reload(self) -> None:
        """The daemon's configuration was reloaded."""
        ...

    def close(self) -> None:
        """Let go of the engine (jobs keep running; a restarted daemon adopts them)."""
        ...


class BaseJobExecutor:
    """Defaults for the optional members: subclass it and write `submit`, `poll`, `cancel`
    (and `adopt` when the engine outlives the daemon)."""

    name: str = "unnamed"
    poll_every: float | None = None
    # HA (deltad/core/lease.py), set by the daemon when it makes the executor: may this daemon
    # act on its engine now? An executor that acts outside a submit (lets a parked job go,
    # cancels a job nobody tracks) asks it first; a submit asks its spec's own `fence`.
    fence: Callable[[], bool] | None = None

    def submit(self, spec: JobSpec) -> Handle:
        raise NotImplementedError

    def poll(self, now: float) -> list[Event]:
        raise NotImplementedError

    def cancel(self, handle: Handle, force: bool) -> None:
        raise NotImplementedError

    def adopt(self) -> list[Handle]:
        return []

    def fds(self) -> list[int]:
        return []

    def due(self, now: float) -> float | None:
        return None

    def reload(self) -> None:
        return None

    def close(self) -> None:
        return None

    def counts(self) -> Mapping[str, int]:
        """What the executor counts on its engine's side, as totals by event name (a watch's
        re-lists and restarts...): /metrics shows them (`deltad_executor_engine_events`).
        Read from the scraping thread: a copy made under the executor's own lock."""
        return {}


class SubmitError(Exception):
    """The engine refused a job (or could not be asked); the message is one line for the log.
    `permanent`: asking again cannot help (a workspace the engine cannot mount, a root-owned
    one): the resumer does not retry it; else it does, after a `Pacing` delay."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class AdoptPending(SubmitError):
    """`adopt()` before the executor's worker has its first answer from the engine: asked again
    when `fds()` says there is news (not an outage: logged quietly)."""


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
