"""`executor: slurm` against a real one-node Slurm cluster, through the executor seam.

Jobs run as real throw-away users in their own workspaces; everything the executor says comes
from slurmctld through squeue. Waits are conditions with generous deadlines, never sleeps.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deltad.executors.seam import (
    AdoptPending,
    Event,
    Exit,
    Handle,
    Identity,
    JobSpec,
    Refused,
    RequestKey,
    Started,
    SubmitError,
)
from deltad.executors.slurm import SlurmExecutor, key_from_comment, make_slurm_executor
from deltad.testing.stub import paused_workspace
from tests.slurm import in_cluster, slurm_cluster  # noqa: F401
from tests.support.daemon import answer, metadata_status
from tests.support.slurmcluster import Cluster
from tests.users import User, accounts, chown_tree, executable_by_all, shared_tmp

DEADLINE = 120.0
_ids = itertools.count()


@pytest.fixture(scope="module")
def owner() -> Iterator[User]:
    with accounts() as a:
        yield a.user()


@pytest.fixture
def tmp_shared() -> Iterator[Path]:
    with shared_tmp() as d:
        yield d


_made: list[SlurmExecutor] = []


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Every executor a test made is closed after it (its worker stops)."""
    yield
    while _made:
        _made.pop().close()


def executor(c: Cluster, root: Path, daemon_id: str, **extra: object) -> SlurmExecutor:
    """A Slurm executor as the daemon makes one: its state dir (its signing key) under `root`,
    shared by the "restarted daemons" of one test."""
    opts = {"log_dir": str(root / "logs"), "slurm_conf": str(c.conf), "daemon_id": daemon_id}
    state = root / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    ex = make_slurm_executor.build({**opts, **extra}, state)
    _made.append(ex)
    return ex


def adopt(ex: SlurmExecutor, deadline: float = DEADLINE) -> list[Handle]:
    """adopt(), asked again while the worker's first query is on its way (as the daemon does)."""
    end = time.monotonic() + deadline
    while True:
        try:
            return ex.adopt()
        except AdoptPending:
            assert time.monotonic() < end, "no first answer from the worker"
            select.select(ex.fds(), [], [], 0.5)


def job_id(ex: SlurmExecutor, handle: Handle, deadline: float = DEADLINE) -> str:
    """Slurm's id for the job once the worker has submitted it."""
    end = time.monotonic() + deadline
    while (ref := ex.tracked()[handle.key.name].ref) is None:
        assert time.monotonic() < end, "the job was never submitted"
        time.sleep(0.05)
    return ref


def jobs_for(c: Cluster, daemon_id: str, key: RequestKey) -> list[str]:
    """Ids of the jobs in Slurm whose comment names `key` for `daemon_id`."""
    out = c.run("squeue", "-h", "--states=all", "-O", "JobID:|,Comment:0")
    ids = []
    for line in out.stdout.splitlines():
        job, _, comment = (p.strip() for p in line.partition("|"))
        if key_from_comment(comment, daemon_id) == key:
            ids.append(job)
    return ids


@pytest.fixture
def daemon_id(in_cluster: Cluster) -> Iterator[str]:  # noqa: F811
    """A daemon id of its own per test; its jobs are cancelled after the test."""
    ident = f"t{os.getpid()}-{next(_ids)}"
    yield ident
    out = in_cluster.run("squeue", "-h", "--states=all", "-O", "JobID:|,Comment:0")
    for line in out.stdout.splitlines():
        job, _, comment = line.partition("|")
        if f":{ident}:" in comment:
            in_cluster.run("scancel", "--signal=KILL", "--full", job.strip(), check=False)


def workspace(root: Path, user: User, name: bytes = b"ws") -> Path:
    ws = Path(os.fsdecode(os.path.join(os.fsencode(root), name)))
    ws.mkdir()
    os.chown(ws, user.uid, user.gid)
    return ws


def spec_for(ws: Path, user: User, *argv: str, request: str = "q1", **kw: object) -> JobSpec:
    env = {"PATH": "/usr/bin:/bin", **kw.pop("env", {})}  # type: ignore[dict-item]
    return JobSpec(
        key=RequestKey(ws, "run-1", request),
        argv=argv,
        identity=Identity(user.uid, user.gid, user=user.name),
        env=env,
        timeout=600,
        **kw,  # type: ignore[arg-type]
    )


