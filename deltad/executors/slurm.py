"""`executor: slurm` — each resume is one Slurm batch job, run as the workspace owner.

Driven through Slurm's own commands (no Python binding matches Debian 12's Slurm 22.05):
argv lists, never a shell, a timeout on every call, all from the executor's worker thread
(`remote.py`): the daemon's loop never waits on slurmctld.

Every job of one daemon has one name, `deltad-<daemon id>`, so one `squeue --name` covers all of
them whatever their number (snakemake's shape: the argv stays constant and the controller's work
is one query per interval, an interval that grows while nothing changes). The comment carries the
request key, the uid the job was submitted for and an HMAC of both with this daemon's secret
(`<state_dir>/executor.key`, 0600): a job is this daemon's only when its tag verifies and Slurm
says it belongs to that uid, so another user's job with a copied name or comment is ignored (and
said once). A restarted daemon finds its jobs that way (`adopt`), and a second submit of one key
finds the first job (`submit` is idempotent). Every job is submitted parked (`--hold`) and let go
(`scontrol release`) after the HA fence is asked once more (remote.py's two-step submit): an
sbatch that outlives a frozen daemon's lease leaves a parked job the new active cancels.
Ends Slurm has purged (older than `MinJobAge`) are asked of `sacct` where accounting exists;
without it they are "unknown" (docs/daemon.md). Values of the job's environment never appear in
any argv: sbatch gets exactly the spec's environment as its own (`--export=ALL`) and reads the
script on stdin.

Decisions are pure functions (argv, script, comment, output parsing, exit meaning), tested from
tables; `SlurmExecutor` is the thin shell of hooks that runs the commands.
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from pydantic import ConfigDict, Field, field_validator

from deltad.protocol.printable import show_path
from deltad.validation import dir_problem

from .registry import ExecutorOptions, validate
from .remote import RemoteExecutor, RemoteJob, Seen, daemon_secret, tag, tag_ok
from .seam import Identity, JobSpec, JobState, RequestKey, SubmitError, check_fence

log = structlog.get_logger("deltad.executors.slurm")

NAME = "slurm"
COMMENT_PREFIX = "deltad2"
# squeue's long format: the comment last and unbounded (`:0`), so '|' in it cannot shift fields.
SQUEUE_FORMAT = (
    "JobID:|,Name:|,State:|,StartTime:|,exit_code:|,Reason:|,NodeList:|,UserId:|,Comment:0"
)
# The longest pause between two queries while nothing changes (and at most 32 × poll_every).
MAX_INTERVAL = 10.0
QUEUED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"})
# Ends whose exit code is the job's own (a code, or the signal that ended it).
EXITED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY", "TIMEOUT"})
# Every other end (NODE_FAIL, PREEMPTED, BOOT_FAIL, DEADLINE, REVOKED, ...) is "unknown":
# what the run left on disk decides, as for an adopted child.
# What squeue says of a job sbatch --hold parked (the daemon's own hold, let go by `scontrol
# release`); an operator's `scontrol hold` is an admin hold ("JobHeldAdmin"), left alone.
PARKED_REASON = "JobHeldUser"
_DAEMON_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class SlurmError(SubmitError):
    """A Slurm command failed, was missing, or did not answer; the message is one line."""


class SlurmConfigError(ValueError):
    """`executors: {slurm: ...}` is unusable; the message is one line."""


def _short_hostname() -> str:
    return socket.gethostname().split(".")[0]


_OURS = {"-J", "--job-name", "--comment", "--uid", "--gid"}


class SlurmOptions(ExecutorOptions):
    """The options under `executors: {slurm: {...}}` (README and docs/daemon.md)."""

    model_config = ConfigDict(populate_by_name=True)  # keys as written, or the field names

    log_dir: Path  # per-owner 0700 directories of job logs, on the shared filesystem
    daemon_id: str = Field(default_factory=_short_hostname)
    partition: str | None = None
    account: str | None = None
    extra_args: tuple[str, ...] = ()  # more sbatch options, e.g. ("--qos=hitl",)
    # the first pause between queries; doubles while nothing changes
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

    @field_validator("extra_args")
    @classmethod
    def _not_ours(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # The job's name, comment and user are how this daemon finds its own jobs.
        if taken := [a for a in v if a.split("=")[0] in _OURS]:
            raise ValueError(f"{taken[0]!r} is the daemon's to set")
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
    uid: int | None  # whose job it is (Slurm's UserId)
    comment: str


# --- configuration ------------------------------------------------------------------------


class SlurmFactory:
    """`executors: {slurm: OPTIONS}`: validated through `options_model` when the config is
    read, checked against the host by `preflight` without starting anything, built with the
    daemon's state dir (where its signing key is); `SlurmConfigError` says what is wrong."""

    options_model = SlurmOptions

    def check_options(self, options: SlurmOptions | Mapping[str, Any]) -> None:
        _parsed(options)

    def preflight(self, options: SlurmOptions | Mapping[str, Any]) -> None:
        preflight(_parsed(options))

    def build(self, options: SlurmOptions | Mapping[str, Any], state_dir: Path) -> SlurmExecutor:
        return SlurmExecutor(_parsed(options), daemon_secret(state_dir))


