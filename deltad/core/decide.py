"""The daemon's functional core: every resume rule, as one pure function.

`decide(facts, memory, now, rules)` reads what `reconcile.inspect` found on disk (the facts:
frozen values of `facts.py`), what the daemon remembers of the workspace (`Memory`: pacing and
quarantine, kept between looks) and the time, and returns typed effects. It reads no file,
starts nothing and keeps no state, and imports nothing of the shell that looks and acts
(tests/unit/test_core_facts.py); the loop in `service.py` carries the effects out, one `match`
over `Effect`. Tested from tables: tests/unit/test_decide.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from deltad.core.backoff import AnswerKey, ExpiredKey, InterruptedKey, ModelRetryKey, ResumeKey
from deltad.core.facts import Action, Done, Exited, Facts, Owner, State, Verdict
from deltad.core.followplan import MAX_PER_HOUR, MIN_INTERVAL, Plan, after, next_step
from deltad.core.followplan import Action as FollowUpAction
from deltad.pacing import Pacing
from deltad.protocol import exitcodes
from deltad.protocol.followup import FollowUp
from deltad.protocol.runfacts import Elsewhere, JobEnd, RunFact, job_fact, judge_elsewhere

if TYPE_CHECKING:  # a type only: the configuration is data, read once per (re)load
    from deltad.core.config import DaemonConfig

MODEL_UNAVAILABLE = "model_unavailable"  # an INTERRUPTED run's error_kind that deltad retries
# A dead owner's run is marked under the workspace lock, which a dying client may still hold
# for a moment after its `live` file's close brought the look (the kernel reports that close
# before it drops the flock), and no later event comes: look again soon, then less often.
MARK_RECHECK_SECONDS = 0.05
MARK_RECHECK_MAX_SECONDS = 30.0


@dataclass(frozen=True)
class Rules:
    """The configuration `decide` reads (from `DaemonConfig`, again on a reload)."""

    resume: Pacing  # resumes that keep failing, and quarantined workspaces
    model: Pacing  # runs the model endpoint left INTERRUPTED
    model_retry: bool = True
    give_up_after: float = 3600.0  # seconds the model may fail before deltad stops retrying
    auto_resume_interrupted: bool = False
    follow_up: FollowUp | None = None  # the daemon's reminder/escalation defaults
    follow_up_floor: float = MIN_INTERVAL  # seconds between two reminders, at least
    follow_up_per_hour: int = MAX_PER_HOUR  # reminders of one question in an hour, at most

    @classmethod
    def of(cls, config: DaemonConfig) -> Rules:
        m = config.model_retry
        return cls(
            resume=Pacing(config.backoff_initial_seconds, config.backoff_max_seconds),
            model=Pacing(m.initial_seconds, m.max_seconds),
            model_retry=m.enabled,
            give_up_after=m.give_up_after_seconds,
            auto_resume_interrupted=config.auto_resume_interrupted,
            follow_up=config.follow_up,
            follow_up_floor=config.follow_up_limits.min_interval_seconds,
            follow_up_per_hour=config.follow_up_limits.max_per_hour,
        )


@dataclass(frozen=True)
class Now:
    mono: float  # orders the daemon's own deadlines
    wall: float  # what file times, `expires_at` and `model_failing_since` are measured on


@dataclass(frozen=True)
class Memory:
    """What the daemon remembers of one workspace between looks (in memory only: a restart
    starts every pacing afresh, which errs towards trying)."""

    key: ResumeKey | None = None  # what the last resume was for; another key starts afresh
    failures: int = 0  # failed resumes of `key`
    not_before: float = 0.0  # monotonic: no resume of `key` before this
    model_attempts: int = 0  # model-outage retries done
    model_not_before: float | None = None  # monotonic: the next model-outage retry
    gave_up: bool = False  # the model-outage give-up was said
    quarantines: int = 0  # looks in a row that raised
    quarantined_until: float = 0.0  # monotonic
    job_end: JobEnd | None = None  # the last job of this workspace seen ending (runs elsewhere)
    told_unknown: bool = False  # "its job's engine cannot be asked" was logged for this run
    mark_tries: int = 0  # looks in a row that found a dead owner to mark (see `_recheck_mark`)


FRESH = Memory()


# -- effects -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Drop:
    """The workspace is gone: forget it everywhere."""


@dataclass(frozen=True)
class Observe:
    """Tell the registry (and through it the inbox) what was seen."""

    seen: Verdict


@dataclass(frozen=True)
class Resume:
    run_id: str | None
    key: ResumeKey
    reason: str
    owner: Owner  # whom it runs as (checked by tenancy)
    seen: Verdict  # what it resumes (shown as a problem if the launch is refused)


@dataclass(frozen=True)
class MarkInterrupted:
    """RUNNING with a dead owner: write INTERRUPTED (under the lock, re-checked); `then` is
    carried out only if that write happened."""

    run_id: str
    then: tuple[Effect, ...] = ()
    elsewhere: Elsewhere | None = None  # on another host, its job ended: re-checked under lock


@dataclass(frozen=True)
class Schedule:
    at: float  # monotonic: look at the workspace again then


@dataclass(frozen=True)
class Quarantine:
    """Looking raised: leave the workspace alone until `until` (monotonic)."""

    until: float


@dataclass(frozen=True)
class FollowUpDue:
    """Remind the open question's respondents, escalate it, or say it is past its SLA
    (followup.py): recorded in the state dir and beside the question, then announced on the
    feed (webhooks, channels)."""

    request_id: str
    action: FollowUpAction
    plan: Plan
    asked: float  # wall: when the question was asked
    run_id: str | None = None
    input_type: str | None = None


@dataclass(frozen=True)
class Remember:
    memory: Memory


@dataclass(frozen=True)
class Log:
    level: Literal["debug", "info", "warning", "error"]
    event: str
    fields: Mapping[str, object] = field(default_factory=dict)


Effect = (
    Drop | Observe | Resume | MarkInterrupted | Schedule | Quarantine | FollowUpDue | Remember | Log
)


def quarantined(memory: Memory, now: Now) -> bool:
    """Looked at only when its quarantine ends (its timer brings it back)."""
    return memory.quarantines > 0 and now.mono < memory.quarantined_until


def decide(facts: Facts, memory: Memory, now: Now, rules: Rules) -> list[Effect]:
    if facts.error is not None:
        return _quarantine(facts.error, memory, now, rules)
    v = facts.seen
    if v is None or v.action is Action.GONE:
        return [Drop()]
    out: list[Effect] = [Observe(v)]
    mem = replace(memory, quarantines=0, quarantined_until=0.0)
    if facts.exited is not None:
        mem = _judge(facts.exited, v, mem, now, rules, out)
        if (ex := facts.exited).job is not None:  # bound to the owner the run names now
            mem = replace(mem, job_end=JobEnd(v.elsewhere, ex.rc, ex.job))
    if v.elsewhere is not None:
        mem = _elsewhere(v, facts, mem, now, rules, out)
    elif mem.job_end is not None or mem.told_unknown:  # the run moved on
        mem = replace(mem, job_end=None, told_unknown=False)
    mem = _act(v, facts.busy, mem, now, rules, out)
    # One wake-up: the sooner of the verdict's and the next reminder's (that look asks again).
    wake = _follow_up(v, facts.followed, now, rules, out)
    if v.wake_at is not None:
        wake = v.wake_at if wake is None else min(wake, v.wake_at)
    if wake is not None:
        out.append(Schedule(now.mono + max(0.0, wake - now.wall)))
    if mem != memory:
        out.append(Remember(mem))  # last: if an effect before it raises, nothing is forgotten
    return out


def _follow_up(v: Verdict, done: Done, now: Now, rules: Rules, out: list[Effect]) -> float | None:
    """A question nobody has answered yet: remind, escalate or say it is overdue when due;
    returns when the next is due (wall; followup.next_step). Not while an answer is being
    written."""
    if v.state is not State.WAITING or v.request_id is None or v.created is None:
        return None
    if v.answer_sig is not None:
        return None
    plan = Plan.of(v.follow_up, rules.follow_up, rules.follow_up_floor, rules.follow_up_per_hour)
    if plan is None or not plan.acts:
        return None
    step = next_step(plan, v.created, done, now.wall, v.deadline)
    if step.action is not None:
        out.append(FollowUpDue(v.request_id, step.action, plan, v.created, v.run_id, v.input_type))
        step = next_step(plan, v.created, after(done, step.action, now.wall), now.wall, v.deadline)
    return step.due


def model_outage(v: Verdict, rules: Rules) -> bool:
    return rules.model_retry and v.state is State.INTERRUPTED and v.error_kind == MODEL_UNAVAILABLE


def _act(v: Verdict, busy: bool, mem: Memory, now: Now, rules: Rules, out: list[Effect]) -> Memory:
    outage, key = model_outage(v, rules), resume_key(v)
    if v.action is Action.MARK_INTERRUPTED and v.run_id is not None:
        then: list[Effect] = []
        if rules.auto_resume_interrupted:
            mem = _resume(v, key, "interrupted", busy, mem, now, then)
        out.append(MarkInterrupted(v.run_id, tuple(then)))
        mem = _recheck_mark(mem, now, out)
        return _outage_over(mem, outage)
    if mem.mark_tries:  # the mark was written (or another took the run): recheck no more
        mem = replace(mem, mark_tries=0)
    if v.action is Action.RESUME and v.state is State.EXPIRED:
        mem = _resume(v, key, "question_expired", busy, mem, now, out)
    elif v.action is Action.RESUME:
        mem = _resume(v, key, "answer", busy, mem, now, out)
    elif outage:
        mem = _retry_model(v, busy, mem, now, rules, out)
    elif v.state is State.INTERRUPTED and rules.auto_resume_interrupted:
        mem = _resume(v, key, "interrupted", busy, mem, now, out)
    return _outage_over(mem, outage)


def _outage_over(mem: Memory, outage: bool) -> Memory:
    if not outage:  # the run moved on (or a person took it): the next outage starts afresh
        mem = replace(mem, model_attempts=0, model_not_before=None, gave_up=False)
    return mem


def _recheck_mark(mem: Memory, now: Now, out: list[Effect]) -> Memory:
    """A look after the mark: nothing if it was written (the run is INTERRUPTED then), the
    mark again if the lock was still held. Paced, doubling: a lock held for long (a person's
    `delta run` about to take the run over) is not asked for 20 times a second."""
    delay = min(MARK_RECHECK_SECONDS * 2**mem.mark_tries, MARK_RECHECK_MAX_SECONDS)
    out.append(Schedule(now.mono + delay))
    return replace(mem, mark_tries=mem.mark_tries + 1)


def _elsewhere(
    v: Verdict, facts: Facts, mem: Memory, now: Now, rules: Rules, out: list[Effect]
) -> Memory:
    """A RUNNING run on another host, judged from the executor's job for it (never from this
    host's /proc): its job ended → INTERRUPTED, like a dead local owner; the engine cannot be
    asked → left alone, said once per run."""
    owner = v.elsewhere
    assert owner is not None
    job = job_fact(owner, in_flight=facts.busy, ended=mem.job_end, engine_answered=facts.jobs_known)
    fact = judge_elsewhere(job)
    if fact is RunFact.JOB_ENDED:
        why = mem.job_end.detail if mem.job_end and mem.job_end.detail else "its job ended"
        then: list[Effect] = []
        if rules.auto_resume_interrupted:
            key = InterruptedKey(owner.run_id)
            mem = _resume(v, key, "interrupted", facts.busy, mem, now, then)
        out.append(MarkInterrupted(owner.run_id, tuple(then), Elsewhere(owner, why)))
    elif fact is RunFact.UNKNOWN and not mem.told_unknown:
        detail = "its executor's engine cannot say whether its job still runs; left as it is"
        fields = {"run_id": owner.run_id, "host": owner.host, "detail": detail}
        out.append(Log("warning", "run_elsewhere_unknown", fields))
        return replace(mem, told_unknown=True)
    return mem


def _resume(
    v: Verdict,
    key: ResumeKey | None,
    reason: str,
    busy: bool,
    mem: Memory,
    now: Now,
    out: list[Effect],
) -> Memory:
    if busy or v.owner is None or key is None:
        return mem
    if mem.key == key and now.mono < mem.not_before:
        out.append(Schedule(mem.not_before))  # the same thing failed lately: wait its turn
        return mem
    out.append(Resume(v.run_id, key, reason, v.owner, v))
    return mem if mem.key == key else replace(mem, key=key, failures=0, not_before=0.0)


def _retry_model(
    v: Verdict, busy: bool, mem: Memory, now: Now, rules: Rules, out: list[Effect]
) -> Memory:
    """An outage is not the run's fault: retry, paced, until the model has been failing for
    `give_up_after` by the run's own `model_failing_since` (which survives restarts)."""
    since = v.failing_since
    failing_for = round(now.wall - since, 1) if since is not None else None
    if since is not None and now.wall - since >= rules.give_up_after:
        if not mem.gave_up:
            detail = (
                "the model endpoint has failed for longer than give_up_after_seconds; "
                "`delta run` resumes it once the endpoint is back"
            )
            fields = {"run_id": v.run_id, "failing_for_s": failing_for, "detail": detail}
            out.append(Log("error", "model_retry_gave_up", fields))
        return replace(mem, gave_up=True)
    done = mem.model_attempts
    at = mem.model_not_before
    if at is None:
        at = now.mono + rules.model.delay(1)
    if now.mono < at:
        out.append(Schedule(at))
        return replace(mem, model_not_before=at)
    mem = replace(
        mem, model_attempts=done + 1, model_not_before=now.mono + rules.model.delay(done + 2)
    )
    if busy:
        return mem
    fields = {"run_id": v.run_id, "attempt": done + 1, "failing_for_s": failing_for}
    out.append(Log("warning", "model_retry", fields))
    return _resume(v, ModelRetryKey(v.run_id, done + 1), "model_retry", busy, mem, now, out)


