"""A real `deltad serve` with `executor: slurm` against a real one-node Slurm cluster.

The daemon runs inside the cluster's network namespace (`nsenter --net=`), as root; the
workspaces belong to a real unprivileged user, and each resume is one Slurm job run as that
user. The stub client (`deltad.testing.stub`, mode `hold`) ingests the answer once released,
so jobs are provably running when the daemon is killed with SIGKILL; the restarted daemon
adopts them from Slurm and resumes the answers written while it was down. Every check is a
condition with a generous deadline (a loaded 2-core machine), never a fixed sleep.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pwd
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from deltad.executors.slurm import key_from_comment
from deltad.testing.stub import ELSEWHERE_HOST, paused_workspace
from tests.slurm import slurm_cluster  # noqa: F401
from tests.support.daemon import Daemon, answer, metadata_status, records, stub_command, wait_for
from tests.support.slurmcluster import Cluster
from tests.users import User, accounts, chown_tree, executable_by_all, shared_tmp

DEADLINE = 60.0


def owner_home(user: User) -> str:
    return pwd.getpwuid(user.uid).pw_dir


@pytest.fixture
def owner() -> Iterator[User]:
    with accounts() as a:
        yield a.user()


@pytest.fixture
def shared() -> Iterator[Path]:
    with shared_tmp() as d:
        yield d


def jobs_of(c: Cluster, daemon_id: str, ran: bool = True) -> list[tuple[str, str, str, Path]]:
    """(job id, state, user name, workspace) of every job this daemon submitted; with `ran`,
    not those cancelled while still parked (`sbatch --hold`: they never ran)."""
    fields = "JobID:|,State:|,UserName:|,NodeList:|,Comment:0"
    out = c.run("squeue", "-h", "--states=all", "-O", fields)
    rows = []
    for line in out.stdout.splitlines():
        job, state, user, nodes, comment = (p.strip() for p in line.split("|", 4))
        key = key_from_comment(comment, daemon_id)
        if key is not None and not (ran and state == "CANCELLED" and not nodes):
            rows.append((job, state, user, key.workspace))
    return rows


def never_ran(c: Cluster, daemon_id: str) -> set[str]:
    """This daemon's jobs cancelled while parked."""
    ran = {j for j, _, _, _ in jobs_of(c, daemon_id)}
    return {j for j, _, _, _ in jobs_of(c, daemon_id, ran=False)} - ran


