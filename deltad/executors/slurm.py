"""`executor: slurm` — each resume is one Slurm batch job, run as the workspace owner.

Driven through Slurm's own commands (no Python binding matches Debian 12's Slurm 22.05):
argv lists, never a shell, a timeout on every call. The job's name is the request key's name and
its comment carries this daemon's id and the key, so a restarted daemon finds its jobs in Slurm
(`adopt`) and a second submit of one key finds the first job (`submit` is idempotent, by
looking the name up first). Values of the job's environment never appear in any argv: sbatch
gets exactly the spec's environment as its own (`--export=ALL`) and reads the script on stdin.

Decisions are pure functions (argv, script, comment, output parsing, exit meaning), tested from
tables; `SlurmExecutor` is the thin shell that runs the commands.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from pydantic import ConfigDict, Field, field_validator

from deltad.protocol.printable import show_path
from deltad.validation import dir_problem

from .registry import ExecutorOptions, validate
from .seam import (
    Event,
    Exit,
    Handle,
    Identity,
    JobSpec,
    RequestKey,
    Started,
    SubmitError,
    check_fence,
)

log = structlog.get_logger("deltad.executors.slurm")

NAME = "slurm"
COMMENT_PREFIX = "deltad1"
# squeue's long format: the comment last and unbounded (`:0`), so '|' in it cannot shift fields.
SQUEUE_FORMAT = "JobID:|,Name:|,State:|,StartTime:|,exit_code:|,Reason:|,NodeList:|,Comment:0"
QUEUED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"})
# Ends whose exit code is the job's own (a code, or the signal that ended it).
EXITED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY", "TIMEOUT"})
# Every other end (NODE_FAIL, PREEMPTED, BOOT_FAIL, DEADLINE, REVOKED, ...) is "unknown":
# what the run left on disk decides, as for an adopted child.
_DAEMON_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class SlurmError(Exception):
    """A Slurm command failed, was missing, or did not answer; the message is one line."""


class SlurmConfigError(ValueError):
    """`executors: {slurm: ...}` is unusable; the message is one line."""


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


class SlurmOptions(ExecutorOptions):
    """The options under `executors: {slurm: {...}}` (README and docs/daemon.md)."""

    model_config = ConfigDict(populate_by_name=True)  # keys as written, or the field names

    log_dir: Path  # per-owner 0700 directories of job logs, on the shared filesystem
    daemon_id: str = Field(default_factory=_short_hostname)
    partition: str | None = None
    account: str | None = None
    extra_args: tuple[str, ...] = ()  # more sbatch options, e.g. ("--qos=hitl",)
    poll_every: float = Field(default=0.5, ge=0.05, strict=True)
    # added to the resume timeout for Slurm's --time backstop
    time_margin: float = Field(default=300.0, ge=0, strict=True, alias="time_margin_seconds")
    command_timeout: float = Field(default=30.0, ge=1, strict=True, alias="command_timeout_seconds")
    slurm_conf: Path | None = None  # SLURM_CONF for the commands; None: Slurm's default
    bin_dir: Path | None = None  # where sbatch & co. are; None: the daemon's PATH

    @field_validator("log_dir", "slurm_conf", "bin_dir", mode="before")
    @classmethod
    def _absolute(cls, v: object) -> object:
        if not isinstance(v, str | Path) or not str(v).startswith("/"):
            raise ValueError("an absolute path")
        return v

    @field_validator("log_dir")
    @classmethod
    def _no_patterns(cls, v: Path) -> Path:
        if "%" in str(v) or "\\" in str(v):  # sbatch's filename patterns
            raise ValueError("'%' and '\\' are not allowed")
        return v

    @field_validator("daemon_id")
    @classmethod
    def _daemon_id(cls, v: str) -> str:
        if not _DAEMON_ID.fullmatch(v):
            raise ValueError("1 to 64 of letters, digits, '.', '_' or '-'")
        return v

    @field_validator("partition", "account")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and (not v or any(c.isspace() for c in v)):
            raise ValueError("a name without spaces")
        return v


@dataclass(frozen=True)
class JobRow:
    """One line of squeue's output."""

    job_id: str
    name: str
    state: str
    start: float | None  # wall clock, None before the job started
    status: int  # the raw wait status Slurm keeps (ExitCode rc:sig)
    reason: str
    nodes: str  # where it ran; empty for a job that never ran (a cancelled one has a StartTime)
    comment: str


# --- configuration ------------------------------------------------------------------------


