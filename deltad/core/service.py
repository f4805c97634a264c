"""The main loop, the daemon's imperative shell: one thread selects on the inotify fd, the hint
queue, the signal pipe and the resume children's fds, looks at workspaces (`reconcile.inspect`),
asks `decide.decide` what to do, and carries the effects out (`_carry_out`). No rule of when to
resume lives here. The service composes the two objects around it: its `Lifecycle`
(`lifecycle.py`: the role, the lease, lock, signals, the inbox process, the backends, the
select loop, reload, shutdown and status) and its `Walker` (`walking.py`: full reconciles and
the reads after READY); each owns its own state and neither imports this module. The only
other threads are the polling backend's and watchdog's, which only produce hints.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import assert_never

import structlog

from deltad import tracing
from deltad.clock import SYSTEM, Clock
from deltad.core import decide as core
from deltad.core.anchoring import Anchoring
from deltad.core.answer import log_refusals
from deltad.core.config import DaemonConfig
from deltad.core.facts import Done, Exited, Facts, State, Verdict
from deltad.core.followplan import Plan
from deltad.core.followup import (
    NO_CHANNEL,
    TOLD,
    Store,
    beside_question,
    carriers,
    done_of,
    unsent,
    wanted,
)
from deltad.core.lease import Lease
from deltad.core.lifecycle import Lifecycle, Ticks
from deltad.core.reconcile import inspect, mark_interrupted
from deltad.core.registry import Registry
from deltad.core.resumer import Finished, Resumer
from deltad.core.sweep import Sweep
from deltad.core.tenancy import Refused
from deltad.core.timers import Timers
from deltad.core.traced import Traces
from deltad.core.unread import Unread
from deltad.core.walking import Walker
from deltad.health import Health
from deltad.inbox import answering, audit, auditnotes, quorum
from deltad.inbox.audit import audit_path
from deltad.inbox.feed import Feed
from deltad.inbox.receipts import receipt
from deltad.inbox.sealing import Sealer
from deltad.metrics import CoreMetrics, EngineEvents, Scraped
from deltad.protocol import ProtocolError, Workspace, followup, iso, seal, utcnow
from deltad.protocol.mailbox import Answer
from deltad.protocol.models import InteractionRequest
from deltad.protocol.runfacts import Elsewhere
from deltad.watch import Backend
from deltad.watch.discovery import is_workspace
from deltad.watch.hints import HintQueue, Why

log = structlog.get_logger("deltad.service")

HINT_BATCH = 500  # hints per loop turn, so the inotify fd is read between batches


class ReceiptUnwritten(Exception):
    """The audit log would not take a decision's receipt: its resume waits (and is retried)."""