def held_job_process(ws: Path) -> tuple[int, dict[str, str]] | None:
    """(uid, environment) of the stand-in client holding in `ws`, once its job runs it."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"deltad.testing.stub" not in argv or os.fsencode(ws) not in argv:
                continue
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        env = dict(v.partition(b"=")[::2] for v in raw.split(b"\0") if v)
        return uid, {k.decode(): v.decode(errors="replace") for k, v in env.items()}
    return None


def test_daemon_resumes_through_slurm_and_adopts_its_jobs_after_kill_9(
    slurm_cluster: Cluster,  # noqa: F811
    owner: User,
    shared: Path,
) -> None:
    c = slurm_cluster
    daemon_id = f"d{os.getpid()}"
    root = shared / "root"
    root.mkdir()
    wss = [root / f"ws{i}" for i in range(4)]
    run_ids = [paused_workspace(ws) for ws in wss]
    for ws in wss:
        chown_tree(ws, owner)
    rec_dir = shared / "records"
    rec_dir.mkdir()
    os.chown(rec_dir, owner.uid, owner.gid)
    record = rec_dir / "resumes.jsonl"
    state = shared / "daemon"
    state.mkdir(mode=0o700)
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
        resume_command=stub_command(record, "hold"),
        max_parallel_resumes=8,
    )
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "sk-test"}
    try:
        with executable_by_all():
            d.start(env=env)
            for ws in wss[:2]:
                answer(ws, f"answer {ws.name}")

            def running_two() -> bool:  # the node runs one at a time: the other is queued
                states = [s for _, s, _, _ in jobs_of(c, daemon_id)]
                return len(states) == 2 and "RUNNING" in states

            try:
                wait_for(running_two, "two jobs in Slurm, one running", DEADLINE)
            except AssertionError as e:
                log = d.log_path.read_text(errors="replace")[-4000:]
                raise AssertionError(f"{e}\n{jobs_of(c, daemon_id)}\n{log}") from None
            held = next(ws for _, st, _, ws in jobs_of(c, daemon_id) if st == "RUNNING")
            found = wait_for(lambda: held_job_process(held), "the running job's process", DEADLINE)
            uid, job_env = found
            assert uid == owner.uid
            assert job_env["DELTA_RESUMED_BY"] == "deltad"  # what `delta run` needs from deltad
            assert {k: job_env.get(k) for k in env} == env  # the model endpoint, as for local
            assert job_env["USER"] == owner.name and job_env["HOME"] == owner_home(owner)
            d.signal(signal.SIGKILL)
            assert d.proc is not None
            d.proc.wait(DEADLINE)
            d._log.close()
            for ws in wss[2:]:
                answer(ws, f"answer {ws.name}")

            d.start(env=env)
            d.wait_event("resume_adopted", count=2, timeout=DEADLINE)
            (rec_dir / "resumes.jsonl.go").touch()  # release every held stub
            os.chown(rec_dir / "resumes.jsonl.go", owner.uid, owner.gid)

            def all_done() -> bool:
                return all(metadata_status(ws) == "COMPLETED" for ws in wss)

            wait_for(all_done, "every run COMPLETED", DEADLINE)
            done = lambda: all(s == "COMPLETED" for _, s, _, _ in jobs_of(c, daemon_id))  # noqa: E731
            try:
                wait_for(done, "every job COMPLETED in Slurm", DEADLINE)
            except AssertionError as e:
                said = [
                    (e["event"], e.get("workspace"), e.get("job"))
                    for e in d.lines()
                    if e.get("event", "").startswith(("resume_", "slurm_", "executor_"))
                ]
                raise AssertionError(f"{e}: {jobs_of(c, daemon_id)} {said}") from None
    finally:
        d.stop()
        out = c.run("squeue", "-h", "--states=all", "-O", "JobID:|,Comment:0")
        for line in out.stdout.splitlines():
            job, _, comment = line.partition("|")
            if f":{daemon_id}:" in comment:
                c.run("scancel", "--signal=KILL", "--full", job.strip(), check=False)

    jobs = jobs_of(c, daemon_id)
    per_ws = collections.Counter(ws for _, _, _, ws in jobs)
    assert per_ws == {ws: 1 for ws in wss}, jobs  # one job per answer: none missed, none doubled
    assert never_ran(c, daemon_id) == {e["job"] for e in d.events("executor_orphan_cancelled")}
    assert {user for _, _, user, _ in jobs} == {owner.name}
    ingested = {r["workspace"]: (r["run_id"], r["answer"]) for r in records(record)}
    assert ingested == {
        str(ws): (rid, f"answer {ws.name}") for ws, rid in zip(wss, run_ids, strict=True)
    }
    assert len(records(record)) == 4
    assert os.stat(record).st_uid == owner.uid  # written by the jobs, as the owner


def held_pid(ws: Path) -> int:
    """The pid of the stand-in client running in `ws` (on this machine: the cluster's node)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"deltad.testing.stub" in argv and os.fsencode(ws) in argv:
            return int(pid)
    raise AssertionError(f"no client runs in {ws}")


def job_of(c: Cluster, daemon_id: str, ws: Path, state: str) -> str | None:
    """The id of this daemon's job for `ws` in `state` (None while there is none)."""
    found = [j for j, s, _, w in jobs_of(c, daemon_id) if w == ws and s == state]
    return found[-1] if found else None


def claims_elsewhere(ws: Path) -> bool:
    """The run says RUNNING, owned by a process on another host (the stub's claim)."""
    from deltad.protocol import Workspace, load_metadata

    w = Workspace.at(ws)
    run_id = w.latest_run_id()
    assert run_id
    meta = load_metadata(w.run(run_id).metadata)
    return (
        meta.status == "RUNNING"
        and meta.owner is not None
        and (meta.owner.hostname == ELSEWHERE_HOST)
    )


def test_a_run_on_another_host_whose_job_is_killed_is_interrupted_and_resumed(
    slurm_cluster: Cluster,  # noqa: F811
    owner: User,
    shared: Path,
) -> None:
    """A RUNNING run owned by another host is judged from its Slurm job, not from this host's
    /proc: the job cancelled hard (scancel --signal=KILL), or its client killed with SIGKILL
    inside it, or cancelled hard while no daemon ran (the restarted daemon adopts the ended job
    and reads its exit), while the run says RUNNING on another host → the daemon marks it
    INTERRUPTED (one logged transition naming the job) and resumes it
    (`auto_resume_interrupted`); the run asks again, and a later answer resumes it to the end."""
    c = slurm_cluster
    daemon_id = f"e{os.getpid()}"
    root = shared / "root"
    root.mkdir()
    cancelled, killed, offline = root / "cancelled", root / "killed", root / "offline"
    run_ids = {ws: paused_workspace(ws) for ws in (cancelled, killed, offline)}
    for ws in run_ids:
        chown_tree(ws, owner)
    rec_dir = shared / "records"
    rec_dir.mkdir()
    os.chown(rec_dir, owner.uid, owner.gid)
    record = rec_dir / "resumes.jsonl"
    state = shared / "daemon"
    state.mkdir(mode=0o700)
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
        resume_command=stub_command(record, "elsewhere"),
        auto_resume_interrupted=True,
    )
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "sk-test"}

    def end_hard(ws: Path) -> None:
        if ws in (cancelled, offline):
            job = job_of(c, daemon_id, ws, "RUNNING")
            assert job is not None
            if ws == offline:  # the daemon dies first; the job ends while none runs
                d.signal(signal.SIGKILL)
                assert d.proc is not None
                d.proc.wait(DEADLINE)
                d._log.close()
            c.run("scancel", "--signal=KILL", "--full", job)
            if ws == offline:
                ended = partial(lambda j: job_of(c, daemon_id, offline, "CANCELLED") == j, job)
                wait_for(ended, "the job ended in Slurm", DEADLINE)
                d.start(env=env)
                d.wait_event("resume_adopted", workspace=str(ws), timeout=DEADLINE)
        else:
            found = wait_for(lambda: held_job_process(ws), "the job's client", DEADLINE)
            assert found[0] == owner.uid
            os.kill(held_pid(ws), signal.SIGKILL)  # the client inside the job, not the job

    try:
        with executable_by_all():
            d.start(env=env)
            for ws in (cancelled, killed, offline):
                answer(ws, f"answer {ws.name}")
                wait_for(partial(claims_elsewhere, ws), f"{ws.name}: RUNNING elsewhere", DEADLINE)
                end_hard(ws)
                # INTERRUPTED, resumable: resumed, the run asks again; the later answer resumes it.
                asks = partial(lambda w: metadata_status(w) == "WAITING_FOR_INPUT", ws)
                wait_for(asks, f"{ws.name}: INTERRUPTED, resumed, asking again", DEADLINE)
                answer(ws, f"later answer {ws.name}")
                done = partial(lambda w: metadata_status(w) == "COMPLETED", ws)
                wait_for(done, f"{ws.name}: the later answer resumed", DEADLINE)
    finally:
        d.stop()
        out = c.run("squeue", "-h", "--states=all", "-O", "JobID:|,Comment:0")
        for line in out.stdout.splitlines():
            job, _, comment = line.partition("|")
            if f":{daemon_id}:" in comment:
                c.run("scancel", "--signal=KILL", "--full", job.strip(), check=False)

    marks = [
        e for e in d.events("status_transition", to="INTERRUPTED") if e.get("from") == "RUNNING"
    ]
    assert {e["run_id"] for e in marks} == set(run_ids.values()) and len(marks) == 3
    for e in marks:
        assert e["reason"].startswith("process ")
        assert f" on {ELSEWHERE_HOST} stopped without finishing: job deltad-" in e["reason"]
    every = (cancelled, killed, offline)
    resumed = {r["workspace"]: r.get("resumed") for r in records(record) if "resumed" in r}
    assert resumed.keys() == {str(ws) for ws in every}
    assert all(ELSEWHERE_HOST in str(why) for why in resumed.values())
    per_ws = collections.Counter(ws for _, _, _, ws in jobs_of(c, daemon_id))
    # the job killed under the run, the resume of the INTERRUPTED run, the later answer's
    assert per_ws == {ws: 3 for ws in every}
    answers = [r["answer"] for r in records(record) if "answer" in r]
    assert sorted(answers) == sorted(
        f"{a} {ws.name}" for a in ("answer", "later answer") for ws in every
    )


