"""The Kubernetes executor against an API server over HTTP (kmock's emulator on 127.0.0.1),
through the seam the daemon uses: submit, poll, cancel, adopt.

The emulator runs no controller: each test plays the Job controller and the kubelet by
writing the Job status and the pod they would. What only a real cluster shows (the deadline
firing, the pod's uid and mounts) is in test_kube_cluster.py, opt-in."""

from __future__ import annotations

from collections.abc import Iterator
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
    Exit,
    Handle,
    Identity,
    JobExecutor,
    JobSpec,
    RequestKey,
    Started,
    SubmitError,
)
from tests.kube import Emulator, emulator, kmock

OPTIONS = {
    "image": "registry.example/deltad:1",
    "pvc": "workspaces",
    "mount_path": "/srv/ws",
    "poll_every": 1,
    "request_timeout": 30,
}
ALICE = Identity(1001, 1001)


@pytest.fixture
def emu(tmp_path: Path) -> Iterator[Emulator]:
    with emulator(tmp_path) as e:
        yield e
        granted = {(res, verb) for res, verbs in RBAC_NEEDS.items() for verb in verbs}
        assert e.calls() - {("/pods", "create"), ("batch/jobs/status", "patch")} <= granted, (
            "the executor called something the Role in deploy/kubernetes does not grant"
        )


def executor(emu: Emulator, **extra: Any) -> KubernetesExecutor:
    ex = make_kubernetes_executor({**OPTIONS, "kubeconfig": str(emu.kubeconfig), **extra})
    assert isinstance(ex, JobExecutor)
    return ex


def spec(ws: str = "/srv/ws/alice/a", request: str = "r1", log: Path | None = None) -> JobSpec:
    key = RequestKey(Path(ws), "20261124_010203_abcdef", request, 0)
    return JobSpec(key, ["delta", "run", "--work-dir", ws], ALICE, {"LANG": "C.UTF-8"}, 60, log)


def creates(emu: Emulator) -> int:
    return sum(1 for r in list(emu.handler) if r.action is not None and r.action.name == "CREATE")


def test_the_same_resume_submitted_twice_is_one_job(emu: Emulator) -> None:
    first = executor(emu)
    handle = first.submit(spec())
    assert first.submit(spec()) == handle  # known to this executor: no second call
    # A daemon that crashed before recording the handle submits again: the server says 409.
    again = executor(emu).submit(spec())
    assert again == handle == Handle(spec().key, "kubernetes", spec().key.name)
    assert creates(emu) == 2
    assert [j.metadata.name for j in emu.jobs()] == [spec().key.name]


def test_a_restarted_daemon_adopts_its_own_jobs_by_label(emu: Emulator) -> None:
    old = executor(emu)
    mine = {old.submit(spec("/srv/ws/alice/a")), old.submit(spec("/srv/ws/alice/b"))}
    executor(emu, daemon_id="other").submit(spec("/srv/ws/alice/c"))
    # A Job with this daemon's labels whose key annotation does not match its name.
    forged = spec("/srv/ws/alice/d")
    body = job_manifest(forged, parse_options(OPTIONS))
    body.metadata.annotations["deltad.io/key"] = '{"workspace": "/srv/ws/alice/a"}'
    emu.batch.create_namespaced_job("default", body)

    new = executor(emu)
    assert set(new.adopt()) == mine
    # Adopted jobs are watched: an exit now is reported with its code.
    emu.play_pod(spec("/srv/ws/alice/b").key.name, 0, "Completed")
    emu.set_job_status(
        spec("/srv/ws/alice/b").key.name,  # ended while no daemon ran
        {"startTime": "2026-11-24T00:00:00Z", "succeeded": 1, "conditions": [complete()]},
    )
    b = spec("/srv/ws/alice/b").key
    exits = [e for e in new.poll(100.0) if isinstance(e, Exit)]
    assert exits == [
        Exit(Handle(b, "kubernetes", b.name), 0, False, "CompletionsReached, Completed")
    ]