def make_slurm_executor(options: SlurmOptions | Mapping[str, Any]) -> SlurmExecutor:
    """The executor for `executors: {slurm: OPTIONS}` (validated by the registry through
    `options_model` when the config is read; a mapping, as a direct caller may give, here)."""
    return SlurmExecutor(options if isinstance(options, SlurmOptions) else parse_options(options))


def parse_options(options: Mapping[str, Any]) -> SlurmOptions:
    """The options, checked: a wrong one is a one-line `SlurmConfigError` naming the key."""
    return validate(SlurmOptions, NAME, options, SlurmConfigError)


def preflight(options: SlurmOptions) -> None:
    """What `serve` would fail on, checked without running anything: the log directory can be
    made or written, Slurm's commands are there, the named slurm.conf is a file."""
    if (problem := dir_problem(options.log_dir)) is not None:
        raise SlurmConfigError(f"executors.slurm.log_dir: {problem}")
    if options.slurm_conf is not None and not options.slurm_conf.is_file():
        raise SlurmConfigError(f"executors.slurm.slurm_conf: {options.slurm_conf} is no file")
    for tool in ("sbatch", "squeue", "scancel"):
        if options.bin_dir is not None:
            if not os.access(options.bin_dir / tool, os.X_OK):
                raise SlurmConfigError(f"executors.slurm.bin_dir: no {tool} in {options.bin_dir}")
        elif shutil.which(tool) is None:
            raise SlurmConfigError(
                f"executors.slurm.bin_dir: {tool} is not on PATH (install Slurm's client "
                "commands, or set bin_dir)"
            )


make_slurm_executor.options_model = SlurmOptions  # type: ignore[attr-defined]
make_slurm_executor.preflight = preflight  # type: ignore[attr-defined]


# --- pure decisions -----------------------------------------------------------------------


def comment_for(key: RequestKey, daemon_id: str) -> str:
    """`deltad1:<daemon id>:<base64url JSON>`: no spaces, any workspace bytes kept exactly."""
    payload = {
        "ws": base64.urlsafe_b64encode(os.fsencode(key.workspace)).decode(),
        "run": key.run_id,
        "req": key.request,
        "n": key.attempt,
    }
    packed = json.dumps(payload, separators=(",", ":")).encode()
    return f"{COMMENT_PREFIX}:{daemon_id}:{base64.urlsafe_b64encode(packed).decode()}"


def key_from_comment(comment: str, daemon_id: str) -> RequestKey | None:
    """The key a comment of this daemon names; None for another daemon's or a foreign job."""
    prefix, _, rest = comment.partition(":")
    owner, _, packed = rest.partition(":")
    if prefix != COMMENT_PREFIX or owner != daemon_id:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(packed.encode()))
        workspace = os.fsdecode(base64.urlsafe_b64decode(payload["ws"].encode()))
        key = RequestKey(Path(workspace), payload["run"], payload["req"], int(payload["n"]))
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        return None
    if not isinstance(key.run_id, str) or not isinstance(key.request, str):
        return None
    return key


def time_limit(timeout: float, margin: float) -> str:
    """Slurm's --time in whole minutes (rounded up): the backstop when no daemon is alive."""
    return str(max(1, math.ceil((timeout + margin) / 60)))


def log_path(spec: JobSpec, log_dir: Path) -> Path:
    return (
        spec.log
        if spec.log is not None
        else log_dir / str(spec.identity.uid) / f"{spec.key.name}.log"
    )


def sbatch_argv(sbatch: str, spec: JobSpec, opts: SlurmOptions) -> list[str]:
    """The sbatch command for `spec`; the script comes on stdin, the environment as sbatch's."""
    ident = spec.identity
    argv = [
        sbatch,
        "--parsable",
        f"--uid={ident.uid}",
        f"--gid={ident.gid}",
        f"--chdir={os.fsdecode(spec.key.workspace)}",
        f"--job-name={spec.key.name}",
        f"--comment={comment_for(spec.key, opts.daemon_id)}",
        "--export=ALL",
        f"--output={log_path(spec, opts.log_dir)}",
        "--open-mode=append",
        "--no-requeue",
        "--ntasks=1",
        f"--time={time_limit(spec.timeout, opts.time_margin)}",
    ]
    if opts.partition:
        argv.append(f"--partition={opts.partition}")
    if opts.account:
        argv.append(f"--account={opts.account}")
    return [*argv, *opts.extra_args]


def batch_script(argv: Sequence[str]) -> bytes:
    """The job's script: owner-only files, no stdin, then the resume itself."""
    command = " ".join(shlex.quote(a) for a in argv)
    return os.fsencode(f"#!/bin/sh\numask 077\nexec {command} </dev/null\n")


