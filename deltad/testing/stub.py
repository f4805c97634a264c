"""Paused workspaces and a stand-in resume client, for the daemon's tests and benchmarks.

`paused_workspace` builds the on-disk state of a run waiting for an answer with the protocol
package itself. `python -m deltad.testing.stub stub WS --record FILE [--mode M]` behaves like
`delta run --work-dir WS` as far as the daemon can tell: it takes the workspace lock (exit 75 if
busy), ingests the answer (journal-free: it appends one JSON line to FILE), clears the mailbox,
and moves the run to COMPLETED (exit 0). Modes:
  consume  the above                      hang   ingest, stay RUNNING until killed
  fail     exit 2 without touching a thing slow  ingest, sleep 1 s, then complete
  hold     take the lock, wait until FILE.go (or FILE.go.<workspace's name>) exists, then
           consume (a person's `delta run`)
  probe    record what the process is (identity, environment, session, signals, fds,
           stdio), then consume: the executors' tests compare a forked resume with a fresh one
  elsewhere  a run on a cluster node whose job is killed under it: ingest the first answer and
           stay RUNNING as a process on another host (`ELSEWHERE_HOST`) until killed; an
           INTERRUPTED run is resumed and asks again (WAITING, exit 101); the later answer is
           consumed
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from deltad.protocol import (
    AnswerState,
    Busy,
    InteractionRequest,
    Mailbox,
    RunMetadata,
    RunStatus,
    Workspace,
    WorkspaceLock,
    current_owner,
    iso,
    load_metadata,
    new_run_id,
    safefs,
    save_metadata,
    transition,
    utcnow,
)
from deltad.protocol.printable import show_path

ELSEWHERE_HOST = "node-elsewhere.invalid"  # the host mode `elsewhere` claims to run on


def paused_workspace(
    path: Path,
    prompt: str = "q?",
    run_id: str | None = None,
    expires_at: datetime | None = None,
    task: str = "benchmark task",
    **question: Any,
) -> str:
    """Create (or re-pause) a workspace whose latest run waits for an answer; return its id.
    The question is posted and recorded in the journal (its `asked` record, the fact the daemon
    judges a deadline by), as `delta` does."""
    ws = Workspace.at(path)
    run_id = run_id or new_run_id()
    paths = ws.run(run_id)
    paths.execution.mkdir(parents=True, exist_ok=True)
    now = utcnow()
    meta = RunMetadata(
        run_id=run_id,
        status=RunStatus.WAITING_FOR_INPUT,
        task=task,
        agent_ref=show_path(path / "agent"),  # metadata is UTF-8 JSON: names are bytes
        start_time=now,
        updated_at=now,
    )
    save_metadata(paths.metadata, meta)
    request = InteractionRequest(
        prompt=prompt, run_id=run_id, action_id="act_1", expires_at=expires_at, **question
    )
    _record_asked(paths.journal, request)
    # LATEST before the question, as `delta` sets it when the run starts: a watcher that sees
    # only the mailbox (inotify: one watch per workspace) reads the run the question belongs to.
    ws.set_latest(run_id)
    Mailbox(ws).post(request)
    return run_id


def _record_asked(journal: Path, request: InteractionRequest) -> None:
    """The journal's `asked` record, appended without fsync: a benchmark builds 50,000."""
    seq = journal.read_bytes().count(b"\n") + 1 if journal.exists() else 1
    payload = {"phase": "asked", "request": request.model_dump(mode="json")}
    event = {"seq": seq, "timestamp": iso(utcnow()), "type": "HUMAN_INTERACTION"}
    line = json.dumps({**event, "payload": payload}, separators=(",", ":")) + "\n"
    fd = safefs.open_file(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # the rule's mode
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _record(file: Path, **fields: object) -> None:
    line = json.dumps({**fields, "pid": os.getpid(), "t": time.time()}) + "\n"
    fd = os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one small O_APPEND write: lines never interleave
    finally:
        os.close(fd)


def _ingest(ws: Workspace, record: Path) -> tuple[Path, RunMetadata] | None:
    run_id = ws.latest_run_id()
    assert run_id is not None, "no run"
    path = ws.run(run_id).metadata
    meta = load_metadata(path)
    mailbox = Mailbox(ws)
    request = mailbox.read_request()
    answer = mailbox.read_answer(request) if request else None
    if meta.status is not RunStatus.WAITING_FOR_INPUT or not answer:
        return None
    if answer.state is AnswerState.REFUSED:  # as the client does: set it aside, keep waiting
        mailbox.refuse(answer.path, answer.reason)
        return None
    if answer.state is not AnswerState.READY:
        return None
    meta = transition(path, meta, RunStatus.RUNNING, workspace=str(ws.root), owner=current_owner())
    _record(record, workspace=str(ws.root), run_id=run_id, answer=answer.text)
    mailbox.discard_answer()
    mailbox.withdraw()
    return path, meta


def _resume_interrupted(ws: Workspace, record: Path) -> int | None:
    """An INTERRUPTED latest run: record why it was interrupted, then ask again (exit 101, as a
    resumed run that reaches its next question); else None."""
    run_id = ws.latest_run_id()
    assert run_id is not None, "no run"
    path = ws.run(run_id).metadata
    meta = load_metadata(path)
    if meta.status is not RunStatus.INTERRUPTED:
        return None
    _record(record, workspace=str(ws.root), run_id=run_id, resumed=str(meta.error))
    meta = transition(path, meta, RunStatus.RUNNING, workspace=str(ws.root), owner=current_owner())
    # As the client does: the question first, then the status (an answer written as soon as
    # the run says WAITING_FOR_INPUT is newer than the question, never set aside by it).
    request = InteractionRequest(prompt="again?", run_id=run_id, action_id="act_2")
    _record_asked(ws.run(run_id).journal, request)
    Mailbox(ws).post(request)
    transition(path, meta, RunStatus.WAITING_FOR_INPUT, workspace=str(ws.root))
    return 101


def _resumed_before(record: Path, run_id: str) -> bool:
    try:
        lines = record.read_text().splitlines()
    except FileNotFoundError:
        return False
    return any(
        (r := json.loads(line)).get("run_id") == run_id and "resumed" in r
        for line in lines
        if line.strip()
    )


# glibc's reserved signals 32 and 33 (thread cancellation, set*id across threads): glibc
# installs its own handlers with a process's first thread (a warm server's rehearsal made one,
# a model call's notice timer). Not the program's dispositions, so not compared.
GLIBC_SIGNALS = (1 << 31) | (1 << 32)


def facts() -> dict[str, object]:
    """What a resume process is, as far as its program can tell (nothing pid-specific)."""
    import locale
    import signal

    from deltad.engine import llm, sandbox

    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    pid = os.getpid()
    return {
        "uid": os.getresuid(),
        "gid": os.getresgid(),
        "groups": sorted(os.getgroups()),
        "umask": status["Umask"].strip(),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "session_leader": os.getsid(0) == pid,
        "group_leader": os.getpgid(0) == pid,
        "signals": {
            k: f"{int(status[k], 16) & ~GLIBC_SIGNALS:016x}" for k in ("SigBlk", "SigIgn", "SigCgt")
        },
        "python_handlers": {
            signal.Signals(s).name: repr(signal.getsignal(s))
            for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE)
        },
        "fds": fds,
        "stdio": [os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)],
        "streams": [
            (s.encoding, s.errors, s.line_buffering) for s in (sys.stdin, sys.stdout, sys.stderr)
        ],
        "argv": sys.argv[1:],
        "argv0": os.path.basename(sys.argv[0]),
        "name": __name__,
        "tz": time.tzname,
        "ctype": locale.setlocale(locale.LC_CTYPE),
        # What a warm server could leave behind from its rehearsal (executors/rehearsal.py):
        # the host as the sandbox saw it (its euid: the server's is root), the model's wire.
        "sandbox_euid": sandbox.host().euid,
        "model_transport": repr(llm.TRANSPORT),
    }


