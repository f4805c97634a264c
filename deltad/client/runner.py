"""`delta run`: pick the run to drive (resume LATEST or start a new one), then drive it.

Everything that changes state happens under the workspace lock. A resume changes nothing on
disk until the agent definition and the model endpoint have been checked, so a missing agent
or key leaves the run exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import structlog

from deltad import inbox, logs
from deltad.agent import MAX_CONFIG_BYTES, Agent, load_agent
from deltad.engine import Checkpoints, Engine, NoCheckpoints, Outcome, RunContext, sandbox
from deltad.engine.interviewers import (
    AutoApproveInterviewer,
    Chain,
    Interviewer,
    MailboxInterviewer,
    QueueInterviewer,
    console_interviewer,
    load_answers,
)
from deltad.engine.llm import ChatModel, OpenAIChatModel
from deltad.engine.signals import Interrupted, InterruptGuard
from deltad.errors import LLMError, UsageError
from deltad.pipeline import runs as pipeline_runs
from deltad.pipeline.driver import PipelineEngine
from deltad.pipeline.model import Graph
from deltad.protocol import (
    RETRYABLE_FAILURES,
    EventType,
    Journal,
    ProtocolError,
    RunMetadata,
    RunPaths,
    RunStatus,
    Workspace,
    WorkspaceLock,
    exitcodes,
    load_metadata,
    new_metadata,
    new_run_id,
    safefs,
    save_metadata,
    transition,
)
from deltad.protocol.fsio import atomic_write, read_regular
from deltad.protocol.live import Live
from deltad.protocol.mailbox import Mailbox
from deltad.protocol.printable import shell_quote, show
from deltad.protocol.runfacts import RunFact, judge, mark_owner_dead, owner_gone

log = structlog.get_logger("deltad.client")


@dataclass
class RunOptions:
    work_dir: Path
    agent: str | None = None
    task: str | None = None
    new: bool = False
    run_id: str | None = None
    interactive: bool = False
    max_iterations: int | None = None
    auto_approve: bool = False
    answers: str | None = None
    interviewer: Interviewer | None = None  # library use: who answers, e.g. a Callback
    hooks: Checkpoints | None = None  # named points of the ingestion sequence (tests)
    retry: bool = False  # resume a run the model endpoint FAILED (delta run --retry)
    log_to_run: bool = True  # the CLI sends all logging to the run's engine.log; a library not
    pipeline: str | None = None  # a new pipeline run: the DOT file (delta run --pipeline)
    max_steps: int | None = None  # a pipeline run's node visits, over the graph's max_steps
    by_daemon: bool = False  # deltad started this resume (DELTA_RESUMED_BY=deltad)

    @property
    def starts(self) -> bool:
        """Enough to start a new run: an agent and a task, or an agent and a pipeline."""
        return bool(self.agent and (self.task or self.pipeline))


@dataclass
class Selected:
    paths: RunPaths
    meta: RunMetadata
    journal: Journal
    agent: Agent
    model: ChatModel


def _model(agent: Agent, err: TextIO) -> ChatModel:
    def say(message: str) -> None:  # retries and long waits: the person and the log both hear
        print(f"delta: {show(message)}", file=err, flush=True)
        log.warning("model_call", detail=message)

    try:
        return OpenAIChatModel(agent.config.llm, say)
    except LLMError as e:
        raise UsageError(str(e)) from None


def _latest(ws: Workspace, run_id: str | None) -> tuple[RunPaths, RunMetadata] | None:
    rid = run_id or ws.latest_run_id()
    if rid is None:
        return None
    paths = ws.run(rid)
    try:
        return paths, load_metadata(paths.metadata)
    except FileNotFoundError:
        if run_id:
            raise UsageError(f"no run {run_id} in {ws.root}") from None
        return None


def _resumable(meta: RunMetadata) -> bool:
    # Under our lock no other client can be driving it, so RUNNING means its owner died.
    return judge(meta, locked=True) in (RunFact.WAITING, RunFact.INTERRUPTED, RunFact.OWNER_DEAD)


def _mark_crashed(ws: Workspace, paths: RunPaths, meta: RunMetadata, journal: Journal) -> None:
    journal.append(EventType.SYSTEM_MESSAGE, {"level": "WARN", "content": owner_gone(meta)})
    mark_owner_dead(paths.metadata, meta, ws.root)


def _supersede(ws: Workspace, paths: RunPaths, meta: RunMetadata, by: str, warn: TextIO) -> None:
    """Another run is about to use the workspace's one mailbox while `meta`'s run still waits:
    park its question (and any answer to it), mark it INTERRUPTED, and say so."""
    journal = Journal(paths.journal)
    mailbox = Mailbox(ws)
    req = mailbox.read_request()
    kept = []
    if req is not None and req.run_id == meta.run_id:
        kept.append(mailbox.set_aside_request(f"superseded-{meta.run_id}").name)
        kept += [p.name for p in mailbox.set_aside_answers()]
    if meta.status in (RunStatus.WAITING_FOR_INPUT, RunStatus.RUNNING):
        journal.append(
            EventType.SYSTEM_MESSAGE, {"level": "WARN", "content": f"superseded by {by}"}
        )
        transition(
            paths.metadata,
            meta,
            RunStatus.INTERRUPTED,
            workspace=str(ws.root),
            error=f"superseded by {by}",
        )
        where = f"; kept as {', '.join(kept)}" if kept else ""
        print(
            f"delta: run {meta.run_id} was waiting; it is set aside (INTERRUPTED{where}) for "
            f"{by}. `delta run --run-id {meta.run_id}` takes it up again.",
            file=warn,
        )


@dataclass
class Ready:
    """A new run, checked: its agent and model, and its pipeline (graph and text) if any."""

    agent: Agent
    model: ChatModel
    pipeline: tuple[Graph, str] | None = None


def _prepare(opts: RunOptions, err: TextIO) -> Ready:
    """Validate everything a new run needs before anything is written."""
    if not opts.starts or not opts.agent:
        raise UsageError("starting a run needs --agent DIR and --task TEXT (or --pipeline FILE)")
    if opts.max_steps and not opts.pipeline:
        raise UsageError("--max-steps bounds a pipeline's node visits: give --pipeline FILE")
    pipeline = pipeline_runs.load_new(Path(opts.pipeline), err) if opts.pipeline else None
    agent = load_agent(opts.agent)
    for note in agent.notes:
        print(f"delta: note: {note}", file=err)
    homes = pipeline_runs.node_agents(pipeline[0]) if pipeline else []
    agents = {home: load_agent(home) for home in homes}  # a node's own agent must be sound too
    for each in (agent, *agents.values()):  # tools that cannot be sandboxed: refused or said
        sandbox.announce(each, lambda m: print(f"delta: {m}", file=err))
    if pipeline:
        pipeline_runs.check_providers(pipeline[0], agent, agents)
    return Ready(agent, _model(agent, err), pipeline)


Prepared = Ready | None


def _create(ws: Workspace, opts: RunOptions, prepared: Prepared, err: TextIO) -> Selected:
    ready = prepared or _prepare(opts, err)
    agent, model = ready.agent, ready.model
    task = pipeline_runs.goal_of(ready.pipeline[0], opts.task) if ready.pipeline else opts.task
    assert task is not None  # _prepare refuses a new run without one
    run_id = new_run_id()
    paths = ws.run(run_id)
    safefs.mkdirs(paths.execution)
    for f in (agent.config_file, agent.prompt_file):  # a snapshot: what this run was started with
        atomic_write(paths.configuration / f.name, read_regular(f, MAX_CONFIG_BYTES, follow=True))
    if ready.pipeline:
        pipeline_runs.save_copy(paths, ready.pipeline[1])
    meta = new_metadata(
        run_id,
        task,
        str(agent.home),
        pipeline=str(Path(opts.pipeline).resolve()) if opts.pipeline else None,
        max_iterations=opts.max_iterations,
    )
    meta.max_steps = opts.max_steps
    save_metadata(paths.metadata, meta)
    ws.set_latest(run_id)  # after metadata: LATEST never names a run without one
    if opts.log_to_run:
        _log_to(paths)
    log.info(
        "run_created",
        run_id=run_id,
        workspace=str(ws.root),
        agent=agent.name,
        to=str(RunStatus.RUNNING),
    )
    return Selected(paths, meta, Journal(paths.journal), agent, model)


def _resume(
    ws: Workspace, paths: RunPaths, meta: RunMetadata, opts: RunOptions, warn: TextIO
) -> Selected:
    try:
        agent = load_agent(meta.agent_ref)
    except UsageError as e:
        raise UsageError(f"cannot resume run {meta.run_id}: {e}") from None
    sandbox.announce(agent, lambda m: print(f"delta: {m}", file=warn))
    model = _model(agent, warn)
    if opts.agent or opts.task or opts.pipeline:
        print(
            f"delta: resuming run {meta.run_id} ({meta.status}); --agent/--task/--pipeline "
            "ignored. Pass --new to start a new run instead.",
            file=warn,
        )
    if opts.log_to_run:
        _log_to(paths)
    journal = Journal(paths.journal)
    log.info(
        "journal_read",
        run_id=meta.run_id,
        next_seq=journal.next_seq,
        in_memory=len(journal.events),
        from_snapshot_bytes=journal.restored_bytes,  # known without reading them again
    )
    if meta.status == RunStatus.RUNNING:
        _mark_crashed(ws, paths, meta, journal)
    if meta.status == RunStatus.FAILED:  # --retry, checked by the caller
        journal.append(
            EventType.SYSTEM_MESSAGE,
            {
                "level": "INFO",
                "content": f"retried on purpose (delta run --retry) after: {meta.error}",
                "retry": True,
            },
        )
    if opts.max_iterations:
        meta.max_iterations = opts.max_iterations
        save_metadata(paths.metadata, meta)
    if opts.max_steps:
        meta.max_steps = opts.max_steps
        save_metadata(paths.metadata, meta)
    return Selected(paths, meta, journal, agent, model)


def _select(ws: Workspace, opts: RunOptions, warn: TextIO, prepared: Prepared) -> Selected:
    found = _latest(ws, opts.run_id)
    if found is None:
        if opts.retry:
            raise UsageError(f"no run to retry in {ws.root}")
        return _create(ws, opts, prepared, warn)
    paths, meta = found
    if judge(meta) is RunFact.ELSEWHERE:
        raise nothing_to_do(meta, opts, RunFact.ELSEWHERE)
    if opts.retry:
        _check_retry(meta)
        return _take_over(ws, paths, meta, opts, warn)
    if opts.new:
        if _resumable(meta):
            _supersede(ws, paths, meta, "a new run (delta run --new)", warn)
        return _create(ws, opts, prepared, warn)
    if _resumable(meta):
        return _take_over(ws, paths, meta, opts, warn)
    if opts.run_id or opts.by_daemon:
        raise nothing_to_do(meta, opts, RunFact.FINISHED)
    if not opts.starts:
        raise UsageError(
            f"the latest run {meta.run_id} is {meta.status}; start a new run with "
            "--agent DIR --task TEXT"
            + (" (or `delta run --retry`: the model failed it)" if _retryable(meta) else "")
        )
    return _create(ws, opts, prepared, warn)


class AlreadyTaken(UsageError):
    """A daemon's resume found the run already taken or finished by another process (another
    daemon of the fleet, a person): busy, not a failure, so the daemon does not back off."""

    exit_code = exitcodes.BUSY


def nothing_to_do(meta: RunMetadata, opts: RunOptions, fact: RunFact) -> UsageError:
    """What `delta run` says when the run it would resume has nothing left to resume: for a
    resume deltad started, someone else got there first (exit 75); for a person, a usage error
    (exit 2) as always."""
    if fact is RunFact.ELSEWHERE:
        host = meta.owner.hostname if meta.owner else "?"
        text = f"run {meta.run_id} is RUNNING on host {host}; it cannot be checked from here"
    elif opts.by_daemon:
        text = (
            f"run {meta.run_id} is {meta.status}: another process already took or finished it; "
            "nothing to do"
        )
    else:
        text = f"run {meta.run_id} is {meta.status}; there is nothing to resume"
    return AlreadyTaken(text) if opts.by_daemon else UsageError(text)


def _take_over(
    ws: Workspace, paths: RunPaths, meta: RunMetadata, opts: RunOptions, warn: TextIO
) -> Selected:
    """Resume `meta`'s run. A workspace has one mailbox, so at most one run may be waiting in
    it: resuming an older run (`--run-id`) sets the latest aside first if it waits, and makes
    the resumed run the latest."""
    if opts.max_steps and meta.pipeline is None:  # refused before anything is written
        raise UsageError(f"run {meta.run_id} is not a pipeline run: --max-steps does not apply")
    latest = ws.latest_run_id()
    if latest is not None and latest != meta.run_id:
        found = _latest(ws, latest)
        if found is not None and _resumable(found[1]):
            _supersede(ws, *found, f"run {meta.run_id} (delta run --run-id)", warn)
        ws.set_latest(meta.run_id)
    return _resume(ws, paths, meta, opts, warn)


def _retryable(meta: RunMetadata) -> bool:
    return meta.status == RunStatus.FAILED and meta.error_kind in RETRYABLE_FAILURES


def _check_retry(meta: RunMetadata) -> None:
    if _resumable(meta):
        return  # nothing failed: an ordinary resume
    if not _retryable(meta):
        why = f" ({meta.error})" if meta.error else ""
        raise UsageError(
            f"run {meta.run_id} is {meta.status}{why}; --retry only resumes a run the model "
            "endpoint failed"
        )


def _log_to(paths: RunPaths) -> None:
    fd = safefs.open_file(
        paths.engine_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, create_dirs=True
    )
    logs.configure(level="info", fmt="json", stream=os.fdopen(fd, "a", encoding="utf-8"))


def drive(opts: RunOptions, guard: InterruptGuard, out: TextIO, err: TextIO) -> int:
    ws = Workspace.at(opts.work_dir)
    prepared: Prepared = None
    if opts.new or not safefs.is_dir(ws.delta_dir):
        if not opts.starts:
            raise UsageError(
                f"no run to resume in {ws.root}; start one with --agent DIR --task TEXT"
            )
        prepared = _prepare(opts, err)  # a bad agent or key must leave no trace in the workspace
        ws.root.mkdir(parents=True, exist_ok=True)
    # The mailbox's `live` file, held from just after the lock is taken until just after it
    # is released: its close (the kernel's own at a kill -9) tells the daemon to look now.
    live = Live(ws)
    try:
        with WorkspaceLock(ws.lock_file):
            live.open()
            sel = _select(ws, opts, err, prepared)
            warn = _warner(err)
            hooks = opts.hooks or NoCheckpoints()
            ctx = RunContext(
                ws, sel.paths, sel.meta, sel.journal, sel.agent, sel.model, guard, warn, hooks
            )
            queued = sel.journal.history.replies_from("queue")
            interviewer = opts.interviewer or _interviewer(opts, ws, warn, guard, queued, hooks)
            try:
                outcome = _engine(ctx, interviewer, err).drive()
            except Interrupted as e:
                return _interrupted(ctx, e, err)
            except (UsageError, ProtocolError) as e:
                return _stopped(ctx, e, err)
            except Exception as e:
                return _internal_error(ctx, e, err)
            finally:
                _snapshot(sel.journal)
    finally:
        live.close()
    return _report(ws, sel.meta, outcome, out, err)


def _snapshot(journal: Journal) -> None:
    """The next process's read of a long journal starts where this one stopped (a cache: a
    failure is logged and costs that process a full read)."""
    try:
        journal.snapshot()
    except (OSError, ProtocolError) as e:
        log.warning("snapshot_not_written", journal=str(journal.path), error=str(e))


def _engine(ctx: RunContext, interviewer: Interviewer, err: TextIO) -> Engine:
    """The run's engine: a pipeline's (its graph from the run's own copy), else the loop."""
    if ctx.meta.pipeline is None:
        return Engine(ctx, interviewer)
    graph = pipeline_runs.load_for_run(ctx.paths, ctx.meta)
    agents: dict[Path, tuple[Agent, ChatModel]] = {}

    def agent_of(home: Path) -> tuple[Agent, ChatModel]:
        if home not in agents:
            agent = load_agent(home)
            agents[home] = (agent, _model(agent, err))
        return agents[home]

    return PipelineEngine(ctx, interviewer, graph, agent_of)


def run(opts: RunOptions, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Drive a run in this process (library use); returns the `delta run` exit code.

    User errors raise `DeltaError` (its `exit_code` says which). Signals are not installed:
    that is the caller's choice."""
    opts.log_to_run = False  # the host application owns its logging configuration
    return drive(opts, InterruptGuard(), out or sys.stdout, err or sys.stderr)


def _warner(err: TextIO) -> Callable[[str], None]:
    return lambda message: print(f"delta: {show(message)}", file=err)


def _interviewer(
    opts: RunOptions,
    ws: Workspace,
    warn: Callable[[str], None],
    guard: InterruptGuard,
    queued: int,
    hooks: Checkpoints,
) -> Interviewer:
    """Who answers: an answer already in the mailbox always counts, then the mode's
    stand-in; plain async mode posts the question and pauses."""
    take = MailboxInterviewer(Mailbox(ws), warn, post=False, hooks=hooks)
    if opts.answers is not None:
        return QueueInterviewer(load_answers(opts.answers), start=queued)
    if opts.auto_approve:
        return Chain(take, AutoApproveInterviewer())
    post = MailboxInterviewer(Mailbox(ws), warn, hooks=hooks)
    if opts.interactive:
        console = console_interviewer(guard.window, elsewhere=take.ask)
        return Chain(take, console, post)
    return Chain(post)


def _interrupted(ctx: RunContext, e: Interrupted, err: TextIO) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # let the cleanup below finish
    ctx.note(f"interrupted by {e}", "WARN")
    if ctx.meta.status == RunStatus.RUNNING:
        ctx.set_status(RunStatus.INTERRUPTED, error=f"interrupted by {e}")
    state = ctx.meta.status  # WAITING_FOR_INPUT when stopped at a question: still waiting
    _emit(
        f"delta: interrupted ({e}); run {ctx.meta.run_id} is {state}; resume it with: "
        f"delta run --work-dir {_q(str(ctx.ws.root))}",
        err,
    )
    return exitcodes.INTERRUPTED


def _emit(text: str, stream: TextIO) -> None:
    """Print, surviving a reader that went away (`delta run | head`): the run's own exit code
    must not turn into a 'Broken pipe' error."""
    try:
        print(text, file=stream, flush=True)
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())  # what is still buffered goes nowhere at exit


def _stopped(ctx: RunContext, e: UsageError | ProtocolError, err: TextIO) -> int:
    """A user error found mid-run (e.g. a scripted answer that does not fit): stop, resumable."""
    left = ctx.meta.status
    try:  # the very file at fault may be the journal or the metadata: do what still works
        ctx.note(f"stopped: {e}", "ERROR")
        if ctx.meta.status == RunStatus.RUNNING:
            ctx.set_status(RunStatus.INTERRUPTED, error=str(e))
        left = ctx.meta.status
    except (ProtocolError, OSError):
        pass
    print(f"delta: error: {show(str(e))} (run {show(ctx.meta.run_id)} left {left})", file=err)
    return e.exit_code if isinstance(e, UsageError) else exitcodes.USAGE


def _internal_error(ctx: RunContext, e: Exception, err: TextIO) -> int:
    """A bug, not a user error: keep the run resumable and say where the details are."""
    log.error("internal_error", run_id=ctx.meta.run_id, exc_info=True)
    ctx.note(f"internal error: {type(e).__name__}: {e}", "ERROR")
    if ctx.meta.status == RunStatus.RUNNING:
        ctx.set_status(RunStatus.INTERRUPTED, error=f"internal error: {type(e).__name__}")
    print(
        f"delta: internal error: {type(e).__name__}: {e} (run {ctx.meta.run_id} left "
        f"INTERRUPTED; details in {ctx.paths.engine_log})",
        file=err,
    )
    traceback.print_exc(file=err)
    return exitcodes.FAILED


def _report(ws: Workspace, meta: RunMetadata, outcome: Outcome, out: TextIO, err: TextIO) -> int:
    if outcome.status == RunStatus.COMPLETED:
        _emit(outcome.message, out)
    elif outcome.status == RunStatus.WAITING_FOR_INPUT and outcome.request is not None:
        _emit(inbox.guidance(ws, meta.run_id, outcome.request), out)
    else:
        _emit(f"delta: run {show(meta.run_id)} {outcome.status}: {show(outcome.message)}", err)
        wd = _q(str(ws.root))
        if outcome.status == RunStatus.INTERRUPTED:
            outage = meta.error_kind == "model_unavailable"
            later = " (deltad retries it by itself)" if outage else ""
            _emit(f"delta: resume it with: delta run --work-dir {wd}{later}", err)
        elif _retryable(meta):
            _emit(f"delta: once that is fixed: delta run --retry --work-dir {wd}", err)
    return outcome.exit_code


_q = shell_quote