make_slurm_executor = SlurmFactory()


def _parsed(options: SlurmOptions | Mapping[str, Any]) -> SlurmOptions:
    return options if isinstance(options, SlurmOptions) else parse_options(options)


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
    for tool in ("sbatch", "squeue", "scancel", "scontrol"):
        if options.bin_dir is not None:
            if not os.access(options.bin_dir / tool, os.X_OK):
                raise SlurmConfigError(f"executors.slurm.bin_dir: no {tool} in {options.bin_dir}")
        elif shutil.which(tool) is None:
            raise SlurmConfigError(
                f"executors.slurm.bin_dir: {tool} is not on PATH (install Slurm's client "
                "commands, or set bin_dir)"
            )


# --- pure decisions -----------------------------------------------------------------------


def job_name(daemon_id: str) -> str:
    """The one name of all of a daemon's jobs: one `squeue --name` finds them all."""
    return f"deltad-{daemon_id}"


def comment_for(key: RequestKey, daemon_id: str, uid: int, secret: bytes) -> str:
    """`deltad2:<daemon id>:<uid>:<base64url JSON of the key>:<tag>`: no spaces, any workspace
    bytes kept exactly; the tag (an HMAC with this daemon's secret) says this daemon wrote it
    for a job of `uid`."""
    payload = {
        "ws": base64.urlsafe_b64encode(os.fsencode(key.workspace)).decode(),
        "run": key.run_id,
        "req": key.request,
        "n": key.attempt,
    }
    packed = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode()
    signed = tag(secret, COMMENT_PREFIX, daemon_id, str(uid), packed)
    return f"{COMMENT_PREFIX}:{daemon_id}:{uid}:{packed}:{signed}"


def verified_key(comment: str, daemon_id: str, secret: bytes) -> tuple[RequestKey, int] | None:
    """(key, uid) of a comment this daemon wrote; None for another daemon's, a foreign job's,
    or a forged or altered one (its tag does not verify)."""
    parts = comment.split(":")
    if len(parts) != 5 or parts[0] != COMMENT_PREFIX or parts[1] != daemon_id:
        return None
    _, _, uid, packed, given = parts
    if not uid.isdigit() or not tag_ok(secret, given, COMMENT_PREFIX, daemon_id, uid, packed):
        return None
    key = key_from_comment(comment, daemon_id)
    return (key, int(uid)) if key is not None else None


def key_from_comment(comment: str, daemon_id: str) -> RequestKey | None:
    """The key a comment of `daemon_id` names, unverified (for tests and inspection; the
    executor trusts only `verified_key`); None for another daemon's or a malformed one."""
    parts = comment.split(":")
    if len(parts) != 5 or parts[0] != COMMENT_PREFIX or parts[1] != daemon_id:
        return None
    packed = parts[3]
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