def test_a_frozen_active_with_jobs_in_flight_is_fenced(
    slurm_cluster: Cluster,  # noqa: F811
    owner: User,
    shared: Path,
) -> None:
    """Two daemons on one lease, `executor: slurm`, one daemon id: the active is SIGSTOPped with
    one job running and one just submitted (or about to be). The standby takes the lease over
    by expiry, adopts both jobs from Slurm and resumes what is answered meanwhile; SIGCONT: the
    old active submits nothing and stops. One job per answer."""
    c = slurm_cluster
    daemon_id = f"ha{os.getpid()}"
    root = shared / "root"
    root.mkdir()
    wss = [root / f"ws{i}" for i in range(4)]
    for ws in wss:
        paused_workspace(ws)
        chown_tree(ws, owner)
    rec_dir = shared / "records"
    rec_dir.mkdir()
    os.chown(rec_dir, owner.uid, owner.gid)
    record = rec_dir / "resumes.jsonl"
    lease_dir = shared / "ha"
    lease_dir.mkdir(mode=0o755)
    common = {
        "wrapper": ["nsenter", f"--net={c.netns()}", "--"],
        "executor": "slurm",
        "executors": {
            "slurm": {
                "log_dir": str(shared / "logs"),
                "slurm_conf": str(c.conf),
                "daemon_id": daemon_id,
                "poll_every": 0.3,
            }
        },
        "resume_command": stub_command(record, "hold"),
        "max_parallel_resumes": 8,
        "ha": {"lease": str(lease_dir / "deltad.lease"), "poll_seconds": 0.1, "lease_seconds": 3},
    }
    daemons = []
    for name in ("a", "b"):
        (shared / name).mkdir(mode=0o700)
        daemons.append(Daemon(shared / name, [root], **common))
    a, b = daemons
    env = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "sk-test"}
    try:
        with executable_by_all():
            a.start(env=env)
            b.start(env=env, wait=False)
            b.wait_event("standby", timeout=DEADLINE)
            answer(wss[0], "answer ws0")
            wait_for(lambda: job_of(c, daemon_id, wss[0], "RUNNING"), "ws0's job runs", DEADLINE)
            answer(wss[1], "answer ws1")
            a.wait_event("resume_queued", workspace=str(wss[1]), timeout=DEADLINE)
            a.signal(signal.SIGSTOP)  # ws1's submit in flight (or just done) at the freeze
            try:
                for ws in wss[2:]:
                    answer(ws, f"answer {ws.name}")
                [taken] = b.wait_event("lease_taken", timeout=DEADLINE)
                assert taken["how"] == "expired", taken
                b.wait_event("daemon_ready", timeout=DEADLINE)
                (rec_dir / "resumes.jsonl.go").touch()  # release every held stub
                os.chown(rec_dir / "resumes.jsonl.go", owner.uid, owner.gid)

                def all_done() -> bool:
                    return all(metadata_status(ws) == "COMPLETED" for ws in wss)

                wait_for(all_done, "every run COMPLETED while the old active is stopped", 90)
            finally:
                a.signal(signal.SIGCONT)
            assert a.proc is not None and a.proc.wait(DEADLINE) == 1
            assert a.events("lease_lost")
            ended = ("COMPLETED", "FAILED")  # FAILED: a resume that found its run taken (75)
            done = lambda: all(s in ended for _, s, _, _ in jobs_of(c, daemon_id))  # noqa: E731
            try:
                wait_for(done, "every job ended in Slurm", DEADLINE)
            except AssertionError as e:
                raise AssertionError(f"{e}: {jobs_of(c, daemon_id)}") from None
    finally:
        for d in (b, a):
            if d.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    d.proc.send_signal(signal.SIGCONT)
                with contextlib.suppress(Exception):
                    d.stop()
        out = c.run("squeue", "-h", "--states=all", "-O", "JobID:|,Comment:0")
        for line in out.stdout.splitlines():
            job, _, comment = line.partition("|")
            if f":{daemon_id}:" in comment:
                c.run("scancel", "--signal=KILL", "--full", job.strip(), check=False)

    jobs = jobs_of(c, daemon_id)
    per_ws = collections.Counter(ws for _, _, _, ws in jobs)
    # A job the frozen active's in-flight sbatch parked after the standby had looked: the new
    # active cancels it, and says so; it never ran.
    orphans = {e["job"] for e in b.events("executor_orphan_cancelled")}
    assert never_ran(c, daemon_id) == orphans
    said = {
        d.log_path.parent.name: [
            (e["event"], e.get("workspace"), e.get("job"))
            for e in d.lines()
            if e.get("event", "").startswith(("resume_", "lease", "slurm_"))
        ]
        for d in (a, b)
    }
    assert per_ws == {ws: 1 for ws in wss}, (jobs, said)  # none missed, none doubled by the wake
    assert len(records(record)) == 4
    assert {e["workspace"] for e in a.events("resume_spawned")} <= {str(wss[0]), str(wss[1])}