class Service:
    def __init__(
        self,
        config: DaemonConfig,
        config_path: Path | None,
        extra_roots: tuple[str, ...],
        clock: Clock = SYSTEM,
        resumer: Resumer | None = None,
    ):
        self.clock = clock
        self.config = config
        self.queue = HintQueue()
        self.feed = Feed(config.http.event_buffer if config.http else 1000)
        self.registry = Registry(self.feed)  # its beliefs are the index's views
        self.resumer = resumer if resumer is not None else Resumer(config, clock)
        self.launcher = config.launcher()
        self.sealer: Sealer | None = None  # set as the daemon starts (use_key)
        self.rules = core.Rules.of(config)
        self.memory: dict[Path, core.Memory] = {}  # what decide() remembers, per workspace
        # Reminders and escalations done, per open question (durable: followup.py)
        self.followups = Store(config.state_dir / "followup")
        self.unsent_said = False  # a follow-up nothing carries was said (followup_no_channel)
        self.timers = Timers()
        self.dirty = True  # something status.json shows changed since it was written
        self._audit_failing = ""  # the audit log's last failure, said once (empty: none)
        # Receipts written this turn, fsynced once its resumes have started (`_sync_receipts`)
        self._unsynced_receipts: list[int] = []
        self.anchoring = Anchoring(config)
        self.life = Lifecycle(self, config_path, extra_roots)
        self.walker = Walker(
            self.registry,
            self.feed,
            clock,
            backends=lambda: self.life.backends,
            look=lambda ws, quiet: self.reconcile(ws, Why.CHECK, quiet=quiet),
            drop=self.drop,
            between=self.life.read_events,
            ended=self.life.swept,
        )
        # The core's metrics, and what the HTTP layer is handed next to the feed (health and
        # the metrics' exposition as plain data: deltad/health.py, deltad/metrics.py).
        self.metrics = CoreMetrics()
        quorum.observer = self.metrics.vote  # four eyes: votes are cast on the core's threads
        self.vitals = CoreVitals(self)
        self.metrics.registry.register(Scraped(self.vitals))
        self.metrics.registry.register(EngineEvents(lambda: self.resumer.engine_counts()))
        self.resumer.metrics = self.metrics
        self.traces: Traces | None = None  # tracing off (start_tracing)

    def start_tracing(self) -> None:
        """With `traces:` configured: the exporter (its own thread: the loop only queues spans)
        and the stages the loop records; without, nothing of OpenTelemetry is imported."""
        t = self.config.traces
        if t is None:
            return
        tracer = tracing.start(
            t.otlp_endpoint,
            t.service_name,
            tracing.headers_of(t.headers_file),
            t.timeout_seconds,
            t.max_queue,
        )
        tracing.current = tracer  # the channels' hand-offs record their own (outbound/hub.py)
        self.traces = Traces(tracer)
        self.feed.subscribe(self.traces.event)
        log.info("traces_exporting", endpoint=t.otlp_endpoint, service_name=t.service_name)

    def stop_tracing(self) -> None:
        """Export what is queued (within the exporter's timeout), at shutdown."""
        if self.traces is not None:
            self.traces.tracer.shutdown()
            tracing.current = tracing.OFF

    def run(self) -> int:
        return self.life.run()

    def use_key(self, sealer: Sealer) -> None:
        """The key every answer this daemon writes is sealed with (inbox/sealing.py); each
        resume is told it and the older keys still trusted, to check a gated answer with."""
        self.sealer = sealer
        answering.sealer = sealer
        self.launcher.fixed = self.decision_env()
        log.info("decision_key", key=sealer.public_text, file=str(self.config.decision_key_path()))

    def decision_env(self) -> dict[str, str]:
        if self.sealer is None:
            return {}
        keys = [self.sealer.public_text, *self.config.decision_keys_trusted]
        return {seal.ENV: ",".join(keys)}

    def configure(self, config: DaemonConfig) -> None:
        """A reload's new configuration (the lifecycle keeps what changes only on a restart):
        new rules, the memory of each workspace kept."""
        self.config = config
        self.launcher = config.launcher()
        self.launcher.fixed = self.decision_env()
        self.rules = core.Rules.of(config)
        self.resumer.configure(config)
        self.say_unsent()

    def say_unsent(self) -> None:
        """At start and on a reload: the daemon's own `follow_up:` that no channel carries
        (`deltad check` says it too)."""
        said = unsent(self.config)
        self.unsent_said = said is not None and said[0] == "warning"
        if said is not None and said[0] == "warning":
            log.warning("followup_no_channel", problem=said[1])

    # -- what the lifecycle and the walker own, read here -----------------------------------
    @property
    def ticks(self) -> Ticks:
        return self.life.ticks

    @property
    def lease(self) -> Lease | None:
        return self.life.lease

    @property
    def backends(self) -> list[Backend]:
        return self.life.backends

    @property
    def sweep(self) -> Sweep | None:
        return self.walker.sweep

    @property
    def unread(self) -> Unread:
        return self.walker.unread

    # -- one loop turn (the select itself: Lifecycle.loop) ----------------------------------
    def turn(self) -> None:
        self.queue.clear_wakeup()
        if self.queue.take_rescan():
            self.metrics.overflows.inc()
            self.full_reconcile("overflow", force=True)
        for _ in range(HINT_BATCH):
            hint = self.queue.pop()
            if hint is None:
                break
            self.reconcile(hint.workspace, hint.why)
        self.start_resumes()  # an answer's resume does not wait for the sweep's slice
        self.walker.recheck_step()  # after an overflow: who waits for an answer, first
        self.walker.sweep_step()
        self.walker.read_step()
        for fin in self.resumer.reap():
            self.after_resume(fin)
        now = self.clock.monotonic()
        self.resumer.enforce_timeouts(now)
        self._fire_timers(now)
        self.start_resumes()
        self._sync_receipts()  # after the turn's resumes started: none waits for these fsyncs
        self.feed.sync_due()
        self.life.tick(now)

    def _fire_timers(self, now: float) -> None:
        for ws in self.timers.due(now):
            self.queue.put(ws)
        if self.ticks.sweep_due(now, self.config):
            for ws in self.registry.running():
                if ws not in self.resumer.children:
                    self.queue.put(ws)
        if self.ticks.rescan_due(now, self.config):
            self.full_reconcile("periodic")
        self.anchoring.tick(now)

    def wake_at(self, ws: Path, when_monotonic: float) -> None:
        self.timers.wake(ws, when_monotonic)

    def full_reconcile(
        self, reason: str, *, force: bool = False, quiet: bool = False, at_once: bool = False
    ) -> None:
        self.walker.full_reconcile(reason, force=force, quiet=quiet, at_once=at_once)

    # -- one workspace: look, decide, act -------------------------------------------------------
    def _now(self) -> core.Now:
        return core.Now(self.clock.monotonic(), self.clock.time())

    def reconcile(self, ws: Path, why: Why, *, quiet: bool = False) -> None:
        if core.quarantined(self.memory.get(ws, core.FRESH), self._now()):
            return  # its timer brings it back
        if ws not in self.registry:
            if not is_workspace(ws):
                return
            self.registry.add(ws)
        if ws in self.resumer.children:
            return  # its exit brings us back here
        self._look(ws, why, None, quiet)

    def after_resume(self, fin: Finished) -> None:
        """The resume ended: look at once (a dead owner is marked now, not at the next sweep),
        and let `decide` judge whether that attempt failed."""
        r = fin.resume
        self.dirty = True
        log_refusals(r.workspace, r.run_id, r.spawned_at)
        # Its end judges a run on another host the job ran (decide.py, runfacts.py).
        job = f"job {r.handle.key.name} ({r.handle.ref}) ended: {fin.meaning}"
        exited = Exited(r.run_id, fin.rc, fin.failed, r.timed_out, job=job)
        if self.traces is not None:
            self.traces.resumed(r.workspace, r.run_id, fin.rc, fin.meaning)
        self._look(r.workspace, Why.CHECK, exited)

    def _look(self, ws: Path, why: Why, exited: Exited | None, quiet: bool = False) -> None:
        """Whatever is in a workspace, an exception here is that workspace's problem."""
        self.unread.discard(ws)
        self.walker.recheck.discard(ws)  # read after the overflow: nothing lost is left here
        memory = self.memory.get(ws, core.FRESH)
        try:
            seen = inspect(ws, why, self.config.settle_seconds, self.launcher.policy, self.clock)
            if self.traces is not None:
                self.traces.saw(ws, seen)
            busy = self.resumer.busy_with(ws)  # first: the first look adopts
            self._settle_followups(ws, seen)
            self._unsent_once(ws, seen)
            followed = self._followed(ws, seen)
            facts = Facts(
                seen,
                busy=busy,
                exited=exited,
                jobs_known=self.resumer.jobs_known,
                followed=followed,
            )
            self._carry_out(ws, core.decide(facts, memory, self._now(), self.rules), quiet)
        except Exception as e:
            first = str(e).splitlines()[0][:300] if str(e) else ""
            error = Facts(error=f"{type(e).__name__}: {first}")
            self._carry_out(
                ws, core.decide(error, self.memory.get(ws, core.FRESH), self._now(), self.rules)
            )
            log.debug("workspace_problem_detail", workspace=str(ws), exc_info=e)

    def _carry_out(self, ws: Path, effects: Iterable[core.Effect], quiet: bool = False) -> None:
        for effect in effects:
            match effect:
                case core.Drop():
                    self.drop(ws)
                case core.Observe(seen):
                    self.dirty |= self.registry.observe(ws, seen, quiet=quiet)
                case core.Resume():
                    self._resume(ws, effect)
                case core.MarkInterrupted(run_id, then, elsewhere):
                    if self._interrupt(ws, run_id, elsewhere):
                        self._carry_out(ws, then)
                case core.Schedule(at) | core.Quarantine(at):
                    self.wake_at(ws, at)
                    self.dirty |= isinstance(effect, core.Quarantine)
                case core.FollowUpDue():
                    self._follow_up(ws, effect)
                case core.Remember(memory):
                    self.memory[ws] = memory
                case core.Log(level, event, fields):
                    getattr(log, level)(event, workspace=str(ws), **fields)
                case _:
                    assert_never(effect)

    def _settle_followups(self, ws: Path, seen: Verdict) -> None:
        """A workspace on another question, or whose run ended, keeps no record of the last."""
        if seen.state is State.DONE or (seen.state is State.WAITING and seen.request_id):
            self.followups.settle(ws, seen.request_id)

    def _unsent_once(self, ws: Path, seen: Verdict) -> None:
        """A question (or its agent) asking for reminders or escalation that nothing would
        carry to anyone: said once a process (the daemon's own `follow_up:` is said at start;
        each one that comes due is said again, `followup_undelivered`)."""
        if self.unsent_said or seen.follow_up is None or seen.state is not State.WAITING:
            return
        rules = self.rules
        plan = Plan.of(
            seen.follow_up, rules.follow_up, rules.follow_up_floor, rules.follow_up_per_hour
        )
        kinds = [a for a in wanted(plan) if not carriers(self.config, ws, a)]
        if kinds:
            self.unsent_said = True
            log.warning(
                "followup_no_channel",
                workspace=str(ws),
                request_id=seen.request_id,
                kinds=["reminder" if a == "remind" else "escalation" for a in kinds],
                detail=f"the question asks for them and no channel carries them ({NO_CHANNEL}): "
                "they will be recorded and shown on the page, and nobody told",
            )

    def _followed(self, ws: Path, seen: Verdict) -> Done:
        """What was done about the open question: this daemon's record, else the one beside
        the question (written by another daemon of an HA fleet with a state dir of its own,
        or before the state dir was lost), so a takeover does not remind again."""
        rid = seen.request_id
        if rid is None or seen.state is not State.WAITING:
            return Done()
        if (rec := self.followups.get(ws, rid)) is not None:
            return done_of(rec)
        if seen.follow_up is None and self.rules.follow_up is None:
            return Done()  # nothing asked for: no file to read
        beside = followup.read(Workspace(ws).interaction_dir, rid)
        return done_of(beside) if beside is not None else Done()

    def _follow_up(self, ws: Path, e: core.FollowUpDue) -> None:
        """Remind, escalate or say overdue: written down first (a restart never repeats it),
        then the copy beside the question (the answering path, the page, the journal read it),
        then told on the feed (webhooks and channels re-send it). A failed write tells nobody:
        the next look finds it still due."""
        now = self.clock.time()
        via = carriers(self.config, ws, e.action)
        try:
            rec = self.followups.record(ws, e.request_id, e.action, now, e.plan, e.asked, via)
        except (OSError, ValueError) as err:
            log.error("followup_record_failed", workspace=str(ws), error=str(err))
            return
        try:
            beside_question(Workspace(ws).interaction_dir, rec)
        except (OSError, ValueError, ProtocolError) as err:
            log.warning("followup_beside_failed", workspace=str(ws), error=str(err))
        data: dict[str, object] = {
            "workspace": str(ws),
            "run_id": e.run_id,
            "request_id": e.request_id,
            "input_type": e.input_type,
        }
        if e.action == "remind":
            data["reminder"] = len(rec.reminders)
            self.feed.publish("request.reminder", data)
            log.info(
                "question_reminded",
                workspace=str(ws),
                request_id=e.request_id,
                reminder=len(rec.reminders),
            )
        elif e.action == "overdue":
            data["sla_due_at"] = iso(rec.sla_due_at) if rec.sla_due_at else None
            self.feed.publish("request.overdue", data)
            log.info("question_overdue", workspace=str(ws), request_id=e.request_id)
        else:
            data["escalated_to"] = list(e.plan.escalate_to)
            self.feed.publish("request.escalated", data)
            log.info(
                "question_escalated",
                workspace=str(ws),
                request_id=e.request_id,
                escalated_to=list(e.plan.escalate_to),
            )
        if e.action in TOLD and self.config.audit.enabled:  # once per send, as it is sent
            self._rotate_audit()
            auditnotes.followup_sent(
                audit_path(self.config),
                ws,
                e.request_id,
                "reminder" if e.action == "remind" else "escalation",
                via=via,
                number=len(rec.reminders) if e.action == "remind" else None,
                escalated_to=None if e.action == "remind" else list(e.plan.escalate_to),
            )
        if e.action in TOLD and not via:
            # Recorded and shown on the page, and carried to nobody: say so, not only "sent".
            log.warning(
                "followup_undelivered",
                workspace=str(ws),
                request_id=e.request_id,
                kind="reminder" if e.action == "remind" else "escalation",
                detail=f"no channel is configured to carry it ({NO_CHANNEL})",
            )
        self.metrics.follow_ups.labels(e.action).inc()
        self.dirty = True

    def _interrupt(self, ws: Path, run_id: str, elsewhere: Elsewhere | None = None) -> bool:
        try:
            meta = mark_interrupted(ws, run_id, elsewhere)
        except Exception as e:  # a damaged file here must not stop the daemon
            log.warning("mark_interrupted_failed", workspace=str(ws), run_id=run_id, error=str(e))
            return False
        if meta is None:
            return False
        self.registry.interrupted(ws)
        self.dirty = True
        return True

    def _resume(self, ws: Path, r: core.Resume) -> None:
        try:
            launch = self.launcher.prepare(ws, r.owner)
        except Refused as e:
            problem = replace(r.seen, state=State.PROBLEM, problem=str(e))
            self.dirty |= self.registry.observe(ws, problem)
            return
        sig = r.seen.answer_sig if r.reason == "answer" else None
        answered_at = sig[2] / 1e9 if sig is not None else None
        # An answer counts once: a retry of the same resume key is not a new answer.
        fresh = not self.resumer.busy_with(ws) and self.memory.get(ws, core.FRESH).key != r.key
        expired = r.reason == "question_expired"  # nobody answered: the rule decides
        if fresh and (sig is not None or expired):
            # No resume without its receipt: one that cannot be written holds the resume. The
            # raise is this workspace's problem (decide.py: paced, looked at again), and the
            # key is not remembered, so the next look writes the receipt and resumes.
            self._receipt(ws, r.run_id, expired=sig is None, answered=r.seen.answered)
        if self.traces is not None and not self.resumer.busy_with(ws):
            # The environment carrier: the resumed run's spans and questions join the trace.
            parent = self.traces.resuming(ws, r.seen, r.reason, answered_at, fresh=fresh)
            if parent is not None:
                launch.env[tracing.ENV] = parent
        queued = self.resumer.submit(
            ws, r.run_id, launch, r.owner.uid, r.seen.request_id or r.reason, answered_at
        )
        if queued and fresh and answered_at is not None:
            self.metrics.answers.labels(r.seen.channel or "file").inc()
            self.metrics.answered(r.seen.input_type, r.seen.created, answered_at)
        log.info("resume_queued", workspace=str(ws), run_id=r.run_id, reason=r.reason)
        self.dirty = True

    def _receipt(
        self,
        ws: Path,
        run_id: str | None,
        *,
        expired: bool,
        answered: tuple[InteractionRequest, Answer] | None = None,
    ) -> None:
        """The decision's receipt into the audit log (inbox/audit.py), before its resume;
        ReceiptUnwritten (the resume waits) when it cannot be written. Said once per distinct
        failure (`audit_failed`); each is counted (`deltad_audit_failures_total`)."""
        if not self.config.audit.enabled:
            return
        try:
            fields = receipt(ws, run_id, expired=expired, answered=answered)
            if fields is not None:
                path, cfg = audit_path(self.config), self.config.audit
                at = iso(utcnow())
                if aside := audit.rotate(path, cfg.rotate_bytes, cfg.keep_files, at):
                    log.info("audit_rotated", moved_aside=aside)
                entry = audit.append(path, fields, self._unsynced_receipts)
                log.info("audit_appended", workspace=str(ws), seq=entry["seq"])
            self._audit_failing = ""
        except Exception as e:
            self.metrics.audit_failures.inc()
            if str(e) != self._audit_failing:
                log.error("audit_failed", workspace=str(ws), error=str(e))
            self._audit_failing = str(e)
            why = f"its receipt could not be written ({e}): the resume waits"
            raise ReceiptUnwritten(why) from e

    def _sync_receipts(self) -> None:
        """The turn's receipts on disk. Written before their resumes (one that cannot be
        written holds its resume), fsynced after they started: a crash of the daemon loses
        none (the page cache has them), a power cut within these milliseconds could."""
        if not self._unsynced_receipts:
            return
        try:
            audit.sync(self._unsynced_receipts)
        except OSError as e:
            self.metrics.audit_failures.inc()
            log.error("audit_failed", error=f"fsync: {e.strerror}")

    def _rotate_audit(self) -> None:
        """Rotate the log if due before an entry other than a receipt (a failure is the
        entry's to say)."""
        cfg = self.config.audit
        try:
            if aside := audit.rotate(audit_path(self.config), cfg.rotate_bytes, cfg.keep_files,
                                     iso(utcnow())):  # fmt: skip
                log.info("audit_rotated", moved_aside=aside)
        except Exception as e:
            log.error("audit_failed", error=str(e))

    def start_resumes(self) -> None:
        if self.resumer.pending and not self.life.stopping:
            self.resumer.start_ready()
            self.dirty = True

    def drop(self, ws: Path) -> None:
        self.memory.pop(ws, None)  # the one memory of it: pacing, retries, quarantine
        self.followups.settle(ws, None)
        self.unread.discard(ws)
        self.walker.recheck.discard(ws)
        if self.traces is not None:
            self.traces.forget(ws)
        self.registry.drop(ws)
        for b in self.backends:
            b.forget(ws)
        self.dirty = True