def wait_for(
    ex: SlurmExecutor,
    done: Callable[[list[Event]], bool],
    what: str,
    during: Callable[[], None],
    deadline: float = DEADLINE,
) -> list[Event]:
    """Poll the executor until `done(events so far)`; `during` runs between polls."""
    events: list[Event] = []
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        events += ex.poll(time.monotonic())
        if done(events):
            return events
        during()
        select.select(ex.fds(), [], [], 0.2)  # the worker's news, as the daemon's loop waits
    raise AssertionError(f"timed out waiting for {what}; events: {events}")


def nothing() -> None:
    pass


def exited(h: Handle) -> Callable[[list[Event]], bool]:
    return lambda evs: any(isinstance(e, Exit) and e.handle == h for e in evs)


def refused(h: Handle) -> Callable[[list[Event]], bool]:
    return lambda evs: any(isinstance(e, Refused) and e.handle == h for e in evs)


def started(h: Handle) -> Callable[[list[Event]], bool]:
    return lambda evs: any(isinstance(e, Started) and e.handle == h for e in evs)


def the_exit(evs: list[Event]) -> Exit:
    return next(e for e in evs if isinstance(e, Exit))


def test_job_runs_as_owner_in_workspace_and_its_exit_code_comes_back(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    ws = workspace(tmp_shared, owner, b"ws \xff odd")
    ex = executor(in_cluster, tmp_shared, daemon_id)
    spec = spec_for(ws, owner, "/bin/sh", "-c", "id -u; id -g; pwd; exit 3")
    handle = ex.submit(spec)

    events = wait_for(ex, exited(handle), "the job's exit", nothing)

    assert [type(e) for e in events] == [Started, Exit]
    assert the_exit(events).rc == 3
    assert the_exit(events).meaning == "unexpected"
    log = tmp_shared / "logs" / str(owner.uid) / f"{spec.key.name}.log"
    assert log.read_bytes().splitlines() == [
        str(owner.uid).encode(),
        str(owner.gid).encode(),
        os.fsencode(ws),
    ]
    st, dir_st = log.stat(), log.parent.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (owner.uid, 0o600)
    assert (dir_st.st_uid, stat.S_IMODE(dir_st.st_mode)) == (owner.uid, 0o700)


def test_a_paused_run_is_resumed_by_a_job_as_its_owner(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    ws = tmp_shared / "ws"
    run_id = paused_workspace(ws)
    answer(ws, "ship it")
    chown_tree(ws, owner)
    records = tmp_shared / "records"
    records.mkdir()
    os.chown(records, owner.uid, owner.gid)
    record = records / "ingested.jsonl"
    argv = [sys.executable, "-m", "deltad.testing.stub", "stub", str(ws), "--record", str(record)]
    ex = executor(in_cluster, tmp_shared, daemon_id)
    with executable_by_all():
        handle = ex.submit(spec_for(ws, owner, *argv))
        events = wait_for(ex, exited(handle), "the resume's exit", nothing)

    assert the_exit(events).rc == 0 and the_exit(events).meaning == "completed"
    [ingested] = [json.loads(line) for line in record.read_text().splitlines()]
    assert (ingested["run_id"], ingested["answer"]) == (run_id, "ship it")
    assert metadata_status(ws) == "COMPLETED"


def test_submitting_one_key_twice_makes_one_job(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    ws = workspace(tmp_shared, owner)
    spec = spec_for(ws, owner, "/bin/sleep", "1000")
    one = executor(in_cluster, tmp_shared, daemon_id)
    first = one.submit(spec)
    assert one.submit(spec) == first
    submitted = job_id(one, first)
    one.close()
    restarted = executor(in_cluster, tmp_shared, daemon_id)
    again = restarted.submit(spec)  # a daemon that crashed before recording it

    assert again == first
    assert job_id(restarted, again) == submitted  # found, not submitted again
    assert jobs_for(in_cluster, daemon_id, spec.key) == [submitted]


def test_cancel_sends_term_and_the_exit_says_killed(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    ws = workspace(tmp_shared, owner)
    ex = executor(in_cluster, tmp_shared, daemon_id)
    handle = ex.submit(spec_for(ws, owner, "/bin/sleep", "1000"))
    events = wait_for(ex, started(handle), "the job to run", nothing)

    ex.cancel(handle, False)
    events = wait_for(ex, exited(handle), "the cancelled job's exit", nothing)

    assert the_exit(events).rc == -15
    assert the_exit(events).meaning == "killed_by_SIGTERM"


def test_a_job_ignoring_term_is_killed_by_a_forced_cancel(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    ws = workspace(tmp_shared, owner)
    ex = executor(in_cluster, tmp_shared, daemon_id)
    script = "trap '' TERM; echo ready; while :; do sleep 1; done"
    spec = spec_for(ws, owner, "/bin/sh", "-c", script)
    handle = ex.submit(spec)
    log = tmp_shared / "logs" / str(owner.uid) / f"{spec.key.name}.log"

    def trapping(events: list[Event]) -> bool:
        return started(handle)(events) and log.exists() and b"ready" in log.read_bytes()

    wait_for(ex, trapping, "the job to run with its trap set", nothing)

    ex.cancel(handle, False)
    ex.cancel(handle, True)  # the daemon's KILL after its grace
    events = wait_for(ex, exited(handle), "the killed job's exit", nothing)

    assert the_exit(events).rc == -9  # the TERM was ignored; the KILL ended it


def test_a_restarted_daemon_adopts_its_running_jobs_from_slurm(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    ws = workspace(tmp_shared, owner, b"any \xfe bytes")
    first = executor(in_cluster, tmp_shared, daemon_id)
    handle = first.submit(spec_for(ws, owner, "/bin/sleep", "1000"))
    wait_for(first, started(handle), "the job to run", nothing)
    first.close()

    other = adopt(executor(in_cluster, tmp_shared, f"{daemon_id}-other"))
    restarted = executor(in_cluster, tmp_shared, daemon_id)
    adopted = adopt(restarted)

    assert adopted == [handle]  # the key (with the workspace's exact bytes) from the comment
    assert handle not in other
    events = wait_for(restarted, started(handle), "Started from the adopted job", nothing)
    restarted.cancel(handle, False)
    events = wait_for(restarted, exited(handle), "the adopted job's exit", nothing)
    assert the_exit(events).rc == -15


def test_a_job_held_in_the_queue_has_not_started(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    ws = workspace(tmp_shared, owner)
    ex = executor(in_cluster, tmp_shared, daemon_id)
    in_cluster.drain("held by a test")
    try:
        handle = ex.submit(spec_for(ws, owner, "/bin/true"))
        ref = job_id(ex, handle)

        def scheduled_and_held(events: list[Event]) -> bool:
            out = in_cluster.run("squeue", "-h", "-j", ref, "-O", "State:|,Reason")
            state, _, reason = out.stdout.strip().partition("|")
            return state == "PENDING" and reason.strip() not in ("", "None")

        held = wait_for(ex, scheduled_and_held, "the scheduler to hold the job", nothing)
        assert held == []  # queued: no Started, so no resume timeout is running
        released = time.time()
    finally:
        in_cluster.resume()

    events = wait_for(ex, exited(handle), "the job to run once the node is back", nothing)
    assert [type(e) for e in events] == [Started, Exit]
    assert events[0].at >= int(released)  # StartTime has whole seconds
    assert the_exit(events).rc == 0


def test_a_job_cancelled_in_the_queue_never_ran(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    ws = workspace(tmp_shared, owner)
    ex = executor(in_cluster, tmp_shared, daemon_id)
    in_cluster.drain("held by a test")
    try:
        handle = ex.submit(spec_for(ws, owner, "/bin/true"))
        job_id(ex, handle)
        ex.cancel(handle, False)
        events = wait_for(ex, exited(handle), "the cancelled job's end", nothing)
    finally:
        in_cluster.resume()

    assert [type(e) for e in events] == [Exit]
    assert the_exit(events).rc is None  # it never ran: nothing to say of a process
    assert the_exit(events).detail.startswith("CANCELLED")


@pytest.mark.timeout(400)
def test_slurms_time_limit_is_a_backstop_reported_as_timed_out(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    ws = workspace(tmp_shared, owner)
    # --time=1 (minute): what Slurm does when no daemon is alive to cancel the job.
    ex = executor(in_cluster, tmp_shared, daemon_id, time_margin_seconds=0)
    spec = spec_for(ws, owner, "/bin/sleep", "1000")
    handle = ex.submit(JobSpec(spec.key, spec.argv, spec.identity, spec.env, timeout=1))
    events = wait_for(ex, exited(handle), "Slurm's time limit", nothing, deadline=360)

    end = the_exit(events)
    assert (end.timed_out, end.rc) == (True, -15)
    assert end.detail.startswith("TIMEOUT")


def test_no_value_of_the_environment_reaches_an_argv(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    tmp_shared: Path,
) -> None:
    # sbatch behind a wrapper that records the argv it was given: every Slurm command the
    # executor runs goes through it.
    bin_dir = tmp_shared / "bin"
    bin_dir.mkdir()
    argvs = tmp_shared / "argvs"
    for tool in ("sbatch", "squeue", "scancel", "scontrol", "sacct"):
        wrapper = bin_dir / tool
        wrapper.write_text(
            f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" >> {argvs}\nexec /usr/bin/{tool} "$@"\n'
        )
        wrapper.chmod(0o755)
    ws = workspace(tmp_shared, owner)
    ex = executor(in_cluster, tmp_shared, daemon_id, bin_dir=str(bin_dir))
    secret = "sk-test-9f8e7d6c5b4a"
    spec = spec_for(ws, owner, "/bin/sh", "-c", 'echo "key=$OPENAI_API_KEY TZ=${TZ-}"', env={})
    spec = JobSpec(spec.key, spec.argv, spec.identity, {**spec.env, "OPENAI_API_KEY": secret})
    leaked: list[bytes] = []  # any process's argv holding the secret while the job runs
    looked: list[bytes] = []  # slurmd's own argv: the scan does read /proc
    done = threading.Event()

    def scan() -> None:
        while not done.is_set():
            for path in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError):  # ended meanwhile
                    argv = path.read_bytes()
                    leaked.extend([argv] if secret.encode() in argv else [])
                    looked.extend([argv] if b"slurmd" in argv else [])

    scanner = threading.Thread(target=scan)
    scanner.start()
    try:
        handle = ex.submit(spec)
        wait_for(ex, exited(handle), "the job's exit", nothing)
    finally:
        done.set()
        scanner.join()

    assert looked and not leaked
    recorded = argvs.read_text()
    assert f"{bin_dir}/sbatch" in recorded
    assert secret not in recorded
    log = tmp_shared / "logs" / str(owner.uid) / f"{spec.key.name}.log"
    # The job did get it, through the env, and nothing the daemon's commands use (TZ).
    assert log.read_text() == f"key={secret} TZ=\n"


def test_a_missing_slurm_or_an_unreachable_controller_is_a_one_line_error(
    slurm_cluster: Cluster,  # noqa: F811
    owner: User,
    tmp_shared: Path,
) -> None:
    """Slurm cannot be asked: the submit waits in the worker (tried again there, said once),
    never a traceback; adopt() says why in one line."""
    from structlog.testing import capture_logs

    ws = workspace(tmp_shared, owner)
    spec = spec_for(ws, owner, "/bin/true")
    empty = tmp_shared / "empty"
    empty.mkdir()
    with capture_logs() as logs:
        no_slurm = executor(slurm_cluster, tmp_shared, "t-none", bin_dir=str(empty))
        handle = no_slurm.submit(spec)  # at once: the worker asks Slurm
        end = time.monotonic() + DEADLINE
        while no_slurm.turns < 3:  # a few tries
            assert time.monotonic() < end
            time.sleep(0.05)
        assert no_slurm.poll(time.monotonic()) == []  # nothing invented
        with pytest.raises(SubmitError) as missing:
            no_slurm.adopt()
        no_slurm.close()
    assert str(missing.value) == (
        "slurm: cannot list this daemon's jobs: squeue not found: install Slurm's client commands"
    )
    assert no_slurm.tracked() == {} and handle.key.name
    failed = [e for e in logs if e["event"] == "executor_engine_failed"]
    assert len(failed) == 1 and failed[0]["op"] == "query"  # said once

    # Outside the cluster's namespace nothing listens on its port.
    away = executor(slurm_cluster, tmp_shared, "t-away", command_timeout_seconds=60)
    end = time.monotonic() + DEADLINE
    while True:
        try:
            away.adopt()
        except AdoptPending:
            assert time.monotonic() < end
            time.sleep(0.05)
            continue
        except SubmitError as e:
            unreachable = str(e)
            break
        raise AssertionError("adopt() answered without a controller")
    away.close()
    assert "\n" not in unreachable
    assert unreachable.startswith("slurm: cannot list this daemon's jobs: squeue: ")


# -- trust: only what this daemon submitted is its own ------------------------------------------
@pytest.fixture(scope="module")
def intruder() -> Iterator[User]:
    with accounts() as a:
        yield a.user()


def sbatch_as(c: Cluster, user: User, name: str, comment: str, cwd: Path) -> str:
    """A job of `user`'s own (as if they had run sbatch themselves) with the name and comment
    they chose; held in the queue (the one-node cluster runs one job at a time)."""
    out = c.run(
        "sbatch", "--parsable", f"--uid={user.uid}", f"--gid={user.gid}", f"--chdir={cwd}",
        f"--job-name={name}", f"--comment={comment}", "--output=/dev/null", "--hold",
        "--wrap=sleep 1000",
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


def comment_of(c: Cluster, job: str) -> str:
    return c.run("squeue", "-h", "-j", job, "-O", "Comment:0").stdout.strip()


def test_another_users_job_with_this_daemons_comment_is_never_adopted(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    intruder: User,
    tmp_shared: Path,
) -> None:
    from structlog.testing import capture_logs

    ws = workspace(tmp_shared, owner)
    ex = executor(in_cluster, tmp_shared, daemon_id)
    handle = ex.submit(spec_for(ws, owner, "/bin/sleep", "1000"))
    mine = job_id(ex, handle)
    ex.close()
    copied = comment_of(in_cluster, mine)  # readable by all without PrivateData=jobs
    theirs = sbatch_as(in_cluster, intruder, f"deltad-{daemon_id}", copied, tmp_shared)

    with capture_logs() as logs:
        restarted = executor(in_cluster, tmp_shared, daemon_id)
        adopted = adopt(restarted)
        restarted.poll(time.monotonic())
        restarted.close()

    assert adopted == [handle] and dict(adopted[0].shown)["job"] == mine
    ignored = [e for e in logs if e["event"] == "slurm_foreign_job_ignored"]
    assert [e["job"] for e in ignored] == [theirs]  # said once
    assert ignored[0]["uid"] == intruder.uid


def test_another_users_job_named_as_this_daemons_resume_is_not_taken_for_it(
    in_cluster: Cluster,  # noqa: F811
    daemon_id: str,
    owner: User,
    intruder: User,
    tmp_shared: Path,
) -> None:
    from deltad.executors.slurm import comment_for

    ws = workspace(tmp_shared, owner)
    spec = spec_for(ws, owner, "/bin/sh", "-c", "id -u")
    # The intruder guesses the next key and writes its comment (with a secret of their own).
    forged = comment_for(spec.key, daemon_id, owner.uid, b"not the daemon's secret")
    theirs = sbatch_as(in_cluster, intruder, f"deltad-{daemon_id}", forged, tmp_shared)
    ex = executor(in_cluster, tmp_shared, daemon_id)
    handle = ex.submit(spec)

    assert job_id(ex, handle) != theirs  # submitted with sbatch, not taken from the list
    events = wait_for(ex, exited(handle), "the daemon's own job's exit", nothing)
    assert the_exit(events).rc == 0
    log = tmp_shared / "logs" / str(owner.uid) / f"{spec.key.name}.log"
    assert log.read_text().split() == [str(owner.uid)]  # ran as the owner, by this daemon
