"""The Kubernetes executor against an API server over HTTP (kmock's emulator on 127.0.0.1),
through the seam the daemon uses: submit, poll, cancel, adopt. The executor talks to the
server from its worker thread; each test waits (a condition, a generous deadline) for what the
worker reports through `fds()`, as the daemon's loop does.

The emulator runs no controller: each test plays the Job controller and the kubelet by
writing the Job status and the pod they would. What only a real cluster shows (the deadline
firing, the pod's uid and mounts) is in test_kube_cluster.py, opt-in."""

from __future__ import annotations

import base64
import json
import re
import select
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from deltad.executors.kubernetes import (
    RBAC_NEEDS,
    KubernetesExecutor,
    job_manifest,
    make_kubernetes_executor,
    parse_options,
)
from deltad.executors.seam import (
    AdoptPending,
    Event,
    Exit,
    Handle,
    Identity,
    JobExecutor,
    JobSpec,
    Refused,
    RequestKey,
    Started,
    SubmitError,
)
from tests.kube import Emulator, HangingProxy, emulator, kmock

OPTIONS = {
    "image": "registry.example/deltad:1",
    "pvc": "workspaces",
    "mount_path": "/srv/ws",
    "poll_every": 0.1,
    "request_timeout": 30,
}
ALICE = Identity(1001, 1001)
DEADLINE = 60.0


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with emulator(tmp_path) as e:
        yield e
        while _made:  # the executors let go (their watches end) before the server stops
            _made.pop().close()
        granted = {(res, verb) for res, verbs in RBAC_NEEDS.items() for verb in verbs}
        played = {("/pods", "create"), ("batch/jobs/status", "patch"), ("/secrets", "get")}
        assert e.calls() - played <= granted, (
            "the executor called something the Role in deploy/kubernetes does not grant"
        )


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """The daemon's state dir (its signing key), shared by the executors of one test."""
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    return d