def _judge(
    ex: Exited, v: Verdict, mem: Memory, now: Now, rules: Rules, out: list[Effect]
) -> Memory:
    """Did the resume that just exited fail? Then pace the next one."""
    if model_outage(v, rules):  # the model retry policy paces this run, not resume backoff
        return replace(mem, key=None, failures=0, not_before=0.0)
    repeated = (key := resume_key(v)) is not None and key == mem.key
    if ex.rc == exitcodes.BUSY and not ex.timed_out:
        # Someone else drives the run (a person at `delta run -i`, say): back off like a
        # failure, growing, instead of asking again every few seconds.
        mem, delay = _failed(mem, now, rules)
        detail = "another process is driving this run"
        busy = {"run_id": ex.run_id, "detail": detail, "retry_in_s": round(delay, 3)}
        out.append(Log("info", "resume_busy", busy))
    elif ex.failed or repeated:
        mem, delay = _failed(mem, now, rules)
        fields: dict[str, object] = {
            "run_id": ex.run_id,
            "failures": mem.failures,
            "retry_in_s": round(delay, 3),
            "exit_code": ex.rc,
            "same_answer_still_there": repeated,
        }
        out.append(Log("warning", "resume_backoff", fields))
    else:
        mem = replace(mem, key=None, failures=0, not_before=0.0)
    return mem


