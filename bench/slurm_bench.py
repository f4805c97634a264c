"""The Slurm executor on a real one-node cluster: answer → job running, and exactly one job per key.

    .venv/bin/python bench/slurm_bench.py [--latency 20] [--burst 200] [--out bench/results]

Needs root and Slurm's packages (`apt-get install slurm-wlm munge slurmctld slurmd`); the
cluster is `tests.support.slurmcluster` (a private network namespace, loopback only).

- latency: one submit at a time (the daemon's path for one answer): from `submit()` to the
  job's first command (its own clock) and to the `Started` event seen by `poll` (poll_every).
- once: 200 keys submitted by a process that is SIGKILLed half-way (a daemon crashing while
  submitting), then all 200 again by a fresh executor (the restarted daemon): jobs per key.
- daemon (`--daemon 200`): a real `deltad serve` with `executor: slurm` in the cluster's
  namespace, 200 paused workspaces owned by nobody, all answered at once, the daemon killed
  with SIGKILL once half of the runs were ingested and started again: jobs per workspace
  (missed, doubled) and answer → the job's command running (the stub's ingest record).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from deltad.executors.seam import Identity, JobSpec, RequestKey, Started
from deltad.executors.slurm import SlurmExecutor, make_slurm_executor
from tests.support.slurmcluster import Cluster, cluster

NOBODY = Identity(65534, 65534, user="nobody")


def executor(conf: Path, root: Path, daemon_id: str) -> SlurmExecutor:
    state = root / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    options = {"log_dir": str(root / "logs"), "slurm_conf": str(conf), "daemon_id": daemon_id}
    return make_slurm_executor.build(options, state)


def workspace(root: Path, name: str) -> Path:
    ws = root / name
    ws.mkdir(exist_ok=True)
    os.chown(ws, NOBODY.uid, NOBODY.gid)
    return ws


def spec(root: Path, name: str, argv: list[str]) -> JobSpec:
    ws = workspace(root, name)
    env = {"PATH": "/usr/bin:/bin"}
    return JobSpec(RequestKey(ws, "run", "q"), argv, NOBODY, env=env, timeout=600)


def latency(c: Cluster, root: Path, n: int) -> dict[str, object]:
    ex = executor(c.conf, root, "bench-latency")
    to_first, to_started, sbatch = [], [], []
    for i in range(n):
        s = spec(root, f"lat{i}", ["/bin/date", "+%s.%N"])
        t0 = time.time()
        handle = ex.submit(s)
        sbatch.append(time.time() - t0)
        seen = None
        end = time.monotonic() + 120
        while seen is None and time.monotonic() < end:
            select.select(ex.fds(), [], [], 0.2)  # the worker's news
            for event in ex.poll(time.monotonic()):
                if isinstance(event, Started) and event.handle == handle:
                    seen = time.time()
        assert seen is not None, f"job {handle.ref} never started"
        log = root / "logs" / str(NOBODY.uid) / f"{s.key.name}.log"
        while not log.exists() or not log.read_text().strip():
            time.sleep(0.02)
        to_first.append(float(log.read_text().split()[0]) - t0)
        to_started.append(seen - t0)
    return {
        "jobs": n,
        "submit_to_first_command_p50_s": round(statistics.median(to_first), 3),
        "submit_to_first_command_max_s": round(max(to_first), 3),
        "submit_to_started_event_p50_s": round(statistics.median(to_started), 3),
        "submit_to_started_event_max_s": round(max(to_started), 3),
        "sbatch_call_p50_s": round(statistics.median(sbatch), 3),
    }


def submit_all(conf: str, root: str, n: int) -> None:
    """The crashing daemon: submits keys 0..n-1, says each on stdout."""
    ex = executor(Path(conf), Path(root), "bench-once")
    for i in range(n):
        handle = ex.submit(spec(Path(root), f"once{i}", ["/bin/true"]))
        while ex.tracked()[handle.key.name].ref is None:  # the worker's sbatch done
            time.sleep(0.01)
        print("submitted", i, flush=True)


def once(c: Cluster, root: Path, n: int) -> dict[str, object]:
    child = subprocess.Popen(
        [sys.executable, __file__, "_submit", str(c.conf), str(root), str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("submitted ") and int(line.split()[1]) >= n // 2:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    before = _jobs_per_name(c)
    ex = executor(c.conf, root, "bench-once")
    t0 = time.monotonic()
    handles = [ex.submit(spec(root, f"once{i}", ["/bin/true"])) for i in range(n)]
    for handle in handles:  # found in the worker's list, or submitted
        while (job := ex.tracked().get(handle.key.name)) is not None and job.ref is None:
            time.sleep(0.01)
    resubmit = time.monotonic() - t0
    per_name = _jobs_per_name(c)
    return {
        "keys": n,
        "jobs_before_restart": sum(before.values()),
        "jobs": sum(per_name.values()),
        "keys_with_one_job": sum(1 for v in per_name.values() if v == 1),
        "doubled": sum(1 for v in per_name.values() if v > 1),
        "restart_resubmit_all_s": round(resubmit, 2),
    }


def _jobs_per_name(c: Cluster) -> dict[str, int]:
    """Jobs per key (all of a daemon's jobs share one name: the key is in the comment)."""
    from deltad.executors.slurm import key_from_comment

    out = c.run("squeue", "-h", "--states=all", "-O", "Comment:0")
    counts: dict[str, int] = {}
    for line in out.stdout.splitlines():
        key = key_from_comment(line.strip(), "bench-once")
        if key is not None:
            counts[key.name] = counts.get(key.name, 0) + 1
    return counts


def through_daemon(c: Cluster, root: Path, n: int) -> dict[str, object]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from deltad.executors.slurm import key_from_comment
    from deltad.testing.stub import paused_workspace
    from tests.support.daemon import Daemon, answer, metadata_status, records, stub_command
    from tests.users import executable_by_all

    home = root / "daemon"
    home.mkdir()
    wss = [home / "root" / f"ws{i}" for i in range(n)]
    for ws in wss:
        paused_workspace(ws)
        for p in [ws, *ws.rglob("*")]:
            os.lchown(p, NOBODY.uid, NOBODY.gid)
    rec = home / "records"
    rec.mkdir()
    os.chown(rec, NOBODY.uid, NOBODY.gid)
    record = rec / "resumes.jsonl"
    state = home / "state"
    state.mkdir(mode=0o700)
    options = {"log_dir": str(home / "logs"), "slurm_conf": str(c.conf), "daemon_id": "bench-d"}
    d = Daemon(
        state,
        [home / "root"],
        wrapper=["nsenter", f"--net={c.netns()}", "--"],
        executor="slurm",
        executors={"slurm": {**options, "poll_every": 0.3}},
        resume_command=stub_command(record),
        max_parallel_resumes=64,
        max_parallel_resumes_per_owner=64,  # one owner: every slot, as measured before
        log_level="info",
    )

    def wait(cond: object, what: str, timeout: float = 900) -> None:
        assert callable(cond)
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise SystemExit(f"timed out waiting for {what}")
            time.sleep(0.2)

    with executable_by_all():
        d.start()
        answered = {}
        for ws in wss:
            answer(ws, "ok")
            answered[str(ws)] = time.time()
        wait(lambda: len(records(record)) >= n // 2, "half of the runs ingested")
        d.signal(signal.SIGKILL)
        assert d.proc is not None
        d.proc.wait()
        killed_at = len(records(record))
        t_restart = time.monotonic()
        d.start()
        wait(lambda: all(metadata_status(ws) == "COMPLETED" for ws in wss), "every run COMPLETED")
        after_restart = time.monotonic() - t_restart
        adopted = len(d.events("resume_adopted"))
        d.stop()
    out = c.run("squeue", "-h", "--states=all", "-O", "Comment:0")
    per_ws: dict[str, int] = {}
    for line in out.stdout.splitlines():
        key = key_from_comment(line.strip(), "bench-d")
        if key is not None:
            per_ws[str(key.workspace)] = per_ws.get(str(key.workspace), 0) + 1
    ingested = records(record)
    lat = sorted(r["t"] - answered[r["workspace"]] for r in ingested)
    return {
        "answers": n,
        "jobs": sum(per_ws.values()),
        "missed": sum(1 for ws in wss if per_ws.get(str(ws), 0) == 0),
        "doubled": sum(1 for v in per_ws.values() if v > 1),
        "ingested": len(ingested),
        "ingested_twice": len(ingested) - len({r["workspace"] for r in ingested}),
        "ingested_when_killed": killed_at,
        "adopted_after_restart": adopted,
        "restart_to_all_completed_s": round(after_restart, 1),
        "answer_to_job_running_p50_s": round(statistics.median(lat), 2),
        "answer_to_job_running_p90_s": round(lat[int(len(lat) * 0.9)], 2),
        "answer_to_job_running_max_s": round(lat[-1], 2),
        "node_cpus": 2,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_submit":
        submit_all(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--latency", type=int, default=20)
    p.add_argument("--burst", type=int, default=200)
    p.add_argument("--daemon", type=int, default=200, help="answers through a real daemon")
    p.add_argument("--only-daemon", action="store_true")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    a = p.parse_args()
    with cluster() as c, c.entered():
        root = c.dir / "bench"
        root.mkdir()
        os.chmod(root, 0o755)
        result: dict[str, object] = {
            "when": datetime.now(UTC).strftime("%Y%m%dT%H%M%S"),
            "load_avg": os.getloadavg(),
        }
        if not a.only_daemon:
            result["latency"] = latency(c, root, a.latency)
            result["once"] = once(c, root, a.burst)
        if a.daemon:
            result["daemon"] = through_daemon(c, root, a.daemon)
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"slurm-{result['when']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written {path}")


if __name__ == "__main__":
    main()
