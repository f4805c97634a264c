"""The daemon's lifecycle around the loop (`Lifecycle`, made and held by `service.Service`):
its role (`role.py`: standby, starting, active, fenced, stopping), the lease, the state-dir
lock, signals, the watch backends, the select loop, start, reload, shutdown, status.json and
systemd's sd_notify/watchdog. It holds the inbox process (`privsep/spawn.py`) and the core's
side of delivery (`outbound/wiring.py`), which compose themselves. It reaches the loop's core
only through the `Core` protocol, and does not import `service.py`.

Order at start (systemd path units do the same): take the state-dir lock → install watches →
full reconcile → READY=1. Anything that changed before the watches existed is caught by the
reconcile; anything after, by an event.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from deltad import health, logs, platform
from deltad.core.config import ConfigError, DaemonConfig, load_config
from deltad.core.facts import State
from deltad.core.lease import RENEWALS_PER_LEASE, Holder, Lease, LeaseError, read_holder
from deltad.core.notify import monotonic_usec, sd_notify, watchdog_interval
from deltad.core.resumer import shown
from deltad.core.role import Role, Seen, next_role
from deltad.core.status import (
    AlreadyRunning,
    StateDirLock,
    capped,
    standby_path,
    touch_status,
    write_status,
    write_status_file,
)
from deltad.core.sweep import Sweep
from deltad.core.walking import Walker, settle_heap
from deltad.health import Vitals
from deltad.inbox import auditnotes, sealing
from deltad.inbox.audit import audit_path
from deltad.protocol import iso, utcnow
from deltad.protocol.printable import show_path
from deltad.validation import Unusable, unusable
from deltad.watch import Backend, PollingBackend, event_backend
from deltad.watch.fanotify import FanotifyBackend
from deltad.watch.tree import WatchTree

if TYPE_CHECKING:
    from deltad.clock import Clock
    from deltad.core.followup import Store
    from deltad.core.registry import Registry
    from deltad.core.resumer import Finished, Resumer
    from deltad.core.timers import Timers
    from deltad.inbox.feed import Feed
    from deltad.inbox.sealing import Sealer
    from deltad.metrics import CoreMetrics
    from deltad.outbound.wiring import Outbound
    from deltad.privsep.spawn import InboxHost
    from deltad.watch.hints import HintQueue

log = structlog.get_logger("deltad.service")

STATUS_EVERY = 1.0  # seconds between status.json / STATUS= updates, when something changed
STATUS_HEARTBEAT = 5.0  # seconds between status.json rewrites at most, changed or not
FENCED_NAP = 0.05  # seconds between an unconfirmed active's looks at its lease's renewal


@dataclass
class Ticks:
    """The loop's periodic duties: when each is next due (monotonic)."""

    # Every workspace found is in the index (the reads after READY are done): /readyz. A fact
    # of the index, not of the role: it stays once true, fenced or not.
    indexed: bool = False
    last_turn: float | None = None  # monotonic: the loop's last turn (/livez)
    last_status: float = 0.0
    last_ping: float = 0.0
    next_rescan: float = 0.0
    next_sweep: float = 0.0
    # The state dir's lock, while a fenced active that lost the lease still holds it: tried
    # again at each status write until it is let go.
    state_lock: StateDirLock | None = None

    def __post_init__(self) -> None:
        self.started = utcnow()

    def start(self, now: float, config: DaemonConfig) -> None:
        # not before what the startup walk's length asked for (`walked`)
        self.next_rescan = max(self.next_rescan, now + config.rescan_interval_seconds)
        self.next_sweep = now + config.liveness_sweep_seconds

    def walked(self, ended: float, took: float, config: DaemonConfig) -> None:
        """A full reconcile ended: the next periodic one is due after it, not after its start."""
        self.next_rescan = rescan_after(ended, config.rescan_interval_seconds, took)

    def due(self, dirty: bool) -> list[float]:
        times = [self.next_rescan, self.next_sweep]
        if self.last_turn is not None:  # a heartbeat, so that /livez can tell stuck from idle
            times.append(self.last_turn + health.HEARTBEAT_SECONDS)
        if (interval := watchdog_interval()) is not None:
            times.append(self.last_ping + interval)
        if dirty:
            times.append(self.last_status + STATUS_EVERY)
        return times

    def sweep_due(self, now: float, config: DaemonConfig) -> bool:
        """Time to look at every live run again (an owner can die without an event)."""
        if now < self.next_sweep:
            return False
        self.next_sweep = now + config.liveness_sweep_seconds
        return True

    def rescan_due(self, now: float, config: DaemonConfig) -> bool:
        if now < self.next_rescan:
            return False
        self.next_rescan = now + config.rescan_interval_seconds
        return True