def parse_start(text: str) -> float | None:
    """squeue's StartTime (printed in UTC: the commands run with TZ=UTC) as wall clock."""
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return None  # N/A, Unknown, None: not started


def parse_jobs(text: str) -> list[JobRow]:
    """squeue -h -O SQUEUE_FORMAT; lines that do not fit are skipped, never guessed at."""
    rows = []
    for line in text.splitlines():
        parts = line.split("|", 7)
        if len(parts) != 8 or not parts[0].strip().isdigit():
            continue
        job_id, name, state, start, status, reason, nodes, comment = (p.strip() for p in parts)
        try:
            raw = int(status)
        except ValueError:
            raw = 0
        # "CANCELLED by 0" in some versions: the first word is the state.
        state = state.split()[0] if state else ""
        when = parse_start(start) if nodes else None  # a never-run job's is its end
        rows.append(JobRow(job_id, name, state, when, raw, reason, nodes, comment))
    return rows


def rc_from_status(status: int) -> int:
    """A wait status as a process's exit: the code, or -signal."""
    sig = status & 0x7F
    return -sig if sig else (status >> 8) & 0xFF


def exit_of(row: JobRow, started: bool) -> tuple[int | None, bool] | None:
    """(rc, timed_out) if the row's job has ended, None while it is queued or running."""
    if row.state in QUEUED or row.state in RUNNING:
        return None
    if row.state not in EXITED:
        return None, False
    if row.state == "CANCELLED" and not started and not row.nodes:
        return None, False  # cancelled in the queue: it never ran
    return rc_from_status(row.status), row.state == "TIMEOUT"


def events_for(handle: Handle, row: JobRow | None, started: bool) -> list[Event]:
    """What one poll says about one job: Started once it runs, Exit once it ended."""
    if row is None:
        return [Exit(handle, None, detail="unknown to Slurm")]
    out: list[Event] = []
    ended = exit_of(row, started)
    if not started and row.start is not None and (row.state in RUNNING or ended is not None):
        out.append(Started(handle, row.start))
    if ended is not None:
        rc, timed_out = ended
        out.append(Exit(handle, rc, timed_out=timed_out, detail=f"{row.state} {row.reason}"))
    return out


def newest(rows: Sequence[JobRow], name: str) -> JobRow | None:
    mine = [r for r in rows if r.name == name]
    return max(mine, key=lambda r: int(r.job_id)) if mine else None


def one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# --- the shell ----------------------------------------------------------------------------


@dataclass
class _Tracked:
    handle: Handle
    started: bool = False
    kill_at: float | None = None  # monotonic time of the KILL after a TERM


