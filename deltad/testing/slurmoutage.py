"""A Slurm controller outage under a real `deltad serve` (the e2e test and the bench share it).

A real daemon with `executor: slurm` runs in the cluster's network namespace, with the systemd
watchdog on (`WATCHDOG_USEC`, its pings read from a `NOTIFY_SOCKET` of our own) and the
periodic full reconcile pushed out of reach (`rescan_interval_seconds`), so that only the
resumer's own retry can resume what is answered during the outage. One workspace is answered
and resumed first (the cluster works); then slurmctld is stopped with SIGSTOP (a hung
controller: its port takes connections, nothing answers), more workspaces are answered, and
after `pause` seconds it gets SIGCONT. What comes back (`Figures`) is what the daemon did:
whether it queued each answer while the controller was hung (its loop went on), the gaps
between its watchdog pings (every turn that ends pings when one is due), and how long after
SIGCONT each answer's resume ingested it.
"""

from __future__ import annotations

import itertools
import os
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from .daemon import Daemon, answer, records, stub_command, wait_for
from .slurmcluster import Cluster
from .stub import paused_workspace

NOBODY = 65534  # the workspaces' owner: the jobs run as nobody


@dataclass
class Figures:
    pause_s: float
    answered_during: int
    queued_during: int  # answers the loop handled while slurmctld was stopped
    ping_gaps_s: list[float] = field(default_factory=list)  # between watchdog pings, meanwhile
    watchdog_s: float = 0.0  # WATCHDOG_USEC: a gap above it is a miss
    resumed_after_s: list[float] = field(default_factory=list)  # SIGCONT → each ingestion
    # SIGCONT → each of the outage's jobs submitted (sbatch answered): the daemon's part; the
    # rest of resumed_after_s is the cluster's (the one test node runs one job at a time).
    submitted_after_s: list[float] = field(default_factory=list)
    spawn_failed_logged: int = 0  # resume_spawn_failed lines (said once per workspace)
    periodic_reconciles: int = 0

    @property
    def watchdog_misses(self) -> int:
        return sum(1 for g in self.ping_gaps_s if g > self.watchdog_s)

    def summary(self) -> dict[str, Any]:
        gaps = sorted(self.ping_gaps_s)
        p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else None
        return {
            "pause_s": self.pause_s,
            "answered_during": self.answered_during,
            "queued_during": self.queued_during,
            "pings_during": len(gaps) + 1 if gaps else 0,
            "ping_gap_p50_s": statistics.median(gaps) if gaps else None,
            "ping_gap_p99_s": p99,
            "ping_gap_max_s": gaps[-1] if gaps else None,
            "watchdog_s": self.watchdog_s,
            "watchdog_misses": self.watchdog_misses,
            "resumed_after_max_s": max(self.resumed_after_s, default=None),
            "resumed_after_s": self.resumed_after_s,
            "submitted_after_max_s": max(self.submitted_after_s, default=None),
            "submitted_after_s": self.submitted_after_s,
            "spawn_failed_logged": self.spawn_failed_logged,
            "periodic_reconciles": self.periodic_reconciles,
        }


class Pings:
    """The daemon's sd_notify datagrams, timestamped (monotonic) as they arrive."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.at: list[float] = []
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


def run(
    c: Cluster,
    shared: Path,
    pause: float,
    answers: int = 3,
    watchdog_s: float = 4.0,
    deadline: float = 120.0,
) -> Figures:
    """The scenario in `shared` (a directory every user can traverse); the interpreter must be
    executable by nobody (tests: `executable_by_all`)."""
    root = shared / "root"
    root.mkdir()
    wss = [root / f"ws{i}" for i in range(answers + 1)]
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
        rescan_interval_seconds=1e9,  # only the resumer's retry can resume what the outage hit
    )
    pings = Pings(shared / "notify.sock")
    usec = str(int(watchdog_s * 1e6))
    env = {"NOTIFY_SOCKET": str(shared / "notify.sock"), "WATCHDOG_USEC": usec}

    def ingested(ws: Path) -> list[dict[str, Any]]:
        return [r for r in records(record) if r.get("workspace") == str(ws)]

    try:
        d.start(env=env)
        answer(wss[0], "before")
        wait_for(lambda: ingested(wss[0]) or None, "the first resume (the cluster works)", deadline)
        during = wss[1:]
        with c.paused():
            began = time.monotonic()
            for ws in during:
                answer(ws, "during")

            def all_queued() -> bool:
                return all(d.events("resume_queued", workspace=str(ws)) for ws in during)

            wait_for(all_queued, "the answers queued while slurmctld is stopped", deadline)
            queued = sum(1 for ws in during if d.events("resume_queued", workspace=str(ws)))
            time.sleep(max(0.0, pause - (time.monotonic() - began)))  # the outage's length
            ended = time.monotonic()
        back = time.time()
        gaps = pings.between(began, ended)
        wait_for(
            lambda: all(ingested(ws) for ws in during) or None,
            "every answer of the outage resumed",
            deadline,
        )
        after = [max(0.0, ingested(ws)[0]["t"] - back) for ws in during]
        submitted = [
            datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp() - back
            for e in d.events("slurm_submitted")
        ]
        submitted = [max(0.0, t) for t in submitted if t > -pause]  # the outage's, not the first
        failed = sum(len(d.events("resume_spawn_failed", workspace=str(ws))) for ws in during)
        periodic = len(d.events("reconcile_full", reason="periodic"))
    finally:
        d.stop()
        pings.close()
        out = c.run("squeue", "-h", "--states=all", "-O", "JobID:|,Comment:0")
        for line in out.stdout.splitlines():
            job, _, comment = line.partition("|")
            if f":{daemon_id}:" in comment:
                c.run("scancel", "--signal=KILL", "--full", job.strip(), check=False)
    return Figures(
        pause_s=ended - began,
        answered_during=len(during),
        queued_during=queued,
        ping_gaps_s=gaps,
        watchdog_s=watchdog_s,
        resumed_after_s=after,
        submitted_after_s=sorted(submitted),
        spawn_failed_logged=failed,
        periodic_reconciles=periodic,
    )