@dataclass
class Signals:
    """What the signal handlers asked for; they only set these, the loop reads them."""

    stop: bool = False  # SIGTERM, SIGINT
    reload: bool = False  # SIGHUP


RESCAN_SHARE = 0.1  # of the loop's time, at most, for the periodic full reconcile


def rescan_after(ended: float, interval: float, took: float) -> float:
    """When the next periodic full reconcile is due, one having ended at `ended` after `took`
    seconds: `interval` later, or later still where a walk is long enough that every
    `interval` would keep the daemon busy (1,000,000 workspaces walk in about 4 minutes: every
    5 minutes was 80 % of a core, and it slowed the reads after READY). It is a safety net for
    what events did not say; events, timers and the liveness sweep do not wait for it."""
    return ended + max(interval, took / RESCAN_SHARE)


class Core(Protocol):
    """What the lifecycle needs of the loop's core (`service.Service`): the index and the
    resumes it reports on, the hint queue and timers it waits on, the walker it starts walks
    with, one turn of the loop, and a new configuration to take on a reload. `dirty` says that
    something status.json shows has changed since it was last written."""

    clock: Clock
    config: DaemonConfig
    queue: HintQueue
    feed: Feed
    registry: Registry
    resumer: Resumer
    timers: Timers
    walker: Walker
    followups: Store
    metrics: CoreMetrics
    vitals: Vitals
    dirty: bool

    def turn(self) -> None: ...
    def after_resume(self, fin: Finished) -> None: ...
    def configure(self, config: DaemonConfig) -> None: ...
    def say_unsent(self) -> None: ...
    def use_key(self, sealer: Sealer) -> None: ...
    def start_tracing(self) -> None: ...
    def stop_tracing(self) -> None: ...


