"""The main loop: one thread selects on the inotify fd, the hint queue, the signal pipe and one
pidfd per resume child, and does everything else between selects (structured: no fire-and-forget
threads; the only other threads are the polling backend's and, for `backend: watchdog` roots,
watchdog's, which only produce hints).

Order at start (systemd path units do the same): take the state-dir lock → install watches →
full reconcile → READY=1. Anything that changed before the watches existed is caught by the
reconcile; anything after, by an event.
"""

from __future__ import annotations

import gc
import heapq
import os
import select
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import structlog

from deltad import logs
from deltad.protocol import Mailbox, ProtocolError, Workspace, iso, utcnow
from deltad.protocol.printable import show_path

from .backends import Backend, PollingBackend, event_backend
from .backoff import AnswerKey, Backoff, ExpiredKey, InterruptedKey, ModelRetryKey, ResumeKey
from .clock import SYSTEM, Clock
from .config import ConfigError, DaemonConfig, load_config
from .discovery import is_workspace
from .feed import Feed
from .notify import monotonic_usec, sd_notify, watchdog_interval
from .queue import HintQueue, Why
from .reconcile import Action, State, Verdict, inspect, mark_interrupted
from .registry import Registry
from .resumer import BUSY, Finished, Resumer
from .retry import ModelRetries, Step
from .status import AlreadyRunning, StateDirLock, capped, write_status
from .sweep import SWEEP_BUDGET, SWEEP_SLICE, Sweep
from .tenancy import Refused

log = structlog.get_logger("deltad.service")

HINT_BATCH = 500  # hints per loop turn, so the inotify fd is read between batches
STATUS_EVERY = 1.0  # seconds between status.json / STATUS= updates, when something changed
CHILD_POLL = 0.2  # without pidfds, how often to look for exited children