def resume_key(v: Verdict) -> ResumeKey | None:
    """What a resume of what was seen is for: the one derivation, used to resume and to tell
    a repeated resume after one exits (a model-outage retry has its own, by attempt)."""
    if v.state is State.INTERRUPTED or v.action is Action.MARK_INTERRUPTED:
        return InterruptedKey(v.run_id)
    if v.state is State.EXPIRED:
        return ExpiredKey(v.request_id)
    return AnswerKey(v.answer_sig) if v.action is Action.RESUME else None


def _failed(mem: Memory, now: Now, rules: Rules) -> tuple[Memory, float]:
    failures = mem.failures + 1
    delay = rules.resume.delay(failures)
    return replace(mem, failures=failures, not_before=now.mono + delay), delay


def _quarantine(error: str, mem: Memory, now: Now, rules: Rules) -> list[Effect]:
    """Whatever is in a workspace, an exception while looking at it is that workspace's
    problem (logged, left alone for a paced while), never the daemon's."""
    failures = mem.quarantines + 1
    delay = rules.resume.delay(failures)
    until = now.mono + delay
    fields = {"problem": error, "quarantined_s": round(delay, 3), "failures": failures}
    return [
        Log("warning", "workspace_problem", fields),
        Quarantine(until),
        Remember(replace(mem, quarantines=failures, quarantined_until=until)),
    ]