def sbatch_argv(sbatch: str, spec: JobSpec, opts: SlurmOptions, comment: str) -> list[str]:
    """The sbatch command for `spec`; the script comes on stdin, the environment as sbatch's;
    `comment` is `comment_for` the job (signed with this daemon's secret)."""
    ident = spec.identity
    argv = [
        sbatch,
        "--parsable",
        f"--uid={ident.uid}",
        f"--gid={ident.gid}",
        f"--chdir={os.fsdecode(spec.key.workspace)}",
        f"--job-name={job_name(opts.daemon_id)}",
        f"--comment={comment}",
        "--export=ALL",
        f"--output={log_path(spec, opts.log_dir)}",
        "--open-mode=append",
        "--no-requeue",
        "--hold",  # parked: `scontrol release` lets it go once the HA fence is asked again
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


def parse_uid(text: str) -> int | None:
    """squeue's UserId, `name(uid)` (or a bare uid): the uid."""
    m = re.fullmatch(r"(?:.*\()?(\d+)\)?", text.strip())
    return int(m.group(1)) if m else None


def parse_jobs(text: str) -> list[JobRow]:
    """squeue -h -O SQUEUE_FORMAT; lines that do not fit are skipped, never guessed at."""
    rows = []
    for line in text.splitlines():
        parts = line.split("|", 8)
        if len(parts) != 9 or not parts[0].strip().isdigit():
            continue
        job_id, name, state, start, status, reason, nodes, user, comment = (
            p.strip() for p in parts
        )
        try:
            raw = int(status)
        except ValueError:
            raw = 0
        # "CANCELLED by 0" in some versions: the first word is the state.
        state = state.split()[0] if state else ""
        when = parse_start(start) if nodes else None  # a never-run job's is its end
        rows.append(JobRow(job_id, name, state, when, raw, reason, nodes, parse_uid(user), comment))
    return rows


def parse_sacct(text: str) -> dict[str, tuple[str, int]]:
    """`sacct -n -P -X -o JobID,State,ExitCode`: job id -> (state, wait status)."""
    found = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        code, _, sig = parts[2].partition(":")
        try:
            status = (int(code) & 0xFF) << 8 | (int(sig or 0) & 0x7F)
        except ValueError:
            status = 0
        found[parts[0]] = (parts[1].split()[0] if parts[1] else "", status)
    return found


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


def seen_of(key: RequestKey, row: JobRow) -> Seen:
    """What one squeue row says of one of this daemon's jobs, in the runtime's terms."""
    if row.state in QUEUED:
        parked = row.state == "PENDING" and row.reason == PARKED_REASON
        return Seen(key, row.job_id, JobState.QUEUED, parked=parked)
    if row.state in RUNNING:
        return Seen(key, row.job_id, JobState.RUNNING, row.start)
    rc, timed_out = exit_of(row, False) or (None, False)
    detail = f"{row.state} {row.reason}".strip()
    return Seen(key, row.job_id, JobState.ENDED, row.start, rc, timed_out, detail)


def foreign_reason(row: JobRow, mine: tuple[RequestKey, int] | None) -> str | None:
    """Why a job listed under this daemon's name is not its own; None when it is."""
    if mine is None:
        return "no valid tag of this daemon in its comment"
    if row.uid != mine[1]:
        return f"its tag names uid {mine[1]}, Slurm says uid {row.uid}"
    return None


def one_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


# --- the shell ----------------------------------------------------------------------------


FENCED_AT_EXEC = (
    "fenced: this daemon's HA lease was not confirmed when its Slurm command was to start"
)


def _fenced_exec(fence: Callable[[], bool]) -> Callable[[], None]:
    """sbatch's preexec: the fence asked in the forked child, right before exec. The fence is
    the lease's `may_act` (attribute reads and a monotonic clock: no lock another thread
    could hold at the fork); False ends the child before sbatch runs."""

    def check() -> None:
        if not fence():
            raise SubmitError(FENCED_AT_EXEC)

    return check


class SlurmExecutor(RemoteExecutor):
    """`JobExecutor` on Slurm: the hooks of `RemoteExecutor`, run from its worker thread."""

    name = NAME
    parks = True  # sbatch --hold, then scontrol release (remote.py: a fenced two-step submit)

    def __init__(self, options: SlurmOptions, secret: bytes) -> None:
        self.opts = options
        self._secret = secret
        self._foreign: set[str] = set()  # job ids of others' jobs already said
        self._accounting: bool | None = None  # None until sacct was tried
        super().__init__(options.poll_every, min(MAX_INTERVAL, 32 * options.poll_every))

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
        fence: Callable[[], bool] | None = None,
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
                preexec_fn=None if fence is None else _fenced_exec(fence),
            )
        except FileNotFoundError:
            raise SlurmError(f"{tool} not found: install Slurm's client commands") from None
        except PermissionError:
            raise SlurmError(f"{tool}: permission denied") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{tool} did not answer in {self.opts.command_timeout:g} s") from None
        except subprocess.SubprocessError as e:  # the preexec's fence, raised in the child
            if fence is not None and not fence():
                raise SubmitError(FENCED_AT_EXEC) from None
            raise SlurmError(f"{tool}: {e}") from None
        except OSError as e:  # fork or exec failed (ENOMEM, EAGAIN, ...): an outage too
            raise SlurmError(f"{tool}: {e.strerror or e}") from None
        if done.returncode != 0:
            why = one_line(done.stderr.decode(errors="replace")) or f"exit {done.returncode}"
            raise SlurmError(f"{tool}: {why}")
        return done.stdout.decode(errors="surrogateescape")

    # the hooks (the worker thread)

    def engine_list(self) -> list[Seen]:
        """One squeue for all of this daemon's jobs (its one job name); others' jobs under that
        name are ignored, each said once."""
        name = job_name(self.opts.daemon_id)
        argv = [self._bin("squeue"), "-h", "--states=all", f"--name={name}", "-O", SQUEUE_FORMAT]
        found: dict[str, Seen] = {}
        for row in parse_jobs(self._run(argv)):
            mine = verified_key(row.comment, self.opts.daemon_id, self._secret)
            why = foreign_reason(row, mine)
            if why is not None or mine is None:
                if row.job_id not in self._foreign:
                    self._foreign.add(row.job_id)
                    log.warning("slurm_foreign_job_ignored", job=row.job_id, uid=row.uid, why=why)
                continue
            seen = seen_of(mine[0], row)
            old = found.get(seen.key.name)
            if old is None or int(row.job_id) > int(old.ref):  # the newest of one key
                found[seen.key.name] = seen
        return list(found.values())

    def engine_submit(self, spec: JobSpec) -> str:
        self._owner_dir(log_path(spec, self.opts.log_dir).parent, spec.identity)
        # The job's environment is sbatch's: the spec's exactly, plus where Slurm is.
        conf = {k: v for k, v in self._base_env().items() if k == "SLURM_CONF"}
        env = {**spec.env, **conf}
        comment = comment_for(spec.key, self.opts.daemon_id, spec.identity.uid, self._secret)
        argv = sbatch_argv(self._bin("sbatch"), spec, self.opts, comment)
        check_fence(spec)  # right before sbatch: a daemon frozen meanwhile submits nothing
        # ... and once more in sbatch's own process, between fork and exec: a daemon frozen
        # after the check above and woken after a standby took over would otherwise still
        # run the sbatch it had decided on (a second job of one answer).
        out = self._run(argv, env=env, stdin=batch_script(spec.argv), fence=spec.fence)
        job_id = out.strip().split(";")[0]  # --parsable: "id" or "id;cluster"
        if not job_id.isdigit():
            raise SlurmError(f"sbatch: unexpected answer {one_line(out)!r}")
        log.info("slurm_submitted", job=job_id, key=spec.key.name, uid=spec.identity.uid)
        return job_id

    def engine_release(self, job: RemoteJob, fence: Callable[[], bool] | None) -> None:
        """`scontrol release`, the fence asked once more between fork and exec (a daemon frozen
        after its check and woken after a standby took over must not let the job go)."""
        assert job.ref is not None
        self._run([self._bin("scontrol"), "release", job.ref], fence=fence)
        log.info("slurm_released", job=job.ref, key=job.handle.key.name)

    def engine_cancel(self, job: RemoteJob, force: bool) -> None:
        assert job.ref is not None
        if force:
            self._run([self._bin("scancel"), "--signal=KILL", "--full", job.ref])
        elif job.started:
            # --full: without it, signals other than KILL skip the batch shell (man scancel).
            self._run([self._bin("scancel"), "--signal=TERM", "--full", job.ref])
        else:
            self._run([self._bin("scancel"), job.ref])  # still queued: just drop it
        log.info("slurm_cancelled", job=job.ref, force=force)

    def engine_missing(self, jobs: list[RemoteJob]) -> dict[str, Seen]:
        """Ends squeue no longer lists (older than MinJobAge) from sacct, where accounting
        exists; without it they are unknown (said once)."""
        if self._accounting is False:
            return {}
        ids = {j.ref: j for j in jobs if j.ref is not None}
        argv = [self._bin("sacct"), "-n", "-P", "-X", "-o", "JobID,State,ExitCode"]
        try:
            out = self._run([*argv, "-j", ",".join(sorted(ids))])
        except SlurmError as e:
            if self._accounting is None:
                log.info("slurm_accounting_unavailable", error=str(e), detail="purged ends unknown")
                self._accounting = False
            return {}
        self._accounting = True
        found = {}
        for job_id, (state, status) in parse_sacct(out).items():
            job = ids.get(job_id)
            if job is None or state in QUEUED or state in RUNNING:
                continue
            row = JobRow(job_id, "", state, None, status, "", "sacct", None, "")
            rc, timed_out = exit_of(row, True) or (None, False)
            key = job.handle.key
            found[key.name] = Seen(key, job_id, JobState.ENDED, None, rc, timed_out, state)
        return found

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
                f"log directory {show_path(path)} is not the owner's (uid {identity.uid})",
                permanent=True,
            )