class SlurmExecutor:
    """`JobExecutor` on Slurm. Called from the daemon's main loop only (single-threaded)."""

    name = NAME

    def __init__(self, options: SlurmOptions) -> None:
        self.opts = options
        self.poll_every: float | None = options.poll_every
        self._jobs: dict[str, _Tracked] = {}
        self._next_poll = 0.0
        self._poll_error = ""

    # the commands

    def _bin(self, tool: str) -> str:
        if self.opts.bin_dir is not None:
            return str(self.opts.bin_dir / tool)
        return shutil.which(tool) or tool

    def _base_env(self) -> dict[str, str]:
        env = {"TZ": "UTC", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if self.opts.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.opts.slurm_conf)
        elif "SLURM_CONF" in os.environ:
            env["SLURM_CONF"] = os.environ["SLURM_CONF"]
        return env

    def _run(
        self,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> str:
        tool = os.path.basename(argv[0])
        try:
            done = subprocess.run(
                argv,
                input=stdin if stdin is not None else b"",
                capture_output=True,
                env=dict(env) if env is not None else self._base_env(),
                timeout=self.opts.command_timeout,
                umask=0o077,
                check=False,
            )
        except FileNotFoundError:
            raise SlurmError(f"{tool} not found: install Slurm's client commands") from None
        except PermissionError:
            raise SlurmError(f"{tool}: permission denied") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{tool} did not answer in {self.opts.command_timeout:g} s") from None
        if done.returncode != 0:
            why = one_line(done.stderr.decode(errors="replace")) or f"exit {done.returncode}"
            raise SlurmError(f"{tool}: {why}")
        return done.stdout.decode(errors="surrogateescape")

    def _squeue(self, *selection: str) -> list[JobRow]:
        argv = [self._bin("squeue"), "-h", "--states=all", *selection, "-O", SQUEUE_FORMAT]
        return parse_jobs(self._run(argv))

    # JobExecutor

    def submit(self, spec: JobSpec) -> Handle:
        try:
            existing = newest(self._squeue(f"--name={spec.key.name}"), spec.key.name)
            if existing is not None:
                log.info("slurm_job_found", job=existing.job_id, name=spec.key.name)
                return self._track(spec.key, existing.job_id)
            self._owner_dir(log_path(spec, self.opts.log_dir).parent, spec.identity)
            # The job's environment is sbatch's: the spec's exactly, plus where Slurm is.
            conf = {k: v for k, v in self._base_env().items() if k == "SLURM_CONF"}
            env = {**spec.env, **conf}
            argv = sbatch_argv(self._bin("sbatch"), spec, self.opts)
            check_fence(spec)  # after the look-ups: a daemon frozen meanwhile submits nothing
            out = self._run(argv, env=env, stdin=batch_script(spec.argv))
        except SlurmError as e:
            raise SubmitError(str(e)) from None
        job_id = out.strip().split(";")[0]  # --parsable: "id" or "id;cluster"
        if not job_id.isdigit():
            raise SubmitError(f"sbatch: unexpected answer {one_line(out)!r}")
        log.info("slurm_submitted", job=job_id, name=spec.key.name, uid=spec.identity.uid)
        return self._track(spec.key, job_id)

    def _track(self, key: RequestKey, job_id: str) -> Handle:
        handle = Handle(key, NAME, job_id)
        self._jobs.setdefault(job_id, _Tracked(handle))
        return handle

    @staticmethod
    def _owner_dir(path: Path, identity: Identity) -> None:
        """The owner's 0700 log directory, made on first use; refused if someone else's."""
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
            os.chown(path, identity.uid, identity.gid)
        except FileExistsError:
            pass
        except OSError as e:
            raise SlurmError(f"log directory {show_path(path)}: {e.strerror}") from None
        st = os.lstat(path)
        if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != identity.uid:
            raise SlurmError(
                f"log directory {show_path(path)} is not the owner's (uid {identity.uid})"
            )

    def poll(self, now: float) -> list[Event]:
        self._escalate()
        if not self._jobs or now < self._next_poll:
            return []
        self._next_poll = now + self.opts.poll_every
        names = sorted({t.handle.key.name for t in self._jobs.values()})
        try:
            rows = {r.job_id: r for r in self._squeue(f"--name={','.join(names)}")}
        except SlurmError as e:
            if str(e) != self._poll_error:  # once per distinct failure, not every 0.5 s
                log.warning("slurm_poll_failed", error=str(e))
            self._poll_error = str(e)
            return []
        self._poll_error = ""
        events: list[Event] = []
        for job_id, tracked in list(self._jobs.items()):
            for event in events_for(tracked.handle, rows.get(job_id), tracked.started):
                events.append(event)
                if isinstance(event, Started):
                    tracked.started = True
                else:
                    del self._jobs[job_id]
        return events

    def cancel(self, handle: Handle, grace: float) -> None:
        tracked = self._jobs.get(handle.ref)
        try:
            if tracked is not None and tracked.started:
                # --full: without it, signals other than KILL skip the batch shell (man scancel).
                self._run([self._bin("scancel"), "--signal=TERM", "--full", handle.ref])
                tracked.kill_at = time.monotonic() + grace
            else:
                self._run([self._bin("scancel"), handle.ref])  # still queued: just drop it
        except SlurmError as e:
            log.warning("slurm_cancel_failed", job=handle.ref, error=str(e))

    def _escalate(self) -> None:
        now = time.monotonic()
        for tracked in self._jobs.values():
            if tracked.kill_at is not None and now >= tracked.kill_at:
                tracked.kill_at = None
                ref = tracked.handle.ref
                try:
                    self._run([self._bin("scancel"), "--signal=KILL", "--full", ref])
                except SlurmError as e:
                    log.warning("slurm_cancel_failed", job=ref, error=str(e))

    def adopt(self) -> list[Handle]:
        """This daemon's jobs Slurm still lists: queued or running ones report `Started` at
        their next poll, and ended ones (within `MinJobAge`) their `Exit`, so a job that ended
        while no daemon ran still judges the run it left RUNNING on its node."""
        try:
            rows = self._squeue()
        except SlurmError as e:
            raise SubmitError(str(e)) from None
        handles = []
        for row in rows:
            key = key_from_comment(row.comment, self.opts.daemon_id)
            if key is not None:
                handles.append(self._track(key, row.job_id))
        return handles

    def fds(self) -> list[int]:
        return []

    def close(self) -> None:
        self._jobs.clear()