def complete() -> dict[str, str]:
    return {"type": "Complete", "status": "True", "reason": "CompletionsReached"}


def failed(reason: str) -> dict[str, str]:
    return {"type": "Failed", "status": "True", "reason": reason}


def test_poll_reports_the_start_then_the_exit_code_from_the_pod(
    emu: Emulator, tmp_path: Path
) -> None:
    log = tmp_path / "resume.log"
    ex = executor(emu)
    handle = ex.submit(spec(log=log))
    name = handle.key.name
    assert ex.poll(0.0) == []  # queued: no start time yet

    emu.set_job_status(name, {"startTime": "2026-11-24T00:00:05Z", "active": 1, "ready": 1})
    assert ex.poll(10.0) == [
        Started(handle, datetime(2026, 11, 24, 0, 0, 5, tzinfo=UTC).timestamp())
    ]
    assert ex.poll(20.0) == []  # reported once

    pod = emu.play_pod(name, 101)
    emu.handler[f"get /api/v1/namespaces/default/pods/{pod}/log"] << kmock.text("paused\n")
    emu.set_job_status(
        name, {"active": 0, "ready": 0, "failed": 1, "conditions": [failed("BackoffLimitExceeded")]}
    )
    (done,) = ex.poll(30.0)
    assert done == Exit(handle, 101, False, "BackoffLimitExceeded, Error")
    assert done.meaning == "waiting"
    assert log.read_text() == "paused\n"  # the pod's output kept in the resume log
    assert emu.jobs() == []  # the daemon deletes a Job once it has read its exit
    assert ex.poll(40.0) == []


def test_a_job_past_its_deadline_is_a_timeout(emu: Emulator) -> None:
    ex = executor(emu)
    handle = ex.submit(spec())
    emu.play_pod(handle.key.name, 143)
    emu.set_job_status(
        handle.key.name,
        {
            "startTime": "2026-11-24T00:00:05Z",
            "failed": 1,
            "conditions": [failed("DeadlineExceeded")],
        },
    )
    started, done = ex.poll(10.0)
    assert isinstance(started, Started)
    assert done == Exit(handle, -15, True, "DeadlineExceeded, Error")
    assert done.meaning == "killed_by_SIGTERM"


def test_cancel_deletes_the_job_with_the_grace_and_the_pods_first(emu: Emulator) -> None:
    ex = executor(emu)
    handle = ex.submit(spec())
    ex.cancel(handle, 7)
    (delete,) = [r for r in list(emu.handler) if r.action is not None and r.action.name == "DELETE"]
    # The client sends the delete options as query parameters (the API takes either).
    assert dict(delete.params) == {"gracePeriodSeconds": "7", "propagationPolicy": "Foreground"}
    assert emu.jobs() == []
    # Gone, and no pod said how it ended: unknown (what the run left on disk decides).
    assert ex.poll(10.0) == [Exit(handle, None, False, "job gone")]
    ex.cancel(handle, 7)  # a second cancel of a gone Job is no error


def test_a_pod_that_ended_without_a_code_is_unknown(emu: Emulator) -> None:
    ex = executor(emu)
    handle = ex.submit(spec())
    emu.set_job_status(
        handle.key.name,
        {
            "startTime": "2026-11-24T00:00:05Z",
            "failed": 1,
            "conditions": [failed("PodFailurePolicy")],
        },
    )  # an evicted pod: no container terminated state
    assert ex.poll(10.0)[-1] == Exit(handle, None, False, "PodFailurePolicy")


def test_poll_lists_jobs_at_most_once_per_poll_every(emu: Emulator) -> None:
    ex = executor(emu, poll_every=5)
    ex.submit(spec())

    def lists() -> int:
        return sum(
            1
            for r in list(emu.handler)
            if r.action is not None and r.action.name == "LIST" and r.resource.plural == "jobs"
        )

    ex.poll(100.0)
    ex.poll(104.9)
    assert lists() == 1
    ex.poll(105.0)
    assert lists() == 2


