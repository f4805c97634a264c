"""A Slurm controller outage under a real `deltad serve` (the e2e test and the bench share it).

A real daemon with `executor: slurm` runs in the cluster's network namespace, with the systemd
watchdog on (`WATCHDOG_USEC`, its pings and status lines read from a `NOTIFY_SOCKET` of our
own), its HTTP inbox on loopback (answers and /metrics) and the periodic full reconcile pushed
out of reach (`rescan_interval_seconds`), so that only the resumer's own retry can resume what
is answered during the outage. One workspace is answered and resumed first (the cluster works;
its job's end is seen before the outage, so no job of ours ends while slurmctld cannot hear of
it). Then slurmctld goes away for `pause` seconds, either hung (`sigstop`: SIGSTOP, its port
takes connections and nothing answers) or stopped (`stop`: SIGTERM, its port refuses; started
again from its saved state after), and the other workspaces are answered meanwhile, every
other one through the inbox (`POST /v1/requests/{id}/answer`), the rest as files.

What comes back (`Figures`) is what the daemon did: whether it queued each answer while the
controller was away (its loop went on), the loop's turn times meanwhile (the
`deltad_loop_turn_seconds` histogram read from /metrics at the outage's start and end), the
gaps between its watchdog pings and how many status lines it sent, and for each answer of the
outage how long after the controller answered again its job was submitted (the daemon's part),
started (Slurm's scheduling) and ingested the answer, and how many times it was submitted and
resumed (exactly once each).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from deltad.testing.stub import paused_workspace
from tests.support.daemon import Daemon, answer, records, stub_command, wait_for
from tests.support.slurmcluster import Cluster

NOBODY = 65534  # the workspaces' owner: the jobs run as nobody
TURN_METRIC = "deltad_loop_turn_seconds"
TURN_CPU_METRIC = "deltad_loop_turn_cpu_seconds"
Mode = Literal["sigstop", "stop"]


@dataclass(frozen=True)
class Turns:
    """The loop-turn histogram's growth over a span: cumulative counts by upper edge."""

    buckets: tuple[tuple[float, float], ...]  # (le, turns that took at most le), le ascending
    count: float
    total_s: float

    def within(self, le: float) -> float | None:
        """The share of turns that took at most `le` (an edge of the histogram), exactly."""
        if not self.count:
            return None
        return next(n for edge, n in self.buckets if edge >= le) / self.count

    def quantile_le(self, q: float) -> float | None:
        """The smallest edge at or under which a share `q` of the turns fall (an upper bound
        of that quantile: the histogram says no more)."""
        if not self.count:
            return None
        return next((edge for edge, n in self.buckets if n >= q * self.count), float("inf"))