_made: list[KubernetesExecutor] = []


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Every executor a test made is closed after it (its worker stops)."""
    yield
    while _made:
        _made.pop().close()


def executor(emu: Emulator, state: Path, **extra: Any) -> KubernetesExecutor:
    options = {**OPTIONS, "kubeconfig": str(emu.kubeconfig), **extra}
    ex = make_kubernetes_executor.build(options, state)
    assert isinstance(ex, JobExecutor)
    _made.append(ex)
    return ex


def spec(
    ws: str = "/srv/ws/alice/a",
    request: str = "r1",
    log: Path | None = None,
    env: dict[str, str] | None = None,
) -> JobSpec:
    key = RequestKey(Path(ws), "20261124_010203_abcdef", request, 0)
    env = {"LANG": "C.UTF-8"} if env is None else env
    return JobSpec(key, ["delta", "run", "--work-dir", ws], ALICE, env, 60, log)


def requests(emu: Emulator, action: str, plural: str | None = None) -> int:
    return sum(
        1
        for r in list(emu.handler)
        if r.action is not None
        and r.action.name == action
        and (plural is None or r.resource.plural == plural)
    )


def until(ex: KubernetesExecutor, done: Callable[[list[Event]], bool], what: str) -> list[Event]:
    """Poll as the daemon does (select on the worker's fd) until `done(events so far)`."""
    events: list[Event] = []
    end = time.monotonic() + DEADLINE
    while not done(events):
        assert time.monotonic() < end, f"timed out waiting for {what}; events: {events}"
        select.select(ex.fds(), [], [], 0.2)
        events += ex.poll(time.monotonic())
    return events


def wait(cond: Callable[[], object], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def submitted(ex: KubernetesExecutor, handle: Handle) -> None:
    """Wait until the worker has made the Job (or found it)."""
    wait(lambda: ex.tracked()[handle.key.name].ref is not None, "the Job made")


def adopt(ex: KubernetesExecutor) -> list[Handle]:
    end = time.monotonic() + DEADLINE
    while True:
        try:
            return ex.adopt()
        except AdoptPending:
            assert time.monotonic() < end, "no first list"
            select.select(ex.fds(), [], [], 0.2)


def has(kind: type, handle: Handle) -> Callable[[list[Event]], bool]:
    return lambda evs: any(isinstance(e, kind) and e.handle == handle for e in evs)


def complete() -> dict[str, str]:
    return {"type": "Complete", "status": "True", "reason": "CompletionsReached"}


def failed(reason: str) -> dict[str, str]:
    return {"type": "Failed", "status": "True", "reason": reason}


def test_the_same_resume_submitted_twice_is_one_job(emu: Emulator, state: Path) -> None:
    first = executor(emu, state)
    handle = first.submit(spec())
    assert first.submit(spec()) == handle  # known to this executor: no second call
    submitted(first, handle)
    first.close()
    # A daemon that crashed before recording the handle submits again: the server says 409.
    again = executor(emu, state)
    assert again.submit(spec()) == handle == Handle(spec().key, "kubernetes", spec().key.name)
    submitted(again, handle)
    assert requests(emu, "CREATE", "jobs") == 1  # found by its list: never made twice
    assert [j.metadata.name for j in emu.jobs()] == [spec().key.name]


def test_a_restarted_daemon_adopts_its_own_jobs_only(emu: Emulator, state: Path) -> None:
    old = executor(emu, state)
    mine = {old.submit(spec("/srv/ws/alice/a")), old.submit(spec("/srv/ws/alice/b"))}
    for h in mine:
        submitted(old, h)
    old.close()
    other = executor(emu, state, daemon_id="other")
    submitted(other, other.submit(spec("/srv/ws/alice/c")))
    other.close()
    options = parse_options(OPTIONS)
    # A Job with this daemon's labels whose key annotation does not match its name.
    forged = job_manifest(spec("/srv/ws/alice/d"), options, b"k" * 32)
    forged.metadata.annotations["deltad.io/key"] = '{"workspace": "/srv/ws/alice/a"}'
    emu.batch.create_namespaced_job("default", forged)
    # Someone else's Job with this daemon's labels and a well-formed key: no valid tag.
    theirs = job_manifest(spec("/srv/ws/alice/e"), options, b"someone else's secret")
    emu.batch.create_namespaced_job("default", theirs)

    with capture_logs() as logs:
        new = executor(emu, state)
        assert set(adopt(new)) == mine
    ignored = [e["job"] for e in logs if e["event"] == "kubernetes_foreign_job_ignored"]
    assert sorted(ignored) == sorted([forged.metadata.name, theirs.metadata.name])
    # Adopted jobs are watched: an exit now is reported with its code.
    b = spec("/srv/ws/alice/b").key
    emu.play_pod(b.name, 0, "Completed")
    emu.set_job_status(
        b.name,  # ended while no daemon ran
        {"startTime": "2026-11-24T00:00:00Z", "succeeded": 1, "conditions": [complete()]},
    )
    handle = Handle(b, "kubernetes", b.name)
    events = until(new, has(Exit, handle), "the adopted Job's exit")
    assert [e for e in events if isinstance(e, Exit)] == [
        Exit(handle, 0, False, "CompletionsReached, Completed")
    ]


def test_poll_reports_the_start_then_the_exit_code_from_the_pod(
    emu: Emulator, state: Path, tmp_path: Path
) -> None:
    log = tmp_path / "resume.log"
    ex = executor(emu, state)
    handle = ex.submit(spec(log=log))
    name = handle.key.name
    submitted(ex, handle)
    assert ex.poll(time.monotonic()) == []  # queued: no start time yet

    emu.set_job_status(name, {"startTime": "2026-11-24T00:00:05Z", "active": 1, "ready": 1})
    events = until(ex, has(Started, handle), "Started")
    assert events == [Started(handle, datetime(2026, 11, 24, 0, 0, 5, tzinfo=UTC).timestamp())]

    pod = emu.play_pod(name, 101)
    emu.handler[f"get /api/v1/namespaces/default/pods/{pod}/log"] << kmock.text("paused\n")
    emu.set_job_status(
        name, {"active": 0, "ready": 0, "failed": 1, "conditions": [failed("BackoffLimitExceeded")]}
    )
    (done,) = until(ex, has(Exit, handle), "the exit")
    assert done == Exit(handle, 101, False, "BackoffLimitExceeded, Error")
    assert done.meaning == "waiting"
    wait(lambda: emu.jobs() == [], "the Job deleted once its exit was read")
    assert log.read_text() == "paused\n"  # the pod's output kept in the resume log
    assert ex.poll(time.monotonic()) == []


def test_credentials_reach_the_job_only_through_its_own_secret(emu: Emulator, state: Path) -> None:
    env = {
        "LANG": "C.UTF-8",
        "OPENAI_API_KEY": "sk-test-1",
        "OPENAI_BASE_URL": "https://user:pw@llm.example/v1",
        "X_AUTH_HEADER": "Bearer tok",
        "DB_DSN": "postgres://u:p@db/x",
    }
    ex = executor(emu, state)
    handle = ex.submit(spec(env=env))
    submitted(ex, handle)
    [job] = emu.jobs()
    (c,) = job.spec.template.spec.containers
    assert [(v.name, v.value) for v in c.env] == [("LANG", "C.UTF-8")]
    assert [s.secret_ref.name for s in c.env_from] == [handle.key.name]
    for value in ("sk-test-1", "user:pw@", "Bearer tok", "u:p@db"):
        assert value not in str(job.to_dict())
    secret = emu.core.read_namespaced_secret(handle.key.name, "default")
    values = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
    assert values == {k: v for k, v in env.items() if k != "LANG"}
    # The Job ends: its Secret goes with it.
    emu.play_pod(handle.key.name, 0, "Completed")
    emu.set_job_status(
        handle.key.name,
        {"startTime": "2026-11-24T00:00:05Z", "succeeded": 1, "conditions": [complete()]},
    )
    until(ex, has(Exit, handle), "the exit")

    def secret_gone() -> bool:
        try:
            emu.core.read_namespaced_secret(handle.key.name, "default")
        except Exception as e:
            return getattr(e, "status", None) == 404
        return False

    wait(secret_gone, "the Job's Secret deleted with it")


def test_a_job_past_its_deadline_is_a_timeout(emu: Emulator, state: Path) -> None:
    ex = executor(emu, state)
    handle = ex.submit(spec())
    submitted(ex, handle)
    emu.play_pod(handle.key.name, 143)
    emu.set_job_status(
        handle.key.name,
        {
            "startTime": "2026-11-24T00:00:05Z",
            "failed": 1,
            "conditions": [failed("DeadlineExceeded")],
        },
    )
    started, done = until(ex, has(Exit, handle), "the exit")
    assert isinstance(started, Started)
    assert done == Exit(handle, -15, True, "DeadlineExceeded, Error")
    assert done.meaning == "killed_by_SIGTERM"


def test_cancel_deletes_the_job_with_the_grace_then_at_once(emu: Emulator, state: Path) -> None:
    ex = executor(emu, state, cancel_grace=7)
    handle = ex.submit(spec())
    submitted(ex, handle)
    ex.cancel(handle, False)
    wait(lambda: requests(emu, "DELETE", "jobs") >= 1, "the delete")
    delete = next(r for r in list(emu.handler) if r.method.name == "DELETE")
    # The client sends the delete options as query parameters (the API takes either).
    assert dict(delete.params) == {"gracePeriodSeconds": "7", "propagationPolicy": "Foreground"}
    # Gone, and no pod said how it ended: unknown (what the run left on disk decides).
    events = until(ex, has(Exit, handle), "the exit")
    assert events == [Exit(handle, None, False, "job gone")]
    ex.cancel(handle, True)  # a cancel of a gone Job is no error (and nothing is sent)


def test_a_forced_cancel_deletes_with_no_grace(emu: Emulator, state: Path) -> None:
    ex = executor(emu, state)
    handle = ex.submit(spec())
    submitted(ex, handle)
    ex.cancel(handle, True)
    wait(lambda: requests(emu, "DELETE", "jobs") >= 1, "the delete")
    delete = next(r for r in list(emu.handler) if r.method.name == "DELETE")
    assert dict(delete.params) == {"gracePeriodSeconds": "0", "propagationPolicy": "Foreground"}


def test_a_pod_that_ended_without_a_code_is_unknown(emu: Emulator, state: Path) -> None:
    ex = executor(emu, state)
    handle = ex.submit(spec())
    submitted(ex, handle)
    emu.set_job_status(
        handle.key.name,
        {
            "startTime": "2026-11-24T00:00:05Z",
            "failed": 1,
            "conditions": [failed("PodFailurePolicy")],
        },
    )  # an evicted pod: no container terminated state
    events = until(ex, has(Exit, handle), "the exit")
    assert events[-1] == Exit(handle, None, False, "PodFailurePolicy")


def test_a_jobs_start_and_end_come_through_the_watch_not_a_list(emu: Emulator, state: Path) -> None:
    ex = executor(emu, state, poll_every=0.1)
    handle = ex.submit(spec())
    submitted(ex, handle)
    turns = ex.turns
    wait(lambda: ex.turns >= turns + 4, "the worker to look a few times")
    assert ex._pause > 0.1 * 2  # doubled at each look that found nothing new
    emu.set_job_status(handle.key.name, {"startTime": "2026-11-24T00:00:05Z", "active": 1})
    until(ex, has(Started, handle), "Started")
    assert ex._pause == 0.1  # a change: back to poll_every
    emu.play_pod(handle.key.name, 0, "Completed")
    emu.set_job_status(
        handle.key.name,
        {"startTime": "2026-11-24T00:00:05Z", "succeeded": 1, "conditions": [complete()]},
    )
    [done] = until(ex, has(Exit, handle), "the exit")
    assert done == Exit(handle, 0, False, "CompletionsReached, Completed")
    # One list at the start; the rest came through one watch, from that list's version.
    assert emu.lists() == 1 and ex.counts()["relists"] == 0
    assert emu.watches()[0] == "0" and ex.counts()["watch_restarts"] == 0


def ended(emu: Emulator, name: str, code: int = 0) -> None:
    """Play the Job's end: its pod's exit code, then the Job's condition."""
    emu.play_pod(name, code, "Completed" if code == 0 else "Error")
    status = {"startTime": "2026-11-24T00:00:05Z", "conditions": [complete()]}
    emu.set_job_status(name, {**status, "succeeded": 1} if code == 0 else status)


def test_a_change_lost_to_a_compacted_history_is_found_by_one_relist(
    emu: Emulator, state: Path, tmp_path: Path
) -> None:
    proxy = HangingProxy(emu, tmp_path)
    try:
        ex = executor(emu, state, kubeconfig=str(proxy.kubeconfig))
        handle = ex.submit(spec())
        submitted(ex, handle)
        assert emu.lists() == 1
        # The watch open and past the Job's ADDED: a watch still at the list's version when the
        # server goes would come back at "0" (any version), which is never Gone.
        wait(
            lambda: emu.handler.streams == 1 and ex._watch.version not in ("", "0"),
            "the watch past the Job's ADDED",
        )
        with proxy.down():  # the server away: the Job ends, and its history is compacted
            wait(lambda: ex._watch._error, "the watch to fail")
            ended(emu, handle.key.name)
            emu.expire()
        # Back: the watch from the version it had is 410 Gone: one list, and the end is in it.
        [done] = [e for e in until(ex, has(Exit, handle), "the exit") if isinstance(e, Exit)]
        assert done == Exit(handle, 0, False, "CompletionsReached, Completed")
        assert emu.lists() == 2 and ex.counts()["relists"] == 1
        # A 410 in an open stream (an ERROR event) is one list too.
        other = ex.submit(spec("/srv/ws/alice/b"))
        submitted(ex, other)
        wait(lambda: emu.handler.streams == 1, "the watch open")
        emu.expire()
        wait(lambda: emu.lists() == 3, "the list after the ERROR 410")
        ended(emu, other.key.name, 3)
        until(ex, has(Exit, other), "the second exit")
        assert emu.lists() == 3 and ex.counts()["relists"] == 2
        # A server without its watch cache answers the watch with HTTP 410: one list too.
        emu.handler.gone_as_http = True
        third = ex.submit(spec("/srv/ws/alice/c"))
        submitted(ex, third)
        wait(lambda: emu.handler.streams == 1, "the watch open")
        emu.expire(drop=True)  # the stream breaks: watched again from its version: HTTP 410
        wait(lambda: emu.lists() == 4, "the list after the HTTP 410")
        ended(emu, third.key.name, 5)
        until(ex, has(Exit, third), "the third exit")
        assert emu.lists() == 4 and ex.counts()["relists"] == 3
    finally:
        proxy.close()


def test_a_dropped_stream_is_watched_again_from_the_last_version_a_bookmark_moved(
    emu: Emulator, state: Path
) -> None:
    ex = executor(emu, state)
    handle = ex.submit(spec())
    submitted(ex, handle)
    wait(lambda: emu.handler.streams == 1, "the watch open")
    emu.play_pod("someone-elses", None)  # another resource's change: the version moves on,
    wait(lambda: ex._watch.version == str(emu.handler.rv), "a bookmark")  # told by a bookmark
    version = ex._watch.version
    emu.drop()
    wait(lambda: len(emu.watches()) == 2 and emu.handler.streams == 1, "the watch again")
    assert emu.watches()[-1] == version  # from where it was, not from a list
    # Someone else's Job with this daemon's labels comes through the stream: ignored, said once.
    theirs = job_manifest(spec("/srv/ws/alice/x"), parse_options(OPTIONS), b"another secret")
    with capture_logs() as logs:
        emu.batch.create_namespaced_job("default", theirs)
        emu.set_job_status(theirs.metadata.name, {"startTime": "2026-11-24T00:00:05Z"})
        ended(emu, handle.key.name, 4)
        [done] = [e for e in until(ex, has(Exit, handle), "the exit") if isinstance(e, Exit)]
    assert done.rc == 4
    assert emu.lists() == 1 and ex.counts()["watch_restarts"] == 1
    said = [e["job"] for e in logs if e["event"] == "kubernetes_foreign_job_ignored"]
    assert said == [theirs.metadata.name] and theirs.metadata.name not in ex.tracked()


def test_an_unreachable_server_keeps_submits_waiting_and_is_said_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    with capture_logs() as before, emulator(tmp_path) as emu:
        ex = executor(emu, state, request_timeout=5)
        handle = ex.submit(spec("/srv/ws/alice/a"))
        submitted(ex, handle)
        # Made parked, then let go by a patch: that call is over before the server goes (one
        # still in flight as it went failed as `release`, with nothing wrong).
        released = "kubernetes_job_released"
        wait(lambda: any(e["event"] == released for e in before), "the Job let go")
    # The server is gone now.
    with capture_logs() as logs:
        other = ex.submit(spec("/srv/ws/alice/b"))  # at once: the worker asks the server
        turns = ex.turns
        wait(lambda: ex.turns >= turns + 3, "the worker to ask a few times")
        # Nothing invented for either: the new one waits for the server, the old one runs on.
        assert ex.poll(time.monotonic()) == []
        assert ex.tracked()[other.key.name].ref is None
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert {e["event"] for e in warned} == {"executor_engine_failed"}
    ops = [e["op"] for e in warned]  # the submit's, and the query's once the watch failed
    assert ops and len(ops) == len(set(ops)) and set(ops) <= {"query", "submit"}, ops
    assert all("\n" not in e["error"] for e in warned)
    ex.close()
    fresh = executor(emu, state, request_timeout=5)
    wait(lambda: fresh._list_error, "the first list to fail")
    with pytest.raises(SubmitError, match="kubernetes: cannot list this daemon's jobs: "):
        fresh.adopt()  # adopt() says the server cannot be asked


def test_a_resume_the_manifest_refuses_never_reaches_the_server(emu: Emulator, state: Path) -> None:
    ex = executor(emu, state)
    with pytest.raises(SubmitError, match="owned by root") as e:
        ex.submit(JobSpec(spec().key, ["delta"], Identity(0, 0)))
    assert e.value.permanent  # the daemon does not try it again
    assert requests(emu, "CREATE") == 0


def test_a_refusal_other_than_already_exists_is_a_one_line_refusal(
    emu: Emulator, state: Path
) -> None:
    emu.handler["post /apis/batch/v1/namespaces/default/jobs"] << 403
    ex = executor(emu, state)
    handle = ex.submit(spec())
    [refused] = until(ex, has(Refused, handle), "the refusal")
    assert re.fullmatch(r"kubernetes refused job deltad-\w+: 403 Forbidden.*", refused.reason)
    assert handle.key.name not in ex.tracked()  # the daemon submits again after its backoff


def test_someone_elses_job_of_the_same_name_is_not_taken_for_the_resume(
    emu: Emulator, state: Path
) -> None:
    theirs = job_manifest(spec(), parse_options(OPTIONS), b"someone else's secret")
    emu.batch.create_namespaced_job("default", theirs)
    ex = executor(emu, state)
    handle = ex.submit(spec())
    [refused] = until(ex, has(Refused, handle), "the refusal")
    assert "exists and is not this daemon's" in refused.reason


def test_a_cancel_the_server_did_not_take_is_sent_again(emu: Emulator, state: Path) -> None:
    emu.handler[lambda req: req.method.name == "DELETE"] << 503
    ex = executor(emu, state)
    handle = ex.submit(spec())
    submitted(ex, handle)

    def deletes() -> int:  # the cancel's (a Job's deletion once it ended is another's)
        return sum(
            1
            for r in list(emu.handler)
            if r.method.name == "DELETE" and r.params.get("propagationPolicy") == "Foreground"
        )

    with capture_logs() as logs:
        ex.cancel(handle, False)  # answered 503: not taken, said, and asked again
        # (The emulator removed the Job despite its 503: the next list finds it gone, and a
        # cancel still queued for it is then moot; sent again only while the Job is listed.)
        until(ex, has(Exit, handle), "the exit of the Job gone")
    failed = [e for e in logs if e["event"] == "executor_engine_failed"]
    assert [e["op"] for e in failed] == ["cancel"] and "503" in failed[0]["error"]
    assert 1 <= deletes() <= 2


def test_an_ended_job_whose_pods_cannot_be_listed_is_read_later(emu: Emulator, state: Path) -> None:
    ex = executor(emu, state)
    handle = ex.submit(spec())
    submitted(ex, handle)
    emu.play_pod(handle.key.name, 0, "Completed")
    failing = [True]
    (
        emu.handler[lambda req: req.url.path == "/api/v1/namespaces/default/pods" and bool(failing)]
        << 503
    )
    emu.set_job_status(
        handle.key.name,
        {"startTime": "2026-11-24T00:00:05Z", "succeeded": 1, "conditions": [complete()]},
    )
    lists = requests(emu, "LIST", "pods")
    wait(lambda: requests(emu, "LIST", "pods") >= lists + 2, "reads while pods fail")
    assert not [e for e in ex.poll(time.monotonic()) if isinstance(e, Exit)]  # nothing invented
    failing.clear()
    events = until(ex, has(Exit, handle), "the exit")
    assert [e for e in events if isinstance(e, Exit)] == [
        Exit(handle, 0, False, "CompletionsReached, Completed")
    ]


def test_a_job_is_made_suspended_and_let_go_only_by_the_active(emu: Emulator, state: Path) -> None:
    """HA's two-step submit: every Job is made suspended and let go by a patch after the fence;
    a stale daemon (its lease lost while its create was in flight) leaves its Job suspended,
    and the active deletes that Job, which no resume of its own tracks."""
    active = executor(emu, state)
    adopt(active)
    handle = active.submit(spec("/srv/ws/alice/a"))
    submitted(active, handle)
    wait(lambda: not emu.jobs()[0].spec.suspend, "the Job let go")
    [made] = [json.loads(r.body) for r in list(emu.handler) if r.method.name == "POST"]
    assert made["spec"]["suspend"] is True  # made suspended: no pod before the release
    patches = [
        r
        for r in list(emu.handler)
        if r.method.name == "PATCH" and r.url.path.endswith(f"/jobs/{handle.key.name}")
    ]
    assert [json.loads(r.body) for r in patches] == [{"spec": {"suspend": False}}]
    with capture_logs() as logs:
        stale = executor(emu, state)
        stale.fence = lambda: False  # the lease lost while its create was in flight
        late = stale.submit(spec("/srv/ws/alice/b"))
        events = until(stale, has(Refused, late), "the refusal")
        wait(lambda: late.key.name not in {j.metadata.name for j in emu.jobs()}, "deleted")
    [refused] = [e for e in events if isinstance(e, Refused)]
    assert "fenced" in refused.reason
    said = [e["workspace"] for e in logs if e["event"] == "executor_orphan_cancelled"]
    assert said == ["/srv/ws/alice/b"]
    assert [j.metadata.name for j in emu.jobs()] == [handle.key.name]