class Service:
    def __init__(
        self,
        config: DaemonConfig,
        config_path: Path | None,
        extra_roots: tuple[str, ...],
        clock: Clock = SYSTEM,
    ):
        self.clock = clock
        self.config = config
        self._config_path = config_path
        self._extra_roots = extra_roots
        self.queue = HintQueue()
        self.feed = Feed(config.http.event_buffer if config.http else 1000)
        self.registry = Registry(on_change=self.feed.changed)
        self.http: Any = None  # deltad.api.server.HttpServer, imported only when configured
        self.notifier: Any = None
        self.resumer = Resumer(config)
        self.launcher = config.launcher()
        self.model_retries = _model_retries(config)
        self.backoff = Backoff(config.backoff_initial_seconds, config.backoff_max_seconds)
        self.backends: list[Backend] = []
        self._timers: list[tuple[float, str]] = []
        self._sweep: Sweep | None = None  # a full reconcile in progress (deltad/daemon/sweep.py)
        self._quarantined: dict[Path, tuple[int, float]] = {}  # ws -> (failures, until)
        self._stop = self._reload = False
        self._dirty = True
        self._started = utcnow()
        self._last_status = self._last_ping = 0.0
        self._next_rescan = self._next_sweep = 0.0
        self._ready = False

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> int:
        lock = StateDirLock(self.config.state_dir)
        try:
            lock.acquire()
        except AlreadyRunning as e:
            log.error("already_running", error=str(e))
            print(f"deltad: {e}", file=sys.stderr)
            return 1
        except OSError as e:
            log.error("state_dir_unusable", path=str(self.config.state_dir), error=e.strerror)
            return 1
        sig_r = self._install_signals()
        try:
            if not self._start_inbox():
                return 2
            self._start()
            self._loop(sig_r)
            self._shutdown()
        finally:
            self._stop_inbox()
            lock.release()
        return 0

    def _start_inbox(self) -> bool:
        """The HTTP server and the notifiers: threads beside the loop, fed by the registry's
        changes. Started before the first reconcile, which they never wait for."""
        http, notify = self.config.http, self.config.notify
        context = None
        if http is not None:
            from deltad.api.server import HttpServer, ListenError

            try:
                self.http = HttpServer(http, self.feed, self.config.state_dir)
            except (ListenError, OSError, ValueError) as e:
                log.error("http_unusable", error=str(e))
                print(f"deltad: error: {e}", file=sys.stderr)
                return False
            self.http.start()
            context = self.http.context
        if notify is not None and (notify.webhooks or notify.commands):
            from deltad.api.notify import Notifier

            quiet = [r.path for r in self.config.roots if not r.notify]
            try:
                self.notifier = Notifier(notify, self.feed, quiet, context, self.config.state_dir)
            except (OSError, ValueError) as e:
                log.error("notify_unusable", error=str(e))
                print(f"deltad: error: notify: {e}", file=sys.stderr)
                return False
            self.notifier.start()
        return True

    def _stop_inbox(self) -> None:
        if self.notifier is not None:
            self.notifier.stop()
        if self.http is not None:
            self.http.stop()

    def _start(self) -> None:
        t0 = self.clock.monotonic()
        log.info(
            "daemon_starting",
            pid=os.getpid(),
            roots=[str(r.path) for r in self.config.roots],
            state_dir=str(self.config.state_dir),
        )
        self._build_backends()
        self.feed.priming = True  # a restart does not announce every waiting question again
        try:
            self.full_reconcile("startup", quiet=True, at_once=True)
        finally:
            self.feed.priming = False
        self._ready = True
        self._write_status(force=True)
        sd_notify("READY=1", self._status_line())
        log.info(
            "daemon_ready",
            workspaces=len(self.registry),
            watches=self._watch_counts(),
            duration_ms=int((self.clock.monotonic() - t0) * 1000),
        )

    def _install_signals(self) -> int:
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)

        def stop(signum: int, frame: object) -> None:
            self._stop = True

        def reload(signum: int, frame: object) -> None:
            self._reload = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)
        # A writer that opens an answer while `open_writers` holds its read lease makes the
        # kernel send us SIGIO, whose default action ends the process; the lease is let go
        # at once anyway. A handler, not SIG_IGN: an ignored signal stays ignored across the
        # exec of a resume child.
        signal.signal(signal.SIGIO, _lease_broken)
        return r

    def _build_backends(self) -> None:
        """One backend object per kind in use (each root's `backend`, resolved by the config);
        the poller always exists: it also takes what no longer fits under the watch limit."""
        poller = PollingBackend(self.queue, self.config.poll_interval_seconds)
        backends: list[Backend] = []
        for kind in ("fanotify", "inotify", "watchdog"):
            roots = [r for r in self.config.roots if r.backend == kind]
            if roots:
                tree = self._event_backend(kind, poller)
                for r in roots:
                    tree.add_root(r.path, self.config.discovery_depth)
                backends.append(tree)
        for r in self.config.roots:
            if r.backend == "polling":
                poller.add_root(r.path, self.config.discovery_depth)
        self.backends = [*backends, poller]

    def _event_backend(self, kind: str, poller: PollingBackend) -> Backend:
        return event_backend(kind, self.queue, poller, self.config.max_inotify_watches)

    def _close_backends(self) -> None:
        for b in self.backends:
            b.close()
        self.backends = []

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self, sig_r: int) -> None:
        now = self.clock.monotonic()
        self._next_rescan = now + self.config.rescan_interval_seconds
        self._next_sweep = now + self.config.liveness_sweep_seconds
        while not self._stop:
            readable = self._wait(sig_r)
            if sig_r in readable:
                _drain(sig_r)
            if self._reload:
                self._reload = False
                self.reload()
            for b in self.backends:
                if b.fileno() in readable:
                    self._process(b)
            self._turn()

    def _process(self, backend: Backend) -> None:
        try:
            backend.process()
        except Exception as e:  # a strange event must not stop the loop; a rescan catches up
            log.error("watch_event_failed", backend=backend.name, error=f"{type(e).__name__}: {e}")
            self.queue.request_rescan()

    def _wait(self, sig_r: int) -> list[int]:
        fds = [sig_r, self.queue.fileno(), *self.resumer.fds()]
        fds += [fd for b in self.backends if (fd := b.fileno()) is not None]
        urgent = len(self.queue) or self._stop or self._reload or self.resumer.can_start()
        urgent = urgent or self._sweep is not None
        timeout = 0.0 if urgent else self._timeout()
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            return []
        return readable

    def _timeout(self) -> float:
        now = self.clock.monotonic()
        times = [self._next_rescan, self._next_sweep]
        if self._timers:
            times.append(self._timers[0][0])
        if (deadline := self.resumer.next_deadline()) is not None:
            times.append(deadline)
        if (interval := watchdog_interval()) is not None:
            times.append(self._last_ping + interval)
        if self._dirty:
            times.append(self._last_status + STATUS_EVERY)
        if any(c.pidfd is None for c in self.resumer.children.values()):
            times.append(now + CHILD_POLL)
        return max(0.0, min(times) - now)

    def _turn(self) -> None:
        self.queue.clear_wakeup()
        if self.queue.take_rescan():
            self.full_reconcile("overflow", force=True)
        for _ in range(HINT_BATCH):
            hint = self.queue.pop()
            if hint is None:
                break
            self.reconcile(hint.workspace, hint.why)
        self._start_resumes()  # an answer's resume does not wait for the sweep's slice
        self._sweep_step()
        for fin in self.resumer.reap():
            self._after_resume_safely(fin)
        now = self.clock.monotonic()
        self.resumer.enforce_timeouts(now)
        self._fire_timers(now)
        self._start_resumes()
        self._write_status()
        self._ping_watchdog(now)

    def _fire_timers(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, key = heapq.heappop(self._timers)
            self.queue.put(Path(key))
        if now >= self._next_sweep:
            self._next_sweep = now + self.config.liveness_sweep_seconds
            for ws in self.registry.running():
                if ws not in self.resumer.children:
                    self.queue.put(ws)
        if now >= self._next_rescan:
            self._next_rescan = now + self.config.rescan_interval_seconds
            self.full_reconcile("periodic")

    def wake_at(self, ws: Path, when_monotonic: float) -> None:
        heapq.heappush(self._timers, (when_monotonic, str(ws)))

    # -- reconcile ---------------------------------------------------------------------------
    def full_reconcile(
        self, reason: str, *, force: bool = False, quiet: bool = False, at_once: bool = False
    ) -> None:
        """Start a full reconcile, done a bounded slice per loop turn (`_sweep_step`) so that
        events are served meanwhile; `at_once` runs it to the end now (at startup). A periodic
        one while another runs is left to that one; any other replaces it."""
        if self._sweep is not None:
            if reason == "periodic" and not force:
                return
            self._sweep.abandon()
        self._sweep = Sweep.start(self.backends, reason, self.clock, force=force, quiet=quiet)
        log.info("reconcile_full_started", reason=reason)
        if at_once:
            self._sweep.finish(self._swept, self.clock)
            self._sweep_done(self._sweep)

    def _sweep_step(self) -> None:
        sweep = self._sweep
        if sweep is not None and sweep.step(self._swept, self.clock, SWEEP_BUDGET, SWEEP_SLICE):
            self._sweep_done(sweep)

    def _swept(self, ws: Path) -> None:
        quiet = self._sweep is not None and self._sweep.quiet
        self.registry.add(ws, quiet=quiet)
        self.reconcile(ws, Why.CHECK, quiet=quiet)

    def _sweep_done(self, sweep: Sweep) -> None:
        self._sweep = None
        layout = sweep.layout
        for path, problem in layout.problems:
            log.warning("discovery_problem", path=str(path), problem=problem)
        for ws in [w for w in self.registry.workspaces if w not in layout.workspaces]:
            self._drop(ws)
        log.info(
            "reconcile_full",
            reason=sweep.reason,
            workspaces=len(self.registry),
            watches=self._watch_counts(),
            duration_ms=int((self.clock.monotonic() - sweep.started) * 1000),
        )
        self._dirty = True
        _settle_heap()

    def reconcile(self, ws: Path, why: Why, *, quiet: bool = False) -> None:
        """Look at one workspace and act. Whatever is in it, an exception here is that
        workspace's problem (logged, quarantined with backoff), never the daemon's."""
        until = self._quarantined.get(ws)
        if until is not None and self.clock.monotonic() < until[1]:
            return  # its timer brings it back
        try:
            self._reconcile(ws, why, quiet=quiet)
        except Exception as e:
            self._quarantine(ws, e)
        else:
            self._quarantined.pop(ws, None)

    def _quarantine(self, ws: Path, e: Exception) -> None:
        failures = self._quarantined.get(ws, (0, 0.0))[0] + 1
        delay = min(
            self.config.backoff_initial_seconds * 2 ** (failures - 1),
            self.config.backoff_max_seconds,
        )
        until = self.clock.monotonic() + delay
        self._quarantined[ws] = (failures, until)
        self.wake_at(ws, until)
        problem = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        log.warning(
            "workspace_problem",
            workspace=str(ws),
            problem=problem,
            quarantined_s=round(delay, 3),
            failures=failures,
        )
        log.debug("workspace_problem_detail", workspace=str(ws), exc_info=e)
        self._dirty = True

    def _reconcile(self, ws: Path, why: Why, *, quiet: bool = False) -> None:
        if ws not in self.registry:
            if not is_workspace(ws):
                return
            self.registry.add(ws)
        if ws in self.resumer.children:
            return  # its exit brings us back here
        v = inspect(ws, why, self.config.settle_seconds, self.launcher.policy, self.clock)
        self._act(ws, v, quiet=quiet)

    def _act(self, ws: Path, v: Verdict, *, quiet: bool = False) -> None:
        if v.action is Action.GONE:
            self._drop(ws)
            return
        self._dirty |= self.registry.observe(ws, v, quiet=quiet)
        if v.action is Action.MARK_INTERRUPTED:
            self._interrupt(ws, v)
        elif v.action is Action.RESUME and v.state is State.EXPIRED:
            self._resume(ws, v, ExpiredKey(v.request_id), reason="question_expired")
        elif v.action is Action.RESUME:
            self._resume(ws, v, AnswerKey(v.answer_sig), reason="answer")
        elif self._model_outage(v):
            self._retry_model(ws, v)
        elif v.state is State.INTERRUPTED and self.config.auto_resume_interrupted:
            self._resume(ws, v, InterruptedKey(v.run_id), reason="interrupted")
        if not self._model_outage(v):
            self.model_retries.forget(ws)
        if v.wake_at is not None:
            self.wake_at(ws, self.clock.monotonic() + max(0.0, v.wake_at - self.clock.time()))

    def _model_outage(self, v: Verdict) -> bool:
        return (
            self.config.model_retry.enabled
            and v.state is State.INTERRUPTED
            and v.error_kind == "model_unavailable"
        )

    def _retry_model(self, ws: Path, v: Verdict) -> None:
        d = self.model_retries.decide(
            ws, v.failing_since, self.clock.time(), self.clock.monotonic()
        )
        failing_for = round(self.clock.time() - v.failing_since, 1) if v.failing_since else None
        if d.step is Step.GIVE_UP:
            log.error(
                "model_retry_gave_up",
                workspace=str(ws),
                run_id=v.run_id,
                failing_for_s=failing_for,
                detail="the model endpoint has failed for longer than give_up_after_seconds; "
                "`delta run` resumes it once the endpoint is back",
            )
        elif d.step is Step.WAIT:
            self.wake_at(ws, d.at)
        elif d.step is Step.RESUME and not self.resumer.busy_with(ws):
            log.warning(
                "model_retry",
                workspace=str(ws),
                run_id=v.run_id,
                attempt=d.attempt,
                failing_for_s=failing_for,
            )
            self._resume(ws, v, ModelRetryKey(v.run_id, d.attempt), reason="model_retry")

    def _interrupt(self, ws: Path, v: Verdict) -> None:
        assert v.run_id is not None
        try:
            meta = mark_interrupted(ws, v.run_id)
        except Exception as e:  # a damaged file here must not stop the daemon
            log.warning("mark_interrupted_failed", workspace=str(ws), run_id=v.run_id, error=str(e))
            return
        if meta is None:
            return
        self.registry.interrupted(ws)
        self._dirty = True
        if self.config.auto_resume_interrupted:
            self._resume(ws, v, InterruptedKey(v.run_id), reason="interrupted")

    def _resume(self, ws: Path, v: Verdict, key: ResumeKey, reason: str) -> None:
        run_id = v.run_id
        if self.resumer.busy_with(ws) or v.owner is None:
            return
        try:
            launch = self.launcher.prepare(ws, v.owner)
        except Refused as e:
            problem = replace(v, state=State.PROBLEM, problem=str(e))
            self._dirty |= self.registry.observe(ws, problem)
            return
        not_before = self.backoff.allowed(ws, key, self.clock.monotonic())
        if not_before is not None:
            self.wake_at(ws, not_before)
            return
        self.backoff.started(ws, key)
        self.resumer.submit(ws, run_id, launch, v.owner.uid)
        log.info("resume_queued", workspace=str(ws), run_id=run_id, reason=reason)
        self._dirty = True

    def _start_resumes(self) -> None:
        if self.resumer.pending and not self._stop:
            self.resumer.start_ready()
            self._dirty = True

    def _after_resume_safely(self, fin: Finished) -> None:
        try:
            self._after_resume(fin)
        except Exception as e:
            self._quarantine(fin.child.workspace, e)

    def _after_resume(self, fin: Finished) -> None:
        """The child exited: look at once (a dead owner is marked now, not at the next sweep),
        then decide whether that attempt failed."""
        ws = fin.child.workspace
        self._dirty = True
        self._log_refusals(fin)
        v = inspect(ws, Why.CHECK, self.config.settle_seconds, self.launcher.policy, self.clock)
        self._judge(ws, fin, v)
        self._act(ws, v)

    def _log_refusals(self, fin: Finished) -> None:
        """The client moved an answer aside (it did not fit the question): say so here too.
        Only the names of the refusal notes are looked at, never what a user wrote: the
        reason is the client's to show (`delta status`), and may concern a secret."""
        since = int((fin.child.spawned_at - 1.0) * 1e9)  # file times are coarser
        try:
            notes = Mailbox(Workspace(fin.child.workspace)).rejected_since(since)
        except (OSError, ProtocolError):
            return
        for note in notes:
            log.warning(
                "answer_refused",
                workspace=str(fin.child.workspace),
                run_id=fin.child.run_id,
                file=note,
                detail="the client set the answer aside; `delta status` shows why",
            )
        try:
            stale = Mailbox(Workspace(fin.child.workspace)).stale_since(since)
        except (OSError, ProtocolError):
            return
        for name in stale:
            log.warning(
                "answer_set_aside",
                workspace=str(fin.child.workspace),
                run_id=fin.child.run_id,
                file=name,
                detail="an answer that no open question was waiting for; kept, not used",
            )

    def _judge(self, ws: Path, fin: Finished, v: Verdict) -> None:
        now = self.clock.monotonic()
        if self._model_outage(v):
            self.backoff.forget(ws)  # the model retry policy paces this run, not resume backoff
            return
        key: ResumeKey | None = AnswerKey(v.answer_sig) if v.action is Action.RESUME else None
        if v.state is State.EXPIRED:
            key = ExpiredKey(v.request_id)
        if v.state is State.INTERRUPTED or v.action is Action.MARK_INTERRUPTED:
            key = InterruptedKey(v.run_id)
        repeated = key is not None and key == self.backoff.last_key(ws)
        if fin.rc == BUSY and not fin.child.timed_out:
            # Someone else drives the run (a person at `delta run -i`, say): back off like a
            # failure, growing, instead of asking again every few seconds.
            failures, delay = self.backoff.failed(ws, now)
            log.info(
                "resume_busy",
                workspace=str(ws),
                run_id=fin.child.run_id,
                detail="another process is driving this run",
                retry_in_s=round(delay, 3),
            )
        elif fin.failed or repeated:
            failures, delay = self.backoff.failed(ws, now)
            log.warning(
                "resume_backoff",
                workspace=str(ws),
                run_id=fin.child.run_id,
                failures=failures,
                retry_in_s=round(delay, 3),
                exit_code=fin.rc,
                same_answer_still_there=repeated,
            )
        else:
            self.backoff.forget(ws)

    def _drop(self, ws: Path) -> None:
        self._quarantined.pop(ws, None)
        self.model_retries.forget(ws)
        self.registry.drop(ws)
        self.backoff.forget(ws)
        for b in self.backends:
            b.forget(ws)
        self._dirty = True

    # -- reload / stop -------------------------------------------------------------------------
    def reload(self) -> None:
        sd_notify("RELOADING=1", monotonic_usec())
        try:
            new = load_config(self._config_path, self._extra_roots)
        except ConfigError as e:
            log.error("config_reload_failed", error=str(e), action="keeping the old configuration")
            sd_notify("READY=1", self._status_line())
            return
        except Exception as e:  # whatever a file can do to a parser must not stop the daemon
            log.error(
                "config_reload_failed",
                error=f"{type(e).__name__}: {e}",
                action="keeping the old configuration",
            )
            sd_notify("READY=1", self._status_line())
            return
        if new.state_dir != self.config.state_dir:
            log.warning("state_dir_change_ignored", detail="changing state_dir needs a restart")
            new.state_dir = self.config.state_dir
        if new.http != self.config.http or new.notify != self.config.notify:
            log.warning("inbox_change_ignored", detail="http: and notify: change on a restart")
            new.http, new.notify = self.config.http, self.config.notify
        self.config = new
        self.launcher = new.launcher()
        m = new.model_retry  # keep what it knows (attempts, give-ups): only the pacing changes
        self.model_retries.initial, self.model_retries.cap = m.initial_seconds, m.max_seconds
        self.model_retries.give_up_after = m.give_up_after_seconds
        logs.configure(new.log_level, new.log_format)
        self.resumer.configure(new)
        self.backoff.initial, self.backoff.cap = (
            new.backoff_initial_seconds,
            new.backoff_max_seconds,
        )
        if self._sweep is not None:  # its walks belong to the backends about to be closed
            self._sweep.abandon()
            self._sweep = None
        self._close_backends()
        self._build_backends()
        log.info("config_reloaded", roots=[str(r.path) for r in new.roots])
        self.full_reconcile("reload")
        sd_notify("READY=1", self._status_line())

    def _shutdown(self) -> None:
        sd_notify("STOPPING=1")
        log.info(
            "daemon_stopping",
            in_flight=len(self.resumer.children),
            not_started=len(self.resumer.pending),
        )
        self._close_backends()  # stop watching first
        deadline = self.clock.monotonic() + self.config.shutdown_grace_seconds
        while self.resumer.children and self.clock.monotonic() < deadline:
            fds = self.resumer.fds()
            wait = min(
                CHILD_POLL if len(fds) < len(self.resumer.children) else 1.0,
                max(0.0, deadline - self.clock.monotonic()),
            )
            select.select(fds, [], [], wait)
            for fin in self.resumer.reap():
                self._after_resume_safely(fin)
        if pids := self.resumer.detach_all():
            log.warning(
                "resume_detached",
                pids=pids,
                detail="still running after the shutdown budget; left running",
            )
        self._ready = False
        self._write_status(force=True)
        log.info("daemon_stopped")

    # -- status / watchdog ---------------------------------------------------------------------
    def _watch_counts(self) -> dict[str, int]:
        return {b.name: b.watch_count() for b in self.backends}

    def snapshot(self) -> dict[str, Any]:
        r = self.registry
        resuming = [
            {"workspace": show_path(c.workspace), "run_id": c.run_id, "pid": c.pid}
            for c in self.resumer.children.values()
        ]
        pending = [show_path(ws) for ws, _, _ in self.resumer.pending]
        return {
            "pid": os.getpid(),
            "ready": self._ready,
            "started_at": iso(self._started),
            "updated_at": iso(utcnow()),
            "state_dir": show_path(self.config.state_dir),
            "http": self.http.url if self.http is not None else None,
            "roots": [
                {"path": show_path(x.path), "backend": x.backend, "polling": x.polling}
                for x in self.config.roots
            ],
            "watches": self._watch_counts(),
            "counts": {
                "workspaces": len(r),
                **r.counts(),
                "pending": len(pending),
                "resuming": len(resuming),
            },
            "pending": capped(pending),
            "resuming": capped(resuming),
            "waiting": capped(map(show_path, r.in_state(State.WAITING))),
            "interrupted": capped(map(show_path, r.in_state(State.INTERRUPTED))),
            "running": capped(map(show_path, r.in_state(State.RUNNING))),
            "problems": capped(r.problems()),
            # The first LIST_CAP found (sorted among themselves), not the 50,000 sorted.
            "workspaces": sorted(map(show_path, capped(r.workspaces))),
        }

    def _status_line(self) -> str:
        c = self.registry.counts()
        return (
            f"STATUS=watching {len(self.registry)} workspaces; "
            f"{c['waiting']} waiting, {len(self.resumer.pending)} pending, "
            f"{len(self.resumer.children)} resuming, {c['interrupted']} interrupted, "
            f"{c['problem']} with problems"
        )

    def _write_status(self, force: bool = False) -> None:
        now = self.clock.monotonic()
        if not force and (not self._dirty or now - self._last_status < STATUS_EVERY):
            return
        self._dirty = False
        self._last_status = now
        try:
            write_status(self.config.state_dir, self.snapshot())
        except OSError as e:
            log.warning("status_write_failed", error=e.strerror)
        if self._ready:
            sd_notify(self._status_line())

    def _ping_watchdog(self, now: float) -> None:
        interval = watchdog_interval()
        if interval is None or now - self._last_ping < interval:
            return
        if all(b.healthy() for b in self.backends):  # a dead watcher must let systemd restart us
            sd_notify("WATCHDOG=1")
            self._last_ping = now


def _model_retries(config: DaemonConfig) -> ModelRetries:
    m = config.model_retry
    return ModelRetries(m.initial_seconds, m.max_seconds, m.give_up_after_seconds)


def _lease_broken(signum: int, frame: object) -> None:
    """Nothing to do: `open_writers` has released (or is about to release) the lease."""


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _settle_heap() -> None:
    """After a full reconcile, what it built (an entry and watches per workspace) lives until
    the workspace goes. A full pass of the cyclic collector walks every tracked object, so with
    50,000 workspaces it would stop the loop for a time that grows with them, whenever it came;
    frozen objects are skipped by it (and still freed by reference counting). The young
    generations are collected first so that what is frozen is what lives on."""
    gc.collect(1)
    gc.freeze()