def turns(text: str, metric: str = TURN_METRIC) -> Turns:
    """A loop-turn histogram of a /metrics exposition (wall time, or `TURN_CPU_METRIC`)."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets[float(s.labels["le"])] = s.value
            elif s.name.endswith("_count"):
                count = s.value
            elif s.name.endswith("_sum"):
                total = s.value
    return Turns(tuple(sorted(buckets.items())), count, total)


def grown(before: Turns, after: Turns) -> Turns:
    """What the histogram counted between two reads."""
    old = dict(before.buckets)
    return Turns(
        tuple((le, n - old.get(le, 0.0)) for le, n in after.buckets),
        after.count - before.count,
        after.total_s - before.total_s,
    )


@dataclass
class Figures:
    mode: str
    pause_s: float
    answered_during: int
    answered_over_http: int  # of those, through the inbox (202 while slurmctld was away)
    queued_during: int  # answers the loop handled while slurmctld was away
    turns: Turns  # the loop's turns while slurmctld was away
    turns_cpu: Turns  # their CPU time
    # With `baseline`: the same span, as many answers the same way, slurmctld up, just before.
    baseline: Turns | None = None
    baseline_cpu: Turns | None = None
    ping_gaps_s: list[float] = field(default_factory=list)  # between watchdog pings, meanwhile
    statuses_during: int = 0  # STATUS= lines sent meanwhile (status.json written with each)
    watchdog_s: float = 0.0  # WATCHDOG_USEC: a gap above it is a miss
    back_after_s: float = 0.0  # SIGCONT or the restart → slurmctld answered a query
    # From slurmctld's answering again, per answer of the outage (sorted): its job submitted
    # (sbatch answered: the daemon's part), started by then (Slurm's StartTime is whole
    # seconds: an upper bound), and the answer ingested by the job.
    submitted_after_s: list[float] = field(default_factory=list)
    started_by_s: list[float] = field(default_factory=list)
    resumed_after_s: list[float] = field(default_factory=list)
    submits: dict[str, int] = field(default_factory=dict)  # workspace → jobs submitted for it
    resumes: dict[str, int] = field(default_factory=dict)  # workspace → resumes that ingested
    spawn_failed_logged: int = 0  # resume_spawn_failed lines (said once per workspace)
    periodic_reconciles: int = 0

    @property
    def watchdog_misses(self) -> int:
        return sum(1 for g in self.ping_gaps_s if g > self.watchdog_s)

    def summary(self) -> dict[str, Any]:
        gaps = sorted(self.ping_gaps_s)
        p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else None
        t = self.turns
        return {
            **turn_figures("", t, self.turns_cpu),
            **(
                turn_figures("baseline_", self.baseline, self.baseline_cpu)
                if self.baseline is not None and self.baseline_cpu is not None
                else {}
            ),
            "mode": self.mode,
            "pause_s": round(self.pause_s, 3),
            "answered_during": self.answered_during,
            "answered_over_http": self.answered_over_http,
            "queued_during": self.queued_during,
            "statuses_during": self.statuses_during,
            "pings_during": len(gaps) + 1 if gaps else 0,
            "ping_gap_p50_s": statistics.median(gaps) if gaps else None,
            "ping_gap_p99_s": p99,
            "ping_gap_max_s": gaps[-1] if gaps else None,
            "watchdog_s": self.watchdog_s,
            "watchdog_misses": self.watchdog_misses,
            "back_after_s": round(self.back_after_s, 3),
            "submitted_after_s": [round(x, 3) for x in self.submitted_after_s],
            "started_by_s": [round(x, 3) for x in self.started_by_s],
            "resumed_after_s": [round(x, 3) for x in self.resumed_after_s],
            "submits_per_answer": sorted(set(self.submits.values())),
            "resumes_per_answer": sorted(set(self.resumes.values())),
            "spawn_failed_logged": self.spawn_failed_logged,
            "periodic_reconciles": self.periodic_reconciles,
        }


def turn_figures(prefix: str, wall: Turns, cpu: Turns) -> dict[str, Any]:
    def one(t: Turns) -> dict[str, Any]:
        return {
            "mean_ms": round(1000 * t.total_s / t.count, 3) if t.count else None,
            "within_50ms": t.within(0.05),
            "p99_le_s": t.quantile_le(0.99),
            "max_le_s": t.quantile_le(1.0),
            "buckets": {f"{le:g}": int(n) for le, n in t.buckets if n},
        }

    return {
        f"{prefix}turns": int(wall.count),
        f"{prefix}turn": one(wall),
        f"{prefix}turn_cpu": one(cpu),
    }


class Pings:
    """The daemon's sd_notify datagrams, timestamped (monotonic) as they arrive."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.at: list[float] = []
        self.statuses: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if b"WATCHDOG=1" in msg:
                self.at.append(time.monotonic())
            if msg.startswith(b"STATUS="):
                self.statuses.append(time.monotonic())

    def between(self, start: float, end: float) -> list[float]:
        """Gaps between the pings in [start, end], the edges counted as pings."""
        times = [start, *(t for t in list(self.at) if start <= t <= end), end]
        return [b - a for a, b in itertools.pairwise(times)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _own(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, NOBODY, NOBODY)


def wall_of(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def run(
    c: Cluster,
    shared: Path,
    pause: float,
    answers: int = 3,
    watchdog_s: float = 4.0,
    deadline: float = 120.0,
    mode: Mode = "sigstop",
    rescan_s: float = 3600.0,
    baseline: bool = False,
) -> Figures:
    """The scenario in `shared` (a directory every user can traverse); the interpreter must be
    executable by nobody (tests: `executable_by_all`). `rescan_s`: the periodic full
    reconcile's interval (an hour: whatever is resumed within the scenario was the retry's).
    `baseline`: first the same span with slurmctld up and as many answers, for comparison."""
    import httpx

    from tests.support.inbox import make_token

    root = shared / "root"
    root.mkdir()
    wss = [root / f"ws{i}" for i in range(answers * (2 if baseline else 1) + 1)]
    for ws in wss:
        paused_workspace(ws)
        _own(ws)
    rec_dir = shared / "records"
    rec_dir.mkdir()
    os.chown(rec_dir, NOBODY, NOBODY)
    record = rec_dir / "resumes.jsonl"
    state = shared / "daemon"
    state.mkdir(mode=0o700)
    daemon_id = f"outage{os.getpid()}"
    d = Daemon(
        state,
        [root],
        wrapper=["nsenter", f"--net={c.netns()}", "--"],
        executor="slurm",
        executors={
            "slurm": {
                "log_dir": str(shared / "logs"),
                "slurm_conf": str(c.conf),
                "daemon_id": daemon_id,
                "poll_every": 0.3,
            }
        },
        resume_command=stub_command(record, "consume"),
        max_parallel_resumes=8,
        rescan_interval_seconds=rescan_s,
        http={"listen": "127.0.0.1:0"},
        log_level="info",  # as run in production: the loop's turns are not a debug log's
    )
    answerer = make_token(d.state_dir, "outage")
    scraper = make_token(d.state_dir, "prom", role="metrics")
    pings = Pings(shared / "notify.sock")
    usec = str(int(watchdog_s * 1e6))
    env = {"NOTIFY_SOCKET": str(shared / "notify.sock"), "WATCHDOG_USEC": usec}

    def ingested(ws: Path) -> list[dict[str, Any]]:
        return [r for r in records(record) if r.get("workspace") == str(ws)]

    @contextlib.contextmanager
    def http(token: str) -> Iterator[httpx.Client]:
        """A client from the cluster's namespace, where the daemon listens."""
        [e] = d.wait_event("http_listening")
        with c.entered(), httpx.Client(base_url=e["url"], timeout=30) as client:
            client.headers["Authorization"] = f"Bearer {token}"
            yield client

    def scrape() -> tuple[Turns, Turns]:
        with http(scraper) as client:
            r = client.get("/metrics")
            r.raise_for_status()
            return turns(r.text), turns(r.text, TURN_CPU_METRIC)

    def since(before: tuple[Turns, Turns]) -> tuple[Turns, Turns]:
        after = scrape()
        return grown(before[0], after[0]), grown(before[1], after[1])

    def answer_all(some: list[Path]) -> tuple[float, int]:
        """Answer `some`, every other one through the inbox; wait until the loop queued each.
        (when it began, how many were queued)"""
        with http(answerer) as client:
            listed = client.get("/v1/requests", params={"limit": 1000}).json()["requests"]
        request_of = {q["workspace"]: q["request_id"] for q in listed}
        began = time.monotonic()
        for ws in some:
            if ws in some[::2]:
                with http(answerer) as client:
                    path = f"/v1/requests/{request_of[str(ws)]}/answer"
                    r = client.post(path, json={"answer": "during"})
                    assert r.status_code == 202, r.text
            else:
                answer(ws, "during")

        def all_queued() -> bool:
            return all(d.events("resume_queued", workspace=str(ws)) for ws in some)

        wait_for(all_queued, "the answers queued", deadline)
        return began, sum(1 for ws in some if d.events("resume_queued", workspace=str(ws)))

    def resumed_all(some: list[Path]) -> None:
        """Each of `some` ingested, and its job's end seen by the daemon (a second resume of
        one would have been submitted by then)."""
        wait_for(lambda: all(ingested(ws) for ws in some) or None, "every answer resumed", deadline)
        for ws in some:
            d.wait_event("resume_exited", workspace=str(ws), timeout=deadline)

    def away() -> contextlib.AbstractContextManager[None]:
        return c.paused() if mode == "sigstop" else c.stopped()

    try:
        d.start(env=env)
        answer(wss[0], "before")
        wait_for(lambda: ingested(wss[0]) or None, "the first resume (the cluster works)", deadline)
        # Its job's end seen by the daemon: Slurm heard of it before the outage (a job ending
        # while slurmctld is away keeps its node completing until slurmstepd's retry gets
        # through, which is Slurm's business, not this scenario's).
        d.wait_event("resume_exited", workspace=str(wss[0]), timeout=deadline)
        base: tuple[Turns, Turns] | None = None
        if baseline:
            calm = wss[1 : answers + 1]
            before = scrape()
            began, _ = answer_all(calm)
            time.sleep(max(0.0, pause - (time.monotonic() - began)))  # as long as the outage
            base = since(before)
            resumed_all(calm)
        during = wss[-answers:]
        by_http = during[::2]
        before = scrape()
        with away():
            began, queued = answer_all(during)
            time.sleep(max(0.0, pause - (time.monotonic() - began)))  # the outage's length
            meanwhile = since(before)
            ended = time.monotonic()
        back_mono = time.monotonic()
        wait_for(c.answers, "slurmctld answering again", deadline)
        back = time.time()  # the engine is back: it answers
        back_after = time.monotonic() - back_mono
        gaps = pings.between(began, ended)
        statuses = sum(1 for t in list(pings.statuses) if began <= t <= ended)
        resumed_all(during)
        resumed = sorted(max(0.0, ingested(ws)[0]["t"] - back) for ws in during)
        submitted_events = [e for e in d.events("slurm_submitted") if wall_of(e) > back - pause]
        submitted = sorted(max(0.0, wall_of(e) - back) for e in submitted_events)
        jobs = {e["job"] for e in submitted_events}
        # StartTime is whole seconds, cut: the job started before StartTime + 1 s.
        started = sorted(max(0.0, t + 1.0 - back) for t in _starts(c, jobs).values())
        names = {str(ws) for ws in during}
        spawned = [e for e in d.events("resume_spawned") if e.get("workspace") in names]
        submits = {str(ws): sum(1 for e in spawned if e["workspace"] == str(ws)) for ws in during}
        failed = sum(len(d.events("resume_spawn_failed", workspace=str(ws))) for ws in during)
        periodic = len(d.events("reconcile_full", reason="periodic"))
    finally:
        d.stop()
        pings.close()
        out = c.run("squeue", "-h", "--states=all", "-O", "JobID:|,Comment:0", check=False)
        for line in out.stdout.splitlines():
            job, _, comment = line.partition("|")
            if f":{daemon_id}:" in comment:
                c.run("scancel", "--signal=KILL", "--full", job.strip(), check=False)
    return Figures(
        mode=mode,
        pause_s=ended - began,
        answered_during=len(during),
        answered_over_http=len(by_http),
        queued_during=queued,
        turns=meanwhile[0],
        turns_cpu=meanwhile[1],
        baseline=base[0] if base else None,
        baseline_cpu=base[1] if base else None,
        ping_gaps_s=gaps,
        statuses_during=statuses,
        watchdog_s=watchdog_s,
        back_after_s=back_after,
        submitted_after_s=submitted,
        started_by_s=started,
        resumed_after_s=resumed,
        submits=submits,
        resumes={str(ws): len(ingested(ws)) for ws in during},
        spawn_failed_logged=failed,
        periodic_reconciles=periodic,
    )


def _starts(c: Cluster, jobs: set[str]) -> dict[str, float]:
    """Slurm's StartTime (UTC, whole seconds) of `jobs`, as wall clock."""
    import calendar

    argv = ["env", "TZ=UTC", "squeue", "-h", "--states=all", "-O", "JobID:|,StartTime"]
    out = c.run(*argv, check=False)
    found: dict[str, float] = {}
    for line in out.stdout.splitlines():
        job, _, start = (p.strip() for p in line.partition("|"))
        if job in jobs:
            with contextlib.suppress(ValueError):
                found[job] = float(calendar.timegm(time.strptime(start, "%Y-%m-%dT%H:%M:%S")))
    return found