def test_an_unreachable_server_is_a_one_line_submit_error_and_a_quiet_poll(tmp_path: Path) -> None:
    with emulator(tmp_path) as emu:
        ex = executor(emu, request_timeout=5)
        handle = ex.submit(spec("/srv/ws/alice/a"))
    # The server is gone now.
    with pytest.raises(SubmitError, match="kubernetes: cannot submit deltad-") as e:
        ex.submit(spec("/srv/ws/alice/b"))
    assert "\n" not in str(e.value)
    with capture_logs() as logs:
        assert ex.poll(10.0) == []  # tried again at the next poll; nothing invented meanwhile
        assert ex.poll(20.0) == []
    # An outage is said once, not at every poll (the daemon polls every `poll_every`).
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["kubernetes_poll_failed"]
    with pytest.raises(SubmitError, match="cannot list this daemon's jobs"):
        ex.adopt()
    assert handle.key == spec("/srv/ws/alice/a").key


def test_a_resume_the_manifest_refuses_never_reaches_the_server(emu: Emulator) -> None:
    ex = executor(emu)
    with pytest.raises(SubmitError, match="owned by root"):
        ex.submit(JobSpec(spec().key, ["delta"], Identity(0, 0)))
    assert creates(emu) == 0


def test_a_refusal_other_than_already_exists_is_a_one_line_submit_error(emu: Emulator) -> None:
    emu.handler["post /apis/batch/v1/namespaces/default/jobs"] << 403
    ex = executor(emu)
    with pytest.raises(SubmitError, match=r"kubernetes refused job deltad-\w+: 403 Forbidden") as e:
        ex.submit(spec())
    assert "\n" not in str(e.value)
    assert ex.poll(10.0) == []  # nothing tracked: the daemon backs off and submits again


def test_a_job_that_exists_but_cannot_be_read_is_a_one_line_submit_error(emu: Emulator) -> None:
    executor(emu).submit(spec())
    emu.handler[f"get /apis/batch/v1/namespaces/default/jobs/{spec().key.name}"] << 404
    with pytest.raises(SubmitError, match=r"exists but cannot be read: .*404") as e:
        executor(emu).submit(spec())  # 409, then the Job is gone (being deleted, say)
    assert "\n" not in str(e.value)


def test_a_cancel_the_server_did_not_take_is_sent_again_at_the_next_poll(emu: Emulator) -> None:
    emu.handler[lambda req: req.method.name == "DELETE"] << 503
    ex = executor(emu)
    handle = ex.submit(spec())

    def deletes() -> int:
        return sum(1 for r in list(emu.handler) if r.method.name == "DELETE")

    ex.cancel(handle, 7)  # answered 503: not taken
    assert deletes() == 1
    # Sent again. (The emulator removed the Job despite its 503, so this one is a 404: gone,
    # which is what a cancel asks; no more are sent.)
    ex.poll(10.0)
    assert deletes() == 2
    ex.poll(20.0)
    assert deletes() == 2


def test_an_ended_job_whose_pods_cannot_be_listed_is_read_at_a_later_poll(emu: Emulator) -> None:
    ex = executor(emu)
    handle = ex.submit(spec())
    emu.play_pod(handle.key.name, 0, "Completed")
    emu.set_job_status(
        handle.key.name,
        {"startTime": "2026-11-24T00:00:05Z", "succeeded": 1, "conditions": [complete()]},
    )
    failing = [True]
    (
        emu.handler[lambda req: req.url.path == "/api/v1/namespaces/default/pods" and bool(failing)]
        << 503
    )
    assert ex.poll(10.0) == []  # nothing invented, nothing lost
    failing.clear()
    assert [e for e in ex.poll(20.0) if isinstance(e, Exit)] == [
        Exit(handle, 0, False, "CompletionsReached, Completed")
    ]