@dataclass
class CoreVitals:
    """`health.Vitals` and `Source` in the daemon's own process: plain reads of the service's
    counts, from the HTTP thread. Each read is of a number or a copy made under the lock that
    guards it (the index's), never a walk over workspaces."""

    svc: Service

    def health(self) -> Health:
        svc = self.svc
        lease = svc.lease
        return Health(
            ready=svc.life.role.ready,
            index_complete=svc.ticks.indexed,
            unread=len(svc.unread),
            last_turn=svc.ticks.last_turn,
            lease_held=None if svc.config.ha is None else bool(lease and not lease.lost),
            workspaces=len(svc.registry),
        )

    def core_metrics(self) -> bytes:
        return self.svc.metrics.exposition()

    def workspaces_by_state(self) -> dict[str, int]:
        return self.svc.registry.counts()

    def questions(self) -> tuple[dict[str, int], float | None]:
        return self.svc.feed.index.pending_summary()

    def resumes(self) -> tuple[int, int]:
        return self.svc.resumer.counts()

    def roots(self) -> list[tuple[str, str]]:
        return [(str(r.path), r.backend) for r in self.svc.config.roots]

    def backends(self) -> list[tuple[str, int, bool]]:
        return [(b.name, b.watch_count(), b.healthy()) for b in list(self.svc.backends)]

    def outbox_depth(self) -> int | None:
        outbound = self.svc.life.outbound
        return None if outbound is None else outbound.outbox_depth()

    def channel_outbox_depth(self) -> list[tuple[str, int]]:
        inbox = self.svc.life.inbox
        handoff = inbox.serving.handoff if inbox is not None else None
        return [] if handoff is None else sorted(dict(handoff.channel_depth).items())