def stub(workspace: str, record: Path, mode: str) -> int:
    if mode == "probe":
        _record(record, workspace=workspace, facts=facts())
        mode = "consume"
    if mode == "fail":
        _record(record, workspace=workspace, failed=True)
        return 2
    ws = Workspace.at(workspace)
    lock = WorkspaceLock(ws.lock_file)
    try:
        lock.acquire()
    except Busy:
        return 75
    if mode == "hold":
        go = record.with_name(record.name + ".go")
        mine = record.with_name(f"{go.name}.{Path(workspace).name}")  # releases this one only
        while not (go.exists() or mine.exists()):
            time.sleep(0.02)
    if mode == "elsewhere" and (resumed := _resume_interrupted(ws, record)) is not None:
        return resumed
    ingested = _ingest(ws, record)
    if ingested is None:
        return 101
    path, meta = ingested
    if mode == "elsewhere" and not _resumed_before(record, meta.run_id):
        meta.owner = current_owner().model_copy(update={"hostname": ELSEWHERE_HOST})
        save_metadata(path, meta)
        mode = "hang"
    if mode == "hang":
        while True:
            time.sleep(3600)
    if mode == "slow":
        time.sleep(1.0)
    transition(path, meta, RunStatus.COMPLETED, workspace=workspace, end_time=utcnow())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deltad.testing.stub")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stub", help="act as `delta run --work-dir WS`")
    s.add_argument("workspace")
    s.add_argument("--record", type=Path, required=True)
    modes = ["consume", "hang", "fail", "slow", "hold", "probe", "elsewhere"]
    s.add_argument("--mode", default="consume", choices=modes)
    p = sub.add_parser("pause", help="create a paused workspace")
    p.add_argument("workspace", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "pause":
        print(paused_workspace(args.workspace))
        return 0
    return stub(args.workspace, args.record, args.mode)


if __name__ == "__main__":
    sys.exit(main())
