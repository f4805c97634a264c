"""Every resume rule of the daemon, from tables: facts + memory + time in, effects out.
No disk, no processes, no patching: `decide` is a pure function (deltad/core/decide.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from deltad.core.backoff import AnswerKey, ExpiredKey, InterruptedKey, ModelRetryKey
from deltad.core.decide import (
    FRESH,
    Drop,
    Effect,
    Exited,
    Facts,
    Log,
    MarkInterrupted,
    Memory,
    Now,
    Observe,
    Quarantine,
    Remember,
    Resume,
    Rules,
    Schedule,
    decide,
    quarantined,
)
from deltad.core.reconcile import Action, State, Verdict
from deltad.core.tenancy import Owner
from deltad.pacing import Pacing
from deltad.protocol import exitcodes
from deltad.protocol.runfacts import Elsewhere, JobEnd, RemoteOwner

OWNER = Owner(1000, 1000, "ann", "/home/ann")
SIG = (1, 2, 3)
NOW = Now(mono=1000.0, wall=1_800_000_000.0)
RULES = Rules(resume=Pacing(5.0, 600.0), model=Pacing(10.0, 40.0), give_up_after=100.0)
AUTO = replace(RULES, auto_resume_interrupted=True)
NO_MODEL_RETRY = replace(RULES, model_retry=False)


def seen(state: State, action: Action = Action.NONE, **kw: object) -> Verdict:
    fields: dict[str, object] = {"run_id": "r1", "owner": OWNER, **kw}
    return Verdict(action, state, **fields)  # type: ignore[arg-type]


ANSWERED = seen(State.ANSWERED, Action.RESUME, answer_sig=SIG, request_id="q1")
EXPIRED = seen(State.EXPIRED, Action.RESUME, request_id="q1")
WAITING = seen(State.WAITING, request_id="q1", wake_at=NOW.wall + 30)
DEAD_OWNER = seen(State.RUNNING, Action.MARK_INTERRUPTED)
INTERRUPTED = seen(State.INTERRUPTED)
OUTAGE = seen(State.INTERRUPTED, error_kind="model_unavailable", failing_since=NOW.wall - 50)
LONG_OUTAGE = replace(OUTAGE, failing_since=NOW.wall - 100)
NO_OWNER = replace(ANSWERED, owner=None)
DONE = seen(State.DONE)
# RUNNING on another host (a Slurm or Kubernetes job's node): judged from its job only
NODE_B = RemoteOwner("r1", "node-b", 4242)
REMOTE = seen(State.RUNNING, owner_pid=4242, elsewhere=NODE_B)
KILLED = Exited("r1", -9, failed=True, job="job deltad-1 (77) ended: killed_by_SIGKILL")
ENDED_B = Memory(job_end=JobEnd(NODE_B, -9, "job deltad-1 (77) ended: killed_by_SIGKILL"))

ANSWER = AnswerKey(SIG)
FAILED_ANSWER = Memory(key=ANSWER, failures=1, not_before=NOW.mono + 5)


def kinds(effects: list[Effect]) -> list[str]:
    """The effects as short words: `Resume:answer`, `Schedule@+5`, `Log:resume_busy`..."""
    out = []
    for e in effects:
        match e:
            case Resume():
                out.append(f"Resume:{e.reason}")
            case Schedule(at) | Quarantine(at):
                out.append(f"{type(e).__name__}@+{at - NOW.mono:g}")
            case Log():
                out.append(f"Log:{e.event}")
            case MarkInterrupted(_, then):
                out.append(f"MarkInterrupted{kinds(list(then))}")
            case _:
                out.append(type(e).__name__)
    return out


@dataclass(frozen=True)
class Row:
    why: str
    facts: Facts
    expected: list[str]
    memory: Memory = FRESH
    rules: Rules = RULES


ROWS = [
    Row("gone", Facts(seen(State.GONE, Action.GONE)), ["Drop"]),
    Row("idle: only observed", Facts(seen(State.IDLE)), ["Observe"]),
    Row("done: only observed", Facts(DONE), ["Observe"]),
    Row("waiting: look again at its deadline", Facts(WAITING), ["Observe", "Schedule@+30"]),
    Row("answered: resumed", Facts(ANSWERED), ["Observe", "Resume:answer", "Remember"]),
    Row("expired: resumed", Facts(EXPIRED), ["Observe", "Resume:question_expired", "Remember"]),
    Row("answered, already queued", Facts(ANSWERED, busy=True), ["Observe"]),
    Row("answered, owner unknown", Facts(NO_OWNER), ["Observe"]),
    Row(
        "the same answer failed lately: wait for its backoff",
        Facts(ANSWERED),
        ["Observe", "Schedule@+5"],
        FAILED_ANSWER,
    ),
    Row(
        "a different answer is not held back",
        Facts(replace(ANSWERED, answer_sig=(9, 9, 9))),
        ["Observe", "Resume:answer", "Remember"],
        FAILED_ANSWER,
    ),
    Row(
        "backoff over: resumed again",
        Facts(ANSWERED),
        ["Observe", "Resume:answer"],
        replace(FAILED_ANSWER, not_before=NOW.mono),
    ),
    Row(
        "dead owner: marked, and looked at again soon (the dying client may hold the lock)",
        Facts(DEAD_OWNER),
        ["Observe", "MarkInterrupted[]", "Schedule@+0.05", "Remember"],
    ),
    Row(
        "dead owner still there (the lock was held): marked again, the next look later",
        Facts(DEAD_OWNER),
        ["Observe", "MarkInterrupted[]", "Schedule@+0.4", "Remember"],
        Memory(mark_tries=3),
    ),
    Row(
        "a lock held for long: looked at no more than twice a minute",
        Facts(DEAD_OWNER),
        ["Observe", "MarkInterrupted[]", "Schedule@+30", "Remember"],
        Memory(mark_tries=40),
    ),
    Row(
        "marked since: the looks stop, the count starts afresh",
        Facts(INTERRUPTED),
        ["Observe", "Remember"],
        Memory(mark_tries=1),
    ),
    Row(
        "dead owner, auto-resume: marked, then resumed",
        Facts(DEAD_OWNER),
        ["Observe", "MarkInterrupted['Resume:interrupted']", "Schedule@+0.05", "Remember"],
        rules=AUTO,
    ),
    Row("interrupted: left for a person", Facts(INTERRUPTED), ["Observe"]),
    Row(
        "interrupted, auto-resume",
        Facts(INTERRUPTED),
        ["Observe", "Resume:interrupted", "Remember"],
        rules=AUTO,
    ),
    Row(
        "model outage: the first retry waits its delay",
        Facts(OUTAGE),
        ["Observe", "Schedule@+10", "Remember"],
    ),
    Row(
        "model outage, delay over: retried",
        Facts(OUTAGE),
        ["Observe", "Log:model_retry", "Resume:model_retry", "Remember"],
        Memory(model_not_before=NOW.mono),
    ),
    Row(
        "model outage, delay over but already queued: counted, not resumed",
        Facts(OUTAGE, busy=True),
        ["Observe", "Remember"],
        Memory(model_not_before=NOW.mono),
    ),
    Row(
        "model outage for longer than give_up_after: said once",
        Facts(LONG_OUTAGE),
        ["Observe", "Log:model_retry_gave_up", "Remember"],
    ),
    Row(
        "model outage, given up already: silent",
        Facts(LONG_OUTAGE),
        ["Observe"],
        Memory(gave_up=True),
    ),
    Row(
        "model retries off: an outage is an interrupted run",
        Facts(OUTAGE),
        ["Observe"],
        rules=NO_MODEL_RETRY,
    ),
    Row(
        "the run moved on: the outage memory is forgotten",
        Facts(DONE),
        ["Observe", "Remember"],
        Memory(model_attempts=3, model_not_before=NOW.mono + 40, gave_up=True),
    ),
    Row(
        "exit 75 (busy): backed off, growing",
        Facts(WAITING, exited=Exited("r1", exitcodes.BUSY, failed=False)),
        ["Observe", "Log:resume_busy", "Schedule@+30", "Remember"],
    ),
    Row(
        "exit 75 and the run already finished (another daemon or a person took it): busy, "
        "no warning, nothing to resume",
        Facts(DONE, exited=Exited("r1", exitcodes.BUSY, failed=False)),
        ["Observe", "Log:resume_busy", "Remember"],
    ),
    Row(
        "exit 75 after a timeout is a failure",
        Facts(DONE, exited=Exited("r1", exitcodes.BUSY, failed=True, timed_out=True)),
        ["Observe", "Log:resume_backoff", "Remember"],
    ),
    Row(
        "the resume failed: backoff, then the answer waits for it",
        Facts(ANSWERED, exited=Exited("r1", 1, failed=True)),
        ["Observe", "Log:resume_backoff", "Schedule@+5", "Remember"],
        Memory(key=ANSWER),
    ),
    Row(
        "exited cleanly, the same answer still there: repeated, backed off",
        Facts(ANSWERED, exited=Exited("r1", 0, failed=False)),
        ["Observe", "Log:resume_backoff", "Schedule@+5", "Remember"],
        Memory(key=ANSWER),
    ),
    Row(
        "exited cleanly and the run moved on: backoff forgotten",
        Facts(WAITING, exited=Exited("r1", exitcodes.WAITING, failed=False)),
        ["Observe", "Schedule@+30", "Remember"],
        FAILED_ANSWER,
    ),
    Row(
        "exited into a model outage: the model policy paces it, not resume backoff",
        Facts(OUTAGE, exited=Exited("r1", 69, failed=True)),
        ["Observe", "Schedule@+10", "Remember"],
        FAILED_ANSWER,
    ),
    Row(
        "elsewhere, its job just ended (killed) and it still says RUNNING: marked",
        Facts(REMOTE, exited=KILLED),
        ["Observe", "Log:resume_backoff", "MarkInterrupted[]", "Remember"],
    ),
    Row(
        "elsewhere, its job ended, auto-resume: marked, then resumed",
        Facts(REMOTE, exited=KILLED),
        ["Observe", "Log:resume_backoff", "MarkInterrupted['Resume:interrupted']", "Remember"],
        rules=AUTO,
    ),
    Row(
        "elsewhere, its job ended earlier (the mark was refused: lock held): marked again",
        Facts(REMOTE),
        ["Observe", "MarkInterrupted[]"],
        ENDED_B,
    ),
    Row(
        "elsewhere, its job lost by the engine (exit unknown): marked",
        Facts(REMOTE, exited=Exited("r1", None, failed=False, job="job gone")),
        ["Observe", "MarkInterrupted[]", "Remember"],
    ),
    Row(
        "elsewhere, its job exited 75 (another process drives the run): left alone",
        Facts(REMOTE, exited=Exited("r1", exitcodes.BUSY, failed=False, job="job busy")),
        ["Observe", "Log:resume_busy", "Remember"],
    ),
    Row(
        "elsewhere, its job exited 101 (the client settled the run): RUNNING is a stale read",
        Facts(REMOTE, exited=Exited("r1", exitcodes.WAITING, failed=False, job="job done")),
        ["Observe", "Remember"],
    ),
    Row(
        "elsewhere, a later owner (a person's `delta run` there) than the job's: left alone",
        Facts(replace(REMOTE, owner_pid=5, elsewhere=replace(NODE_B, pid=5))),
        ["Observe"],
        ENDED_B,
    ),
    Row(
        "elsewhere, no job of this daemon's known (a person's run there): left alone",
        Facts(REMOTE),
        ["Observe"],
    ),
    Row(
        "elsewhere, its job queued or running: alive",
        Facts(REMOTE, busy=True),
        ["Observe"],
        ENDED_B,
    ),
    Row(
        "elsewhere, the engine cannot be asked: left alone, said once",
        Facts(REMOTE, jobs_known=False),
        ["Observe", "Log:run_elsewhere_unknown", "Remember"],
    ),
    Row(
        "elsewhere, the engine still cannot be asked: silent",
        Facts(REMOTE, jobs_known=False),
        ["Observe"],
        Memory(told_unknown=True),
    ),
    Row(
        "a job's end is remembered only while the run is elsewhere: moved on, forgotten",
        Facts(WAITING),
        ["Observe", "Schedule@+30", "Remember"],
        replace(ENDED_B, told_unknown=True),
    ),
    Row(
        "a local run's job ended: the local rule (its /proc) judges it, not the job",
        Facts(seen(State.RUNNING, owner_pid=1), exited=Exited("r1", 0, False, job="job x")),
        ["Observe"],
    ),
    Row(
        "looking raised: quarantined",
        Facts(error="ValueError: bad"),
        ["Log:workspace_problem", "Quarantine@+5", "Remember"],
    ),
    Row(
        "raised again: quarantined longer",
        Facts(error="ValueError: bad"),
        ["Log:workspace_problem", "Quarantine@+20", "Remember"],
        Memory(quarantines=2),
    ),
    Row(
        "a good look ends the quarantine",
        Facts(DONE),
        ["Observe", "Remember"],
        Memory(quarantines=2, quarantined_until=NOW.mono - 1),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.why for r in ROWS])
def test_decide(row: Row) -> None:
    assert kinds(decide(row.facts, row.memory, NOW, row.rules)) == row.expected


def remembered(effects: list[Effect]) -> Memory:
    [memory] = [e.memory for e in effects if isinstance(e, Remember)]
    return memory


def test_resume_keys_name_what_each_resume_is_for() -> None:
    def key(facts: Facts, rules: Rules = RULES) -> object:
        effects = decide(facts, FRESH, NOW, rules)
        for e in effects:
            if isinstance(e, MarkInterrupted):
                effects = list(e.then)
        [resume] = [e for e in effects if isinstance(e, Resume)]
        return resume.key

    assert key(Facts(ANSWERED)) == AnswerKey(SIG)
    assert key(Facts(EXPIRED)) == ExpiredKey("q1")
    assert key(Facts(INTERRUPTED), AUTO) == InterruptedKey("r1")
    assert key(Facts(DEAD_OWNER), AUTO) == InterruptedKey("r1")
    ready = Memory(model_not_before=NOW.mono)
    [retry] = [e for e in decide(Facts(OUTAGE), ready, NOW, RULES) if isinstance(e, Resume)]
    assert retry.key == ModelRetryKey("r1", 1)


def test_resume_backoff_doubles_up_to_its_cap() -> None:
    rules = replace(RULES, resume=Pacing(1.0, 4.0))
    failed = Facts(ANSWERED, exited=Exited("r1", 1, failed=True))
    memory, delays = Memory(key=ANSWER), []
    for _ in range(4):
        memory = remembered(decide(failed, memory, NOW, rules))
        delays.append(memory.not_before - NOW.mono)
    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert memory.key == ANSWER and memory.failures == 4


def test_model_retries_pace_then_give_up_once() -> None:
    memory, at = FRESH, NOW
    steps = []
    for advance in (0, 10, 5, 15):
        at = Now(at.mono + advance, at.wall + advance)
        effects = decide(Facts(OUTAGE), memory, at, RULES)
        memory = remembered(effects) if any(isinstance(e, Remember) for e in effects) else memory
        steps.append([k for k in kinds(effects) if k.startswith(("Resume", "Log"))])
    # waits 10, retries; the second waits 20 (5 s in: not yet; 20 s in: retried)
    assert steps == [
        [],
        ["Log:model_retry", "Resume:model_retry"],
        [],
        ["Log:model_retry", "Resume:model_retry"],
    ]
    late = Now(at.mono, OUTAGE.failing_since + 100)  # type: ignore[operator]
    gave_up = decide(Facts(OUTAGE), memory, late, RULES)
    assert "Log:model_retry_gave_up" in kinds(gave_up)
    assert "Log:model_retry_gave_up" not in kinds(
        decide(Facts(OUTAGE), remembered(gave_up), late, RULES)
    )


def test_a_quarantined_workspace_is_left_alone_until_its_time() -> None:
    memory = remembered(decide(Facts(error="OSError: x"), FRESH, NOW, RULES))
    assert quarantined(memory, NOW)
    assert not quarantined(memory, Now(memory.quarantined_until, NOW.wall))
    assert not quarantined(FRESH, NOW)


def test_a_problem_is_observed_not_acted_on() -> None:
    effects = decide(Facts(seen(State.PROBLEM, problem="x")), FRESH, NOW, RULES)
    assert effects == [Observe(seen(State.PROBLEM, problem="x"))]
    assert Drop() not in effects


def test_a_run_elsewhere_is_marked_for_the_owner_it_was_judged_by() -> None:
    """The mark carries the owner and the job's end: re-checked under the workspace lock."""
    [mark] = [
        e
        for e in decide(Facts(REMOTE, exited=KILLED), FRESH, NOW, RULES)
        if isinstance(e, MarkInterrupted)
    ]
    assert mark.elsewhere == Elsewhere(NODE_B, "job deltad-1 (77) ended: killed_by_SIGKILL")
    assert mark.run_id == "r1"