class Lifecycle:
    """The daemon's life around the loop: its role (`Role`, moved only by `role.next_role`),
    the lease (active or standby), the state-dir lock, signals, the watch backends, the select
    loop itself, reload, shutdown, status.json and systemd's sd_notify/watchdog. It owns these
    and the loop's periodic duties (`Ticks`), and holds the inbox process and the delivery
    threads; the core (`Core`) owns the index, the decisions and the resumes. Clock: the
    core's, `monotonic()` for every duty."""

    def __init__(self, core: Core, config_path: Path | None, extra_roots: tuple[str, ...]):
        self.core = core
        self.config_path = config_path
        self.extra_roots = extra_roots
        self.ticks = Ticks()
        self.signals = Signals()
        # `ha:` changes only on a restart: a fleet's daemon waits for the lease first.
        self.role = Role.STANDBY if core.config.ha is not None else Role.STARTING
        self.lease: Lease | None = None  # held while active, when `ha:` is configured
        self.backends: list[Backend] = []
        self.inbox: InboxHost | None = None  # the inbox process, when it has work
        self.outbound: Outbound | None = None  # the notifier and the channels
        self.written: dict[str, Any] | None = None  # status.json as last written, its time aside

    @property
    def stopping(self) -> bool:
        """Asked to stop, or the loop is over: no resume is started any more."""
        return self.signals.stop or self.role.ended

    def run(self) -> int:
        try:
            return self._run()
        except Unusable as e:  # what only starting finds (a port taken): one line, exit 2
            raise ConfigError(str(e)) from None

    def _run(self) -> int:
        sig_r = self._install_signals()
        ha = self.core.config.ha
        lease = Lease(ha.lease, ha.lease_seconds) if ha is not None else None
        try:
            # A standby holds nothing else until the lease is its own: not the state-dir lock
            # (the fleet may share one state dir), not the inbox's port.
            if lease is not None:
                try:
                    # the first try: a lease that cannot be opened is an error
                    lease.try_take(self.core.clock.monotonic())
                except LeaseError as e:
                    raise unusable("ha.lease", e) from None
                except OSError as e:
                    raise unusable("ha.lease", f"{lease.path}: {e.strerror}") from None
                if not self.stand_by(lease, sig_r):
                    return 0
                lease.start(self.core.clock.monotonic)
                self.lease = lease
                self.core.resumer.fence = lambda: lease.may_act(self.core.clock.monotonic())
            return self._run_active(sig_r)
        finally:
            if lease is not None:
                lease.release()  # last: the next daemon finds the state-dir lock free

    def _run_active(self, sig_r: int) -> int:
        lock = StateDirLock(self.core.config.state_dir)
        try:
            lock.acquire()
        except AlreadyRunning as e:
            if self.lease is None:
                log.error("already_running", error=str(e))
                print(f"deltad: {e}", file=sys.stderr)
                return 1
            # A frozen active that lost the lease still holds it (a shared state dir): the lease
            # fences it, and it stops as soon as it wakes (it acts on nothing before).
            log.warning("state_dir_lock_held", error=str(e), detail="fenced by the lease; going on")
            self.ticks.state_lock = lock  # taken once it stops (`tick`)
        except OSError as e:
            where = f"{self.core.config.state_dir}: {e.strerror}"
            raise unusable("state_dir", where) from None
        started = False
        try:
            # What can refuse the config comes first, before anything runs or logs: one line.
            self._open_inbox()
            self._make_executor()
            self._attach_feed()
            self.core.start_tracing()  # before the first look: its announcements are traced
            self._start_inbox()
            started = True
            self.start()
            self.loop(sig_r)
            if self._advance() is Role.LOST:  # lost meanwhile too: the new active's now
                self.close_backends()  # no status, no record of jobs
            else:
                self.shutdown()
        finally:
            if started:
                self._stop_inbox()
            elif self.inbox is not None:
                self.inbox.close_socket()  # bound, never served
            self.core.feed.close()
            self.core.stop_tracing()
            lock.release()
        return 1 if self.role is Role.LOST else 0

    # -- the role --------------------------------------------------------------------------------
    def _advance(
        self, *, held: bool | None = None, ready: bool = True, stopped: bool = False
    ) -> Role:
        """The role, after a look at the signals and the lease (`next_role`). `held`: what a
        standby's try at the lease found; `ready`: the startup reconcile is done; `stopped`:
        the shutdown is done."""
        lease, now = self.lease, self.core.clock.monotonic()
        seen = Seen(
            stop=self.signals.stop,
            held=held if held is not None else lease is None or lease.held,
            ready=ready,
            may_act=lease is None or lease.may_act(now),
            lost=lease is not None and lease.lost,
            stopped=stopped,
        )
        self._become(next_role(self.role, seen))
        return self.role

    def _become(self, role: Role) -> None:
        was, self.role = self.role, role
        if role is was:
            return
        log.info("role_changed", **{"from": str(was), "to": str(role)})
        lease = self.lease
        if lease is None:
            return
        if role is Role.FENCED:
            log.warning(
                "lease_unconfirmed",
                lease=str(lease.path),
                detail="its last renewal is too old to act on; acting on nothing until renewed",
            )
        elif role is Role.ACTIVE and was is Role.FENCED:
            log.info("lease_confirmed", lease=str(lease.path))
        elif role is Role.LOST:
            taken_by = lease.taken_by
            log.error(
                "lease_lost",
                lease=str(lease.path),
                held_by=taken_by.describe() if taken_by else None,
                epoch=taken_by.epoch if taken_by else None,
                detail=(
                    "another daemon holds the lease now; stopping (exit 1) to come back as standby"
                ),
            )

    def may_act(self) -> bool:
        """The fence, before each loop turn: with a lease, act only while its last renewal is
        recent (`lease.may_act`); after a gap (a freeze, storage away) act on nothing until the
        renewal thread has re-read the record (FENCED). A lost lease stops the daemon (LOST:
        exit 1, for systemd to bring it back as a standby); so does a signal (STOPPING)."""
        return self._advance() is Role.ACTIVE

    # -- active/standby --------------------------------------------------------------------------
    def stand_by(self, lease: Lease, sig_r: int) -> bool:
        """Wait for the lease, doing nothing else; True once held (STARTING), False if told to
        stop first (STOPPED). The active's death frees the flock at once, so a takeover costs at
        most one poll."""
        if self._advance(held=lease.held) is Role.STARTING:  # the first try, in `run`, took it
            _taken(lease, 0)
            return True
        assert self.core.config.ha is not None
        t0 = self.core.clock.monotonic()
        seen = read_holder(lease.path)
        log.info("standby", lease=str(lease.path), active=seen.describe() if seen else None)
        sd_notify("READY=1", _standby_line(lease, seen))
        mine, since = standby_path(self.core.config.state_dir), iso(utcnow())
        _say_standby(mine, lease, seen, since)
        try:
            while self.role is Role.STANDBY:
                try:
                    readable, _, _ = select.select(
                        [sig_r], [], [], self.core.config.ha.poll_seconds
                    )
                except InterruptedError:
                    readable = []
                if readable:
                    _drain(sig_r)
                # the lease is tried only while not asked to stop
                took = not self.signals.stop and _try_take(lease, self.core.clock.monotonic())
                if self._advance(held=took) is Role.STARTING:
                    waited = int((self.core.clock.monotonic() - t0) * 1000)
                    _taken(lease, waited)
                    return True
                # who, not each renewal (`seq`): said when another daemon holds it
                if self.role is Role.STANDBY and _who(now := read_holder(lease.path)) != _who(seen):
                    seen = now
                    sd_notify(_standby_line(lease, seen))
                    _say_standby(mine, lease, seen, since)
            log.info("standby_stopped", lease=str(lease.path))
            return False
        finally:
            with contextlib.suppress(OSError):
                mine.unlink()

    def _attach_feed(self) -> None:
        """The feed's event log and announced questions, kept in the state dir (held under its
        lock: one active daemon writes them)."""
        try:
            self.core.feed.attach(self.core.config.state_dir)
        except OSError as e:
            log.warning("feed_log_unusable", path=str(self.core.config.state_dir), error=str(e))
        try:  # reminders and escalations done before a restart (daemon/followup.py)
            self.core.followups.load()
        except OSError as e:
            log.warning("followup_store_unusable", path=str(self.core.followups.root), error=str(e))

    def _make_executor(self) -> None:
        """The executor, made (and adopting) before anything else starts: one it cannot make is a
        config error, one line (`deltad serve` exits 2), not a traceback from the first reconcile.
        Under `ha:` the fleet's daemons sign their jobs with one key, kept beside the lease."""
        from deltad.executors.remote import use_fleet_key_dir

        use_fleet_key_dir(
            self.core.config.ha.lease.parent if self.core.config.ha is not None else None
        )
        try:
            self.core.resumer.executor  # noqa: B018 - made on first use
        except ValueError as e:
            raise Unusable(str(e)) from None  # it names its key

    def _open_inbox(self) -> None:
        """The inbox process's host (its port bound, its certificate loaded, what it delivers
        handed over: privsep/spawn.py) and the core's side of delivery (the notifiers' secrets
        read: outbound/wiring.py), not yet started. One that cannot be made refuses the config
        (one line; `deltad serve` exits 2). Without `http:` the inbox process is started for
        the webhooks' and the channels' messages alone (no socket)."""
        from deltad.outbound.wiring import Outbound, sending

        config = self.core.config
        to_send = sending(config.notify, config.channels)
        if config.http is not None or to_send.needs_inbox:
            from deltad.privsep.spawn import open_inbox

            self.inbox = open_inbox(
                config.http,
                config.state_dir,
                self.core.feed,
                self.core.vitals,
                ["--log-level", config.log_level, "--log-format", config.log_format],
                to_send,
                self.core.metrics,
                audit_path(config) if config.audit.enabled else None,
            )
        inbox = self.inbox
        self.outbound = Outbound(
            config.notify,
            config.channels,
            self.core.feed,
            [r.path for r in config.roots if not r.notify],  # quiet roots
            config.state_dir,
            self.core.metrics,
            inbox.context if inbox is not None else None,
            inbox.serving.handoff if inbox is not None else None,
            audit_path(config) if config.audit.enabled else None,
        )

    def _start_inbox(self) -> None:
        """The inbox process and the delivery threads beside the loop, fed by the registry's
        changes. Started before the first reconcile, which they never wait for."""
        assert self.outbound is not None
        if self.inbox is not None:
            self.inbox.start()
        self.outbound.start()
        if self.inbox is not None:  # what the inbox relays from the Maildir is decided here
            self.inbox.take_mail(self.outbound.mail())

    def _stop_inbox(self) -> None:
        if self.inbox is not None:
            self.inbox.take_mail(None)  # what the inbox relays now waits for the next daemon
        if self.outbound is not None:
            self.outbound.stop()
        if self.inbox is not None:
            self.inbox.stop()

    def start(self) -> None:
        t0 = self.core.clock.monotonic()
        self._advance(ready=False)  # STARTING, once the lease is held
        log.info(
            "daemon_starting",
            pid=os.getpid(),
            roots=[str(r.path) for r in self.core.config.roots],
            state_dir=str(self.core.config.state_dir),
        )
        self.ticks.last_turn = t0  # starting counts as turning (/livez); each walk slice does too
        # Auditing switched off (or on again) since the log's last entry: said in the chain.
        auditnotes.switched(audit_path(self.core.config), self.core.config.audit.enabled)
        self.core.say_unsent()  # reminders no channel carries: said before they come due
        try:  # before any answer is written or any run resumed: every answer is sealed
            self.core.use_key(sealing.load_or_create(self.core.config.decision_key_path()))
        except sealing.KeyProblem as e:
            raise Unusable(str(e)) from None
        self.build_backends()
        self.core.feed.priming = True  # a restart does not announce every waiting question again
        # The walk makes long-lived objects only (a workspace's entry and watches): collections
        # during it find nothing and each walks all of them again (a third of its CPU time at
        # 100,000 workspaces). Its end freezes what it made (`settle_heap`).
        gc.disable()
        try:
            self.core.walker.full_reconcile("startup", quiet=True, at_once=True)
        finally:
            self.core.feed.priming = False
            gc.enable()
        self._advance()  # ACTIVE, unless a signal or the lease said otherwise meanwhile
        self.ticks.last_turn = self.core.clock.monotonic()
        self.write(force=True)
        sd_notify("READY=1", self.status_line())
        log.info(
            "daemon_ready",
            workspaces=len(self.core.registry),
            watches=self.watch_counts(),
            duration_ms=int((self.core.clock.monotonic() - t0) * 1000),
        )

    def _install_signals(self) -> int:
        r, w = platform.nonblocking_pipe()
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)

        def stop(signum: int, frame: object) -> None:
            self.signals.stop = True

        def reload(signum: int, frame: object) -> None:
            self.signals.reload = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, reload)
        # A writer that opens an answer while `open_writers` holds its read lease makes the
        # kernel send us SIGIO, whose default action ends the process; the lease is let go
        # at once anyway. A handler, not SIG_IGN: an ignored signal stays ignored across the
        # exec of a resume child.
        signal.signal(signal.SIGIO, _lease_broken)
        return r

    # -- the select loop -------------------------------------------------------------------------
    def loop(self, sig_r: int) -> None:
        """One thread selects on the inotify fd, the hint queue, the signal pipe and the resume
        children's fds, and does everything else between selects (`Service.turn`)."""
        self.ticks.start(self.core.clock.monotonic(), self.core.config)
        # One bisect and an add each per turn; the thread's CPU clock is one clock_gettime.
        metrics = self.core.metrics
        observe, observe_cpu = metrics.loop_turn.observe, metrics.loop_turn_cpu.observe
        while not self.role.ended:
            readable = self._wait(sig_r)
            began = time.perf_counter()  # the turn's own cost, whatever clock the service keeps
            cpu = time.thread_time()
            if sig_r in readable:
                _drain(sig_r)
            if not self.may_act():
                continue
            if self.signals.reload:
                self.signals.reload = False
                self.reload()
            for b in self.backends:
                if b.fileno() in readable or _behind(b):
                    self.process(b)
            self.core.turn()
            observe(time.perf_counter() - began)
            observe_cpu(time.thread_time() - cpu)

    def process(self, backend: Backend) -> None:
        try:
            backend.process()
        except Exception as e:  # a strange event must not stop the loop; a rescan catches up
            log.error("watch_event_failed", backend=backend.name, error=f"{type(e).__name__}: {e}")
            self.core.queue.request_rescan()

    def _wait(self, sig_r: int) -> list[int]:
        if self.role is Role.FENCED:  # nothing is done until the lease's renewal says whose it is
            fds = [sig_r]
            timeout = FENCED_NAP
        else:
            fds = [sig_r, self.core.queue.fileno(), *self.core.resumer.fds()]
            fds += [fd for b in self.backends if (fd := b.fileno()) is not None]
            urgent = (
                len(self.core.queue)
                or self.signals.stop
                or self.signals.reload
                or self.core.resumer.can_start()
            )
            urgent = (
                urgent
                or self.core.walker.sweep is not None
                or len(self.core.walker.unread) > 0
                or len(self.core.walker.recheck) > 0
                or any(_behind(b) for b in self.backends)
            )  # reads or events left: no nap
            timeout = 0.0 if urgent else self._timeout()
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            return []
        return readable

    def _timeout(self) -> float:
        now = self.core.clock.monotonic()
        times = self.ticks.due(self.core.dirty)
        if (due := self.core.timers.next_due()) is not None:
            times.append(due)
        if self.lease is not None:  # a lost lease is noticed within a renewal
            times.append(now + self.lease.seconds / RENEWALS_PER_LEASE)
        if (deadline := self.core.resumer.next_deadline()) is not None:
            times.append(deadline)
        if (poll := self.core.resumer.next_poll(now)) is not None:
            times.append(poll)
        times.extend(now + rest for b in self.backends if (rest := _rests_for(b)) is not None)
        return max(0.0, min(times) - now)

    def build_backends(self) -> None:
        """One backend object per kind in use (each root's `backend`, resolved by the config);
        the poller always exists: it also takes what no longer fits under the watch limit."""
        config = self.core.config
        poller = PollingBackend(self.core.queue, config.poll_interval_seconds)
        backends: list[Backend] = []
        for r in config.roots:
            log.info("backend_chosen", root=str(r.path), backend=r.backend, reason=r.why)
        for kind in ("fanotify", "inotify", "watchdog"):
            roots = [r for r in config.roots if r.backend == kind]
            if roots:
                try:
                    tree = event_backend(
                        kind,
                        self.core.queue,
                        poller,
                        config.max_inotify_watches,
                        config.max_watches_per_owner,
                    )
                    for r in roots:
                        tree.add_root(r.path, config.discovery_depth)
                except OSError as e:  # a kernel limit, a privilege: the config asks the impossible
                    where = ", ".join(str(r.path) for r in roots)
                    raise unusable("roots", f"backend {kind} cannot watch {where}: {e}") from None
                backends.append(tree)
        for r in config.roots:
            if r.backend == "polling":
                poller.add_root(r.path, config.discovery_depth)
        self.backends = [*backends, poller]

    def close_backends(self) -> None:
        for b in self.backends:
            b.close()
        self.backends = []

    def swept(self, sweep: Sweep) -> None:
        """A full reconcile has ended (the service dropped what it no longer found)."""
        for path, problem in sweep.layout.problems:
            log.warning("discovery_problem", path=str(path), problem=problem)
        now = self.core.clock.monotonic()
        self.ticks.walked(now, now - sweep.started, self.core.config)
        self.core.metrics.reconcile.labels(sweep.reason).observe(now - sweep.started)
        log.info(
            "reconcile_full",
            reason=sweep.reason,
            workspaces=len(self.core.registry),
            watches=self.watch_counts(),
            duration_ms=int((now - sweep.started) * 1000),
            next_periodic_in_s=round(self.ticks.next_rescan - now),
        )
        self.core.dirty = True
        settle_heap()

    def read_events(self) -> None:
        """Between slices of a walk run to its end (the walker's `between`): the backends'
        events become hints, and the slice counts as a turn of the loop (/livez)."""
        self.ticks.last_turn = self.core.clock.monotonic()
        for b in self.backends:
            self.process(b)

    def reload(self) -> None:
        sd_notify("RELOADING=1", monotonic_usec())
        new = self._reread()
        if new is None:
            sd_notify("READY=1", self.status_line())
            return
        if new.state_dir != self.core.config.state_dir:
            log.warning("state_dir_change_ignored", detail="changing state_dir needs a restart")
            new.state_dir = self.core.config.state_dir
        if new.http != self.core.config.http or new.notify != self.core.config.notify:
            log.warning("inbox_change_ignored", detail="http: and notify: change on a restart")
            new.http, new.notify = self.core.config.http, self.core.config.notify
        if new.channels != self.core.config.channels:
            log.warning("channels_change_ignored", detail="channels: change on a restart")
            new.channels = self.core.config.channels
        if new.ha != self.core.config.ha:
            log.warning("ha_change_ignored", detail="ha: changes on a restart")
            new.ha = self.core.config.ha
        logs.configure(new.log_level, new.log_format)  # first: the resumer may say something
        self.core.configure(new)  # what decide() remembers is kept: only the rules change
        self.core.walker.abandon()  # its walks belong to the backends about to be closed
        self.close_backends()
        self.build_backends()
        log.info("config_reloaded", roots=[str(r.path) for r in new.roots])
        self.core.walker.full_reconcile("reload")
        sd_notify("READY=1", self.status_line())

    def _reread(self) -> DaemonConfig | None:
        try:
            return load_config(self.config_path, self.extra_roots)
        except ConfigError as e:
            error = str(e)
        except Exception as e:  # whatever a file can do to a parser must not stop the daemon
            error = f"{type(e).__name__}: {e}"
        log.error("config_reload_failed", error=error, action="keeping the old configuration")
        return None

    def shutdown(self) -> None:
        sd_notify("STOPPING=1")
        resumer = self.core.resumer
        log.info(
            "daemon_stopping", in_flight=len(resumer.children), not_started=len(resumer.pending)
        )
        self.close_backends()  # stop watching first
        deadline = self.core.clock.monotonic() + self.core.config.shutdown_grace_seconds
        while resumer.children and (now := self.core.clock.monotonic()) < deadline:
            poll = resumer.next_poll(now)
            wait = min(1.0 if poll is None else poll - now, deadline - now)
            select.select(resumer.fds(), [], [], max(0.0, wait))
            for fin in resumer.reap():
                self.core.after_resume(fin)
        if jobs := resumer.detach_all():
            log.warning(
                "resume_detached",
                jobs=jobs,
                detail="still running after the shutdown budget; left running",
            )
        self._advance(stopped=True)  # STOPPED: status.json says not ready
        self.write(force=True)
        log.info("daemon_stopped")

    # -- status / watchdog -----------------------------------------------------------------------
    def watch_counts(self) -> dict[str, int]:
        return {b.name: b.watch_count() for b in self.backends}

    def capped_owners(self) -> dict[str, dict[str, int]]:
        """Owners whose directories reached `max_watches_per_owner`, by uid: the rest is polled."""
        out: dict[str, dict[str, int]] = {}
        for b in self.backends:
            if isinstance(b, WatchTree):
                for uid, n in b.capped_owners().items():
                    out[str(uid)] = n
        return out

    def snapshot(self) -> dict[str, Any]:
        r = self.core.registry
        resuming = [
            {"workspace": show_path(r.workspace), "run_id": r.run_id, **shown(r.handle)}
            for r in self.core.resumer.children.values()
        ]
        pending = [show_path(ws) for ws, _, _ in self.core.resumer.pending]
        return {
            "pid": os.getpid(),
            "role": "active",
            "lease": self._lease_doc(),
            "ready": self.role.ready,
            "health": _health_doc(self.core.vitals.health()),
            "started_at": iso(self.ticks.started),
            "updated_at": iso(utcnow()),
            "state_dir": show_path(self.core.config.state_dir),
            "http": self.inbox.url if self.inbox is not None else None,
            "inbox_pid": self.inbox.pid if self.inbox is not None else None,
            "roots": [
                {"path": show_path(x.path), "backend": x.backend, "polling": x.polling}
                for x in self.core.config.roots
            ],
            "watches": self.watch_counts(),
            "watch_capped_owners": self.capped_owners(),
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

    def _lease_doc(self) -> dict[str, Any] | None:
        lease = self.lease
        if lease is None or lease.holder is None:
            return None
        return {"path": show_path(lease.path), **lease.holder.__dict__}

    def status_line(self) -> str:
        c = self.core.registry.counts()
        role = "active: " if self.lease is not None else ""
        return (
            f"STATUS={role}watching {len(self.core.registry)} workspaces; "
            f"{c['waiting']} waiting, {len(self.core.resumer.pending)} pending, "
            f"{len(self.core.resumer.children)} resuming, {c['interrupted']} interrupted, "
            f"{c['problem']} with problems"
        )

    def tick(self, now: float) -> None:
        """The end of a loop turn: status.json when something changed, the systemd watchdog."""
        self.ticks.last_turn = now
        if self.role.ready and not self.ticks.indexed and not self.core.walker.unread:
            self.ticks.indexed = True  # stays: a workspace found later is read as any other
            self.core.dirty = True
            log.info("index_complete", workspaces=len(self.core.registry))
        if (
            lock := self.ticks.state_lock
        ) is not None and now - self.ticks.last_status >= STATUS_EVERY:
            self._take_state_lock(lock)
        self.write()
        interval = watchdog_interval()
        if interval is None or now - self.ticks.last_ping < interval:
            return
        if all(b.healthy() for b in self.backends):  # a dead watcher must let systemd restart us
            sd_notify("WATCHDOG=1")
            self.ticks.last_ping = now

    def _take_state_lock(self, lock: StateDirLock) -> None:
        """The state dir's lock, once the daemon that lost the lease has let it go (`deltad
        status` says whether a daemon runs by it)."""
        try:
            lock.acquire()
        except (AlreadyRunning, OSError):
            return
        self.ticks.state_lock = None
        self.core.dirty = True
        log.info("state_dir_lock_taken", path=str(lock.path))

    def write(self, force: bool = False) -> None:
        now = self.core.clock.monotonic()
        since = now - self.ticks.last_status
        if not force and (not self.core.dirty or since < STATUS_EVERY) and since < STATUS_HEARTBEAT:
            return
        self.core.dirty = False
        self.ticks.last_status = now
        snap = self.snapshot()
        content = {k: v for k, v in snap.items() if k != "updated_at"}
        try:
            if not force and content == self.written:
                touch_status(self.core.config.state_dir)  # the heartbeat: still so
            else:
                write_status(self.core.config.state_dir, snap)
                self.written = content
        except OSError as e:
            self.written = None
            log.warning("status_write_failed", error=e.strerror)
        if self.role.ready:
            sd_notify(self.status_line())


def _who(holder: Holder | None) -> tuple[str, int, str, int] | None:
    return None if holder is None else (holder.host, holder.pid, holder.since, holder.epoch)


def _taken(lease: Lease, waited_ms: int) -> None:
    previous = lease.previous
    log.info(
        "lease_taken",
        lease=str(lease.path),
        waited_ms=waited_ms,
        how=lease.taken.value if lease.taken else None,
        epoch=lease.holder.epoch if lease.holder else None,
        after=previous.describe() if previous else None,
    )


def _try_take(lease: Lease, now: float) -> bool:
    try:
        return lease.try_take(now)
    except (OSError, LeaseError) as e:  # storage away for a moment: a standby keeps waiting
        error = e.strerror if isinstance(e, OSError) else str(e)
        log.warning("lease_try_failed", lease=str(lease.path), error=error)
        return False


def _standby_line(lease: Lease, active: Holder | None) -> str:
    who = f", held by {active.describe()}" if active is not None else ""
    return f"STATUS=standby: waiting for the lease {lease.path}{who}"


def _say_standby(path: Path, lease: Lease, active: Holder | None, since: str) -> None:
    doc = {
        "role": "standby",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": since,
        "lease": show_path(lease.path),
        "active": active.__dict__ if active is not None else None,
    }
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_status_file(path, doc)
    except OSError as e:
        log.warning("status_write_failed", error=e.strerror)


def _rests_for(backend: Backend) -> float | None:
    # fanotify leaves its fd unread for a moment while others' writes are all it sees.
    return backend.rests_for() if isinstance(backend, FanotifyBackend) else None


def _behind(backend: Backend) -> bool:
    # An event tree handles a slice of the events it read per turn: the rest wait.
    return isinstance(backend, WatchTree) and backend.behind()


def _health_doc(h: health.Health) -> dict[str, Any]:
    """What /readyz decides from, for `deltad status` (which judges liveness by the file's
    `updated_at`: it is rewritten at least every STATUS_HEARTBEAT seconds)."""
    return {
        "ready": health.passing(health.ready_checks(h)),
        "checks": health.document(health.ready_checks(h))["checks"],
        "live_within_seconds": health.LIVE_WITHIN + STATUS_HEARTBEAT,
    }


def _lease_broken(signum: int, frame: object) -> None:
    """Nothing to do: `open_writers` has released (or is about to release) the lease."""


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass
