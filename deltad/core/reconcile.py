"""reconcile(workspace): decide from what is on disk, never from the event that led here.

`inspect` only reads, and says what it found as a `facts.Verdict` (frozen: made once, with its
final values). The one write the daemon ever makes to a workspace, RUNNING → INTERRUPTED for a
dead owner, is `mark_interrupted`, done under the workspace lock after re-reading.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deltad import tracing
from deltad.clock import SYSTEM, Clock
from deltad.core import tenancy
from deltad.core.answer import Writers, open_writers
from deltad.core.backoff import AnswerSig
from deltad.core.facts import Action, State, Verdict
from deltad.core.tenancy import Policy
from deltad.metrics import channel_of
from deltad.protocol import (
    AnswerState,
    Busy,
    InteractionRequest,
    Mailbox,
    ProtocolError,
    RunMetadata,
    RunStatus,
    Workspace,
    WorkspaceLock,
    load_metadata,
    safefs,
)
from deltad.protocol.deadline import judge_expiry
from deltad.protocol.errors import CorruptFile
from deltad.protocol.journal import asked_request
from deltad.protocol.runfacts import (
    Elsewhere,
    RunFact,
    judge,
    mark_job_ended,
    mark_owner_dead,
    remote_owner,
    still_elsewhere,
)
from deltad.watch.discovery import is_workspace
from deltad.watch.hints import Why

# An answer file this young, reported only by IN_CREATE, may be an open(O_CREAT) whose writer
# has not finished opening it yet; look again after this long.
CREATE_GRACE_SECONDS = 0.05
# An answer file still open for writing is looked at again after this long, even though its
# writer's close will be reported: the kernel reports a close (IN_CLOSE_WRITE) before it stops
# counting the file as open for writing, so the look that the close event brings can still see
# the writer, and no later event comes. Under load that window is long enough to strand an
# answer until the next full reconcile (found by the bench: one answer in ~1,000 during an
# `rm -rf` of 1,000 workspaces, 82–95 s late at 50,000 workspaces).
OPEN_WRITER_RECHECK_SECONDS = 0.05
# A writer that keeps the file open longer (an editor saving in place slowly, a person typing
# into `cat > response.txt`) is looked at again this often, not 20 times a second.
OPEN_WRITER_PATIENCE_SECONDS = 1.0
# How soon to look again at a live run that has just posted a question.
PAUSE_RECHECK_SECONDS = 1.0
# Looks that each disagree with the one before (files rewritten under every look) before a
# resume is put off (`inspect`).
CONFIRMING_LOOKS = 3


def _problem(msg: str, run_id: str | None = None, status: RunStatus | None = None) -> Verdict:
    return Verdict(Action.NONE, State.PROBLEM, run_id, status, problem=msg)


def _unparsed(msg: str, run_id: str | None = None, status: RunStatus | None = None) -> Verdict:
    return Verdict(Action.NONE, State.PROBLEM, run_id, status, problem=msg, unparsed=True)


def inspect(
    ws_path: Path, why: Why, settle: float, policy: Policy, clock: Clock = SYSTEM
) -> Verdict:
    """What is on disk now. A resume is decided only by two looks in a row that agree: the
    files a look reads one after another (LATEST, metadata.json, request.json, the answer) can
    be written in between, and a look that read the state files before they were broken and
    the answer after it was written would resume what the disk no longer holds. The second
    look starts after the first saw the answer, so it sees every file written before it."""
    seen = _look_once(ws_path, why, settle, policy, clock)
    for _ in range(CONFIRMING_LOOKS):
        if seen.action is not Action.RESUME:
            return _unless_being_written(ws_path, seen, settle, clock)
        again = _look_once(ws_path, why, settle, policy, clock)
        if _same_resume(seen, again):
            return again
        seen = again
    return _unsettled(seen, clock, OPEN_WRITER_RECHECK_SECONDS)


def _same_resume(first: Verdict, second: Verdict) -> bool:
    return second.action is Action.RESUME and (
        first.state,
        first.run_id,
        first.request_id,
        first.answer_sig,
    ) == (second.state, second.run_id, second.request_id, second.answer_sig)


def _unsettled(seen: Verdict, clock: Clock, after: float) -> Verdict:
    """Files still changing under the look: judge nothing now, look again `after` seconds."""
    return Verdict(
        Action.NONE,
        State.WAITING,
        seen.run_id,
        seen.status,
        owner=seen.owner,
        wake_at=clock.time() + after,
    )


def _unless_being_written(ws_path: Path, seen: Verdict, settle: float, clock: Clock) -> Verdict:
    """A state file written in place (`echo ... > request.json`) is empty or half there until
    its writer is done, and a look not brought by its close (the background read after READY,
    a sweep, another file's event) may read it then. As for an answer ("When is an answer
    complete"), one that does not parse is judged once nobody has it open for writing and it
    has not changed for `settle` seconds; until then the workspace is looked at again."""
    if not seen.unparsed:
        return seen
    files = _state_files(Workspace(ws_path))
    if any(open_writers(f) is Writers.OPEN for f in files):
        return _unsettled(seen, clock, OPEN_WRITER_PATIENCE_SECONDS)
    age = clock.time() - max(_mtimes(files), default=0.0)
    if 0 <= age < settle:
        return _unsettled(seen, clock, settle - age)
    return seen


def _state_files(ws: Workspace) -> list[Path]:
    files = [ws.latest_file, ws.request_file]
    with contextlib.suppress(ProtocolError, OSError):
        if (run_id := ws.latest_run_id()) is not None:
            files.append(tenancy.run_paths(ws, run_id).metadata)
    return files


def _mtimes(files: list[Path]) -> list[float]:
    out = []
    for f in files:
        with contextlib.suppress(OSError):
            out.append(os.lstat(f).st_mtime_ns / 1e9)
    return out


def _look_once(ws_path: Path, why: Why, settle: float, policy: Policy, clock: Clock) -> Verdict:
    with safefs.reusing_dirs():  # one handle per directory for the look's reads
        return _look_reading(ws_path, why, settle, policy, clock)


def _look_reading(ws_path: Path, why: Why, settle: float, policy: Policy, clock: Clock) -> Verdict:
    if not is_workspace(ws_path):
        return Verdict(Action.GONE, State.GONE)
    ws = Workspace(ws_path)
    try:
        run_id = ws.latest_run_id()  # a run id (RUN_ID_RE) or None: `run_paths` takes it
        run = None if run_id is None else tenancy.run_paths(ws, run_id)
        # before anything is acted on
        owner = tenancy.check(
            ws_path, run_id, policy, workspace=ws, run_dir=None if run is None else run.dir
        )
        if run is None:
            return Verdict(Action.NONE, State.IDLE)
        meta = load_metadata(run.metadata)
    except FileNotFoundError as e:
        if not is_workspace(ws_path):  # deleted while we read it
            return Verdict(Action.GONE, State.GONE)
        return _problem(f"{e.filename or 'a run file'} is missing")
    except tenancy.Refused as e:
        return _problem(str(e))
    except CorruptFile as e:
        return _unparsed(str(e))
    except ProtocolError as e:
        return _problem(str(e))
    except OSError as e:
        return _problem(f"{e.filename or ws_path}: {e.strerror}")
    return _with(_by_status(ws, meta, why, settle, clock), owner=owner)


def _by_status(ws: Workspace, meta: RunMetadata, why: Why, settle: float, clock: Clock) -> Verdict:
    s = meta.status
    if s is RunStatus.WAITING_FOR_INPUT:
        return _waiting(ws, meta, why, settle, clock)
    if s is RunStatus.RUNNING:
        pid = meta.owner.pid if meta.owner else None
        if judge(meta) is RunFact.OWNER_DEAD:
            return Verdict(Action.MARK_INTERRUPTED, State.RUNNING, meta.run_id, s, owner_pid=pid)
        return Verdict(
            Action.NONE,
            State.RUNNING,
            meta.run_id,
            s,
            owner_pid=pid,
            elsewhere=remote_owner(meta),
            wake_at=_pausing_soon(ws, meta, clock),
        )
    if s is RunStatus.INTERRUPTED:
        since = meta.model_failing_since
        return Verdict(
            Action.NONE,
            State.INTERRUPTED,
            meta.run_id,
            s,
            error_kind=meta.error_kind,
            failing_since=since.timestamp() if since is not None else None,
        )
    return Verdict(Action.NONE, State.DONE, meta.run_id, s)


def _pausing_soon(ws: Workspace, meta: RunMetadata, clock: Clock) -> float | None:
    """A live run that has posted a question is about to turn WAITING_FOR_INPUT (the client
    posts first, then flips the status, then exits), and no event marks the flip. Look again
    shortly, or at the question's deadline if that is sooner."""
    try:
        request = Mailbox(ws).read_request()
    except (ProtocolError, OSError):
        return None
    if request is None or request.run_id != meta.run_id:
        return None
    soon = clock.time() + PAUSE_RECHECK_SECONDS
    return min(soon, request.expires_at.timestamp()) if request.expires_at else soon


_VERDICT_FIELDS = frozenset(f.name for f in fields(Verdict))


def _with(v: Verdict, **changes: Any) -> Verdict:
    """`dataclasses.replace(v, **changes)` at a quarter of its cost: two per look of a
    pending question. A Verdict's fields are all plain init fields with no `__post_init__`,
    so a copy of its attributes with `changes` over them is what its constructor would make
    (which sets each of its 22 fields through `object.__setattr__`, being frozen)."""
    if not _VERDICT_FIELDS.issuperset(changes):
        raise TypeError(f"Verdict has no field {sorted(changes.keys() - _VERDICT_FIELDS)}")
    new = object.__new__(Verdict)
    new.__dict__.update(vars(v), **changes)
    return new


def _name(v: Verdict, request: InteractionRequest, **more: Any) -> Verdict:
    """`v`, naming the question (the inbox's index and events name it), with `more`."""
    return _with(
        v,
        request_id=request.request_id,
        input_type=str(request.input_type),
        created=request.timestamp.timestamp(),
        deadline=request.expires_at.timestamp() if request.expires_at else None,
        follow_up=request.follow_up,
        traceparent=tracing.checked(request.traceparent),
        **more,
    )


def _waiting(ws: Workspace, meta: RunMetadata, why: Why, settle: float, clock: Clock) -> Verdict:
    run_id, status = meta.run_id, meta.status
    waiting = Verdict(Action.NONE, State.WAITING, run_id, status)
    mailbox = Mailbox(ws)
    try:
        request = mailbox.read_request()
    except CorruptFile as e:
        return _unparsed(str(e), run_id, status)
    except ProtocolError as e:
        return _problem(str(e), run_id, status)
    except OSError as e:
        return _problem(f"{ws.request_file}: {e.strerror}", run_id, status)
    if request is None:
        if (answer_file := mailbox.answer_file()) is not None:
            return _problem(
                f"{answer_file} has no question (request.json is missing)", run_id, status
            )
        return waiting
    if request.run_id != run_id:
        return _problem(
            f"{ws.request_file} belongs to run {request.run_id}, not the latest run {run_id}",
            run_id,
            status,
        )
    # Every verdict from here names the question (the inbox's index and events name it).
    deadline = request.expires_at.timestamp() if request.expires_at else None
    try:
        answer = mailbox.read_answer(request, secret=request.is_secret)
    except OSError as e:
        return _problem(f"{ws.response_file}: {e.strerror}", run_id, status)
    # A READY answer is resumed; so is a REFUSED one (a FIFO, a symlink, too big, not UTF-8)
    # once its writer is done: the client then sets it aside with the reason, instead of it
    # blocking the question forever.
    if answer.state not in (AnswerState.READY, AnswerState.REFUSED):
        if deadline is not None and clock.time() >= deadline:
            # Nobody answered (usably) in time, says request.json: the journal confirms it.
            expired = _name(Verdict(Action.RESUME, State.EXPIRED, run_id, status), request)
            return _name(_expiry(ws, request, expired, clock), request)
        v = (
            waiting
            if answer.state is AnswerState.MISSING
            else _problem(answer.reason, run_id, status)
        )
        return _name(v, request, wake_at=deadline)
    if answer.state is AnswerState.READY and answer.size == 0 and not request.allow_empty:
        # `touch response.txt` before an editor writes it, or `: > response.txt`: an empty file
        # is never taken for an answer; the real save brings us back (a close or a rename).
        empty = f"{answer.path.name} is empty: waiting for the answer to be written into it"
        v = Verdict(Action.NONE, State.WAITING, run_id, status, wake_at=deadline)
        return _name(v, request, problem=empty)
    v = _complete_answer(answer.path, run_id, status, why, settle, clock)
    # Only the `channel` field is taken, and only a known name: nothing of the answer.
    channel = channel_of(answer.path.name, answer.text) if v.action is Action.RESUME else None
    refused = answer.state is AnswerState.REFUSED
    problem = f"{answer.reason} (the resume sets it aside)" if refused else v.problem
    wake_at = v.wake_at
    if v.action is Action.NONE and deadline is not None:
        wake_at = min(deadline, v.wake_at or deadline)
    answered = (request, answer) if v.action is Action.RESUME else None
    return _name(v, request, channel=channel, problem=problem, wake_at=wake_at, answered=answered)


def _expiry(ws: Workspace, request: InteractionRequest, expired: Verdict, clock: Clock) -> Verdict:
    """request.json's deadline has passed. Resume only if the journal's has too: the client
    acts on the journal's record of the question (protocol/deadline.py), so a request.json
    that says otherwise is reported, once, and the run waits for the journal's deadline."""
    run_id, status = expired.run_id, expired.status
    try:
        asked = asked_request(tenancy.run_paths(ws, request.run_id).journal, request.request_id)
    except ProtocolError as e:
        return _problem(str(e), run_id, status)
    except OSError as e:
        return _problem(f"{e.filename or 'the journal'}: {e.strerror}", run_id, status)
    judged = judge_expiry(request, asked, datetime.fromtimestamp(clock.time(), UTC))
    if judged.expired:
        return expired  # the client applies the timeout rule
    return Verdict(
        Action.NONE,
        State.WAITING,
        run_id,
        status,
        problem=judged.problem or "request.json's deadline is not the journal's",
        wake_at=judged.at.timestamp() if judged.at is not None else None,
    )


def _complete_answer(
    path: Path, run_id: str, status: RunStatus, why: Why, settle: float, clock: Clock
) -> Verdict:
    """`path` (response.txt or response.json) is valid; is its writer done with it?"""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Verdict(Action.NONE, State.WAITING, run_id, status)
    sig: AnswerSig = (st.st_ino, st.st_size, st.st_mtime_ns)
    age = clock.time() - st.st_mtime_ns / 1e9

    def incomplete(after: float) -> Verdict:
        return Verdict(
            Action.NONE, State.WAITING, run_id, status, answer_sig=sig, wake_at=clock.time() + after
        )

    if why == Why.ANSWER_CREATED and age < CREATE_GRACE_SECONDS:
        return incomplete(CREATE_GRACE_SECONDS)
    writers = open_writers(path)
    if writers is Writers.OPEN:  # its close will be reported; look again anyway (see above)
        soon = (
            OPEN_WRITER_RECHECK_SECONDS if why & Why.ANSWER_CLOSED else OPEN_WRITER_PATIENCE_SECONDS
        )
        return incomplete(soon)
    if writers is Writers.UNKNOWN and not (why & Why.ANSWER_CLOSED) and age < settle:
        return incomplete(settle - age)
    return Verdict(Action.RESUME, State.ANSWERED, run_id, status, answer_sig=sig)


def mark_interrupted(
    ws_path: Path, run_id: str, elsewhere: Elsewhere | None = None
) -> RunMetadata | None:
    """RUNNING → INTERRUPTED if its owner is dead, decided again under the workspace lock
    (`elsewhere`: the run is on another host and its job ended; the owner must be unchanged).

    Returns the new metadata, or None if nothing was changed (someone holds the lock, i.e.
    a live `delta` is driving the workspace; or the run moved on meanwhile).
    """
    ws = Workspace(ws_path)
    if not safefs.is_dir(ws.delta_dir):
        return None  # WorkspaceLock would create .delta/ in a deleted workspace
    lock = WorkspaceLock(ws.lock_file)
    try:
        lock.acquire()
    except Busy:
        return None
    try:
        path = ws.run(run_id).metadata
        meta = load_metadata(path)
        if elsewhere is not None:
            if not still_elsewhere(meta, elsewhere):
                return None
            return mark_job_ended(path, meta, ws_path, elsewhere.why)
        if judge(meta) is not RunFact.OWNER_DEAD:
            return None
        return mark_owner_dead(path, meta, ws_path)
    finally:
        lock.release()
