"""What a run's metadata says about it, decided once for both programs.

`delta` (under the workspace lock) and `deltad` (watching) must agree on what a run is: a
RUNNING run whose owner process is dead is an interrupted run, whoever notices first, and both
write the same INTERRUPTED with the same wording (`mark_owner_dead`).

A RUNNING run on another host is never judged from this host's /proc: the daemon judges it from
its executor's job for that run (`job_fact`, `judge_elsewhere`), and writes INTERRUPTED with
its own wording when that job ended and the run still says RUNNING (`mark_job_ended`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from . import exitcodes
from .metadata import transition
from .models import RunMetadata
from .process import owner_alive
from .states import RunStatus


class RunFact(StrEnum):
    WAITING = "waiting"  # a question is out
    RUNNING = "running"  # its owner is alive
    ELSEWHERE = "elsewhere"  # RUNNING on another host: not decidable here
    OWNER_DEAD = "owner_dead"  # RUNNING, but nobody runs it: to be marked INTERRUPTED
    JOB_ENDED = "job_ended"  # RUNNING elsewhere, its job ended: to be marked INTERRUPTED
    UNKNOWN = "unknown"  # RUNNING elsewhere, and the job's engine could not be asked
    INTERRUPTED = "interrupted"
    FINISHED = "finished"  # completed, failed or canceled


def judge(meta: RunMetadata, *, locked: bool = False) -> RunFact:
    """`locked`: the caller holds the workspace lock, so no live client can be driving the
    run and RUNNING means its owner died (whatever /proc says of a recycled pid)."""
    match meta.status:
        case RunStatus.WAITING_FOR_INPUT:
            return RunFact.WAITING
        case RunStatus.INTERRUPTED:
            return RunFact.INTERRUPTED
        case RunStatus.RUNNING if locked:
            return RunFact.OWNER_DEAD
        case RunStatus.RUNNING:
            alive = owner_alive(meta.owner)
            if alive is None:
                return RunFact.ELSEWHERE
            return RunFact.RUNNING if alive else RunFact.OWNER_DEAD
        case _:
            return RunFact.FINISHED


def owner_gone(meta: RunMetadata) -> str:
    """The one wording of a dead owner (metadata `error`, the client's journal line)."""
    who = f"process {meta.owner.pid}" if meta.owner else "its process"
    return f"{who} stopped without finishing (crash or kill -9)"


def mark_owner_dead(path: Path, meta: RunMetadata, workspace: Path) -> RunMetadata:
    """RUNNING → INTERRUPTED for a dead owner; the caller holds the workspace lock."""
    return transition(
        path, meta, RunStatus.INTERRUPTED, workspace=str(workspace), error=owner_gone(meta)
    )


# -- runs on other hosts: judged from the executor's job ---------------------------------------
class JobFact(StrEnum):
    """What the daemon's executor knows of the job that runs a run on another host."""

    ACTIVE = "active"  # its job is queued or running
    ENDED = "ended"  # its job ended (or the engine lost it) while this daemon watched
    NONE = "none"  # no job of this daemon's runs it (a person's `delta run` there)
    UNREACHABLE = "unreachable"  # the engine could not say which jobs exist


@dataclass(frozen=True)
class RemoteOwner:
    """Who a RUNNING run on another host says runs it."""

    run_id: str
    host: str
    pid: int


@dataclass(frozen=True)
class JobEnd:
    """The last job of a workspace this daemon saw end, with the owner the run named when it
    ended (None: not RUNNING elsewhere then), its exit code (None: unknown) and how it ended."""

    owner: RemoteOwner | None
    rc: int | None
    detail: str = ""


def job_fact(
    owner: RemoteOwner, *, in_flight: bool, ended: JobEnd | None, engine_answered: bool
) -> JobFact:
    """The job fact of the run `owner` names. The job's end counts only for the owner the run
    named when the job ended (a `delta run` that took the run over since is another process),
    and only when the job died under the client (`died_under_client`)."""
    if in_flight:
        return JobFact.ACTIVE
    if ended is not None and ended.owner == owner and died_under_client(ended.rc):
        return JobFact.ENDED
    return JobFact.NONE if engine_answered else JobFact.UNREACHABLE


def died_under_client(rc: int | None) -> bool:
    """A job's exit that says its client did not finish its turn: killed by a signal, an
    unknown end (a lost node, a deleted or purged job), a code that is not `delta`'s. With one
    of `delta`'s own codes the client settled the run itself (or, busy, never took it): a run
    still seen RUNNING then is another process's, or a stale read of a network filesystem."""
    return rc is None or rc not in exitcodes.MEANING


def judge_elsewhere(job: JobFact) -> RunFact:
    """A RUNNING run on another host, from its job: alive while the job is; dead once it ended
    (the engine stops every process of a job that ends); otherwise not decidable here."""
    match job:
        case JobFact.ACTIVE:
            return RunFact.RUNNING
        case JobFact.ENDED:
            return RunFact.JOB_ENDED
        case JobFact.UNREACHABLE:
            return RunFact.UNKNOWN
        case _:
            return RunFact.ELSEWHERE


@dataclass(frozen=True)
class Elsewhere:
    """The owner a RUNNING run on another host was judged by, and why it is dead: re-checked
    under the workspace lock before anything is written."""

    owner: RemoteOwner
    why: str  # "job deltad-… ended: killed_by_SIGKILL"


def remote_owner(meta: RunMetadata) -> RemoteOwner | None:
    """The owner of a RUNNING run on another host; None for any other run."""
    if judge(meta) is not RunFact.ELSEWHERE or meta.owner is None:
        return None
    return RemoteOwner(meta.run_id, meta.owner.hostname, meta.owner.pid)


def still_elsewhere(meta: RunMetadata, seen: Elsewhere) -> bool:
    """The run still says RUNNING, owned by the same process on the same other host."""
    return remote_owner(meta) == seen.owner


def job_gone(meta: RunMetadata, why: str) -> str:
    """The one wording of a run whose job ended under it (metadata `error`)."""
    host = meta.owner.hostname if meta.owner else "another host"
    who = f"process {meta.owner.pid} on {host}" if meta.owner else "its process"
    return f"{who} stopped without finishing: {why}"


def mark_job_ended(path: Path, meta: RunMetadata, workspace: Path, why: str) -> RunMetadata:
    """RUNNING → INTERRUPTED for a run whose job ended; the caller holds the workspace lock."""
    return transition(
        path, meta, RunStatus.INTERRUPTED, workspace=str(workspace), error=job_gone(meta, why)
    )
