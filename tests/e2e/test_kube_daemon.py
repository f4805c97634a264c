"""A real `deltad serve` with `executor: kubernetes`, talking over HTTP on 127.0.0.1 to kmock's
Kubernetes API emulator (tests/kube.py), with a test kubelet playing the node: it runs each
Job's command as the pod's `runAsUser` in the workspace and writes the pod's exit code back.

One answer is one Job, run as the workspace's owner (the real `delta run` against the fake
model); a daemon killed with SIGKILL while its Job runs is restarted, adopts the Job by label
and reads its exit; a resume past its timeout has its Job deleted with a grace period (TERM,
then KILL after it). Every wait is a condition with a generous deadline, never a fixed sleep.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from deltad.testing import FakeLLM
from deltad.testing.stub import ELSEWHERE_HOST, paused_workspace
from tests.kube import Emulator, HangingProxy, Kubelet, emulator
from tests.support.daemon import Daemon, answer, metadata_status, records, stub_command, wait_for
from tests.support.inbox import client, http_url, make_token
from tests.users import User, accounts, chown_tree, executable_by_all, shared_tmp

from ..conftest import llm_env, write_agent

DEADLINE = 60.0
DELTA = str(Path(sys.executable).parent / "delta")
REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]
SECRET = "llm-credentials"


@pytest.fixture
def owner() -> Iterator[User]:
    with accounts() as a:
        yield a.user()


@pytest.fixture
def base() -> Iterator[Path]:
    with executable_by_all(), shared_tmp() as d:
        yield d


@pytest.fixture
def emu(base: Path) -> Iterator[Emulator]:
    with emulator(base) as e:
        e.core.create_namespaced_secret(
            "default",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": SECRET},
                "data": {"OPENAI_API_KEY": base64.b64encode(b"test-key").decode()},
            },
        )
        yield e


@pytest.fixture
def kubelet(emu: Emulator, base: Path) -> Iterator[Kubelet]:
    with Kubelet(emu, base / "pods.log") as k:
        yield k


def kube_daemon(
    base: Path, emu: Emulator, root: Path, kubeconfig: Path | None = None, **settings: Any
) -> Daemon:
    home = base / "daemon"
    home.mkdir(exist_ok=True)
    options = {
        "image": "deltad:test",
        "pvc": "workspaces",
        "mount_path": str(root),
        "kubeconfig": str(kubeconfig or emu.kubeconfig),
        "env_from_secret": SECRET,
        "daemon_id": f"k{os.getpid()}",
        "poll_every": 0.3,
        "request_timeout": 10,
    }
    return Daemon(
        home, [root], executor="kubernetes", executors={"kubernetes": options}, **settings
    )


def job_creates(emu: Emulator) -> list[str]:
    """The name of every Job the daemon asked the server to create (one per request)."""
    return [
        json.loads(r.body or b"{}").get("metadata", {}).get("name", "")
        for r in list(emu.handler)
        if r.method.name == "POST" and r.url.path.endswith("/jobs")
    ]


def as_owner(owner: User, fake: FakeLLM, *args: str) -> int:
    import subprocess

    env = [f"{k}={v}" for k, v in llm_env(fake).items() if k.startswith(("OPENAI_", "DELTA_"))]
    argv = owner.argv("env", *env, DELTA, *args, umask="022")
    return subprocess.run(argv, capture_output=True, timeout=60, cwd="/").returncode


def test_one_answer_is_one_job_that_resumes_the_run_as_its_owner(
    base: Path, owner: User, emu: Emulator, kubelet: Kubelet, fake: FakeLLM
) -> None:
    root = base / "root"
    ws = root / "alice-ws"
    ws.mkdir(parents=True)
    chown_tree(ws, owner)
    agent = write_agent(base)
    chown_tree(agent, owner)
    fake.call("ask_human", {"prompt": "colour?"}, id="ask1").reply("done")
    assert as_owner(owner, fake, "run", "--agent", str(agent), "--task", "t", "-w", str(ws)) == 101
    d = kube_daemon(base, emu, root, resume_command=REAL_CLIENT)
    d.start(env=llm_env(fake))
    try:
        answer(ws, "blue")
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run resumed by its Job", DEADLINE)
        [exited] = d.wait_event("resume_exited", workspace=str(ws), timeout=DEADLINE)
        assert exited["exit_code"] == 0 and exited["outcome"] == "completed"
        [spawned] = d.events("resume_spawned", workspace=str(ws))
        # A cluster job: named by its ref (the Job's uid), no pid.
        assert spawned["executor"] == "kubernetes" and spawned["job"] and "pid" not in spawned
        assert spawned["uid"] == owner.uid
        # The key came from the Job's own Secret, not its plain environment.
        [private] = d.events("kubernetes_env_in_secret")
        assert "OPENAI_API_KEY" in private["names"] and "OPENAI_BASE_URL" in private["names"]
        wait_for(lambda: emu.jobs() == [], "the finished Job deleted by the daemon", DEADLINE)
    finally:
        d.stop()
    assert "blue" in fake.tool_results()["ask1"]
    [job] = job_creates(emu)  # one answer, one Job
    assert kubelet.pods[job].uid == owner.uid and kubelet.error is None
    for p in [ws / ".delta", *(ws / ".delta").rglob("*")]:
        assert os.lstat(p).st_uid == owner.uid, p  # the run's files are the owner's


def stub_world(base: Path, owner: User, name: str) -> tuple[Path, Path, Path]:
    """(root, workspace, the stub's record file) for a stand-in client run as `owner`."""
    root = base / "root"
    ws = root / name
    paused_workspace(ws)
    chown_tree(ws, owner)
    rec_dir = base / "records"
    rec_dir.mkdir()
    os.chown(rec_dir, owner.uid, owner.gid)
    return root, ws, rec_dir / "resumes.jsonl"


def test_a_daemon_killed_while_its_job_runs_adopts_the_job_by_label_and_reads_its_exit(
    base: Path, owner: User, emu: Emulator, kubelet: Kubelet
) -> None:
    root, ws, record = stub_world(base, owner, "held")
    d = kube_daemon(base, emu, root, resume_command=stub_command(record, "hold"))
    d.start()
    try:
        answer(ws, "held answer")
        [job] = wait_for(lambda: job_creates(emu), "the Job", DEADLINE)
        wait_for(lambda: kubelet.running(job), "the Job's process running", DEADLINE)
        d.signal(signal.SIGKILL)
        assert d.proc is not None
        d.proc.wait(DEADLINE)
        d._log.close()
        assert kubelet.running(job)  # the Job outlives the daemon

        d.start()
        [adopted] = d.wait_event("resume_adopted", workspace=str(ws), timeout=DEADLINE)
        assert adopted["job"] and "pid" not in adopted
        go = record.with_name(record.name + ".go")
        go.touch()  # release the held client: its Job ends with exit 0
        os.chown(go, owner.uid, owner.gid)
        [exited] = d.wait_event("resume_exited", workspace=str(ws), timeout=DEADLINE)
        assert exited["exit_code"] == 0 and exited["outcome"] == "completed"
        assert metadata_status(ws) == "COMPLETED"
        wait_for(lambda: emu.jobs() == [], "the adopted Job deleted once read", DEADLINE)
    finally:
        d.stop()
    assert job_creates(emu) == [job]  # adopted, never submitted again
    assert [r["answer"] for r in records(record)] == ["held answer"]


def test_a_resume_past_its_timeout_has_its_job_deleted_with_a_grace_period(
    base: Path, owner: User, emu: Emulator, kubelet: Kubelet
) -> None:
    root, ws, record = stub_world(base, owner, "hangs")
    d = kube_daemon(
        base, emu, root, resume_command=stub_command(record, "hang"), resume_timeout_seconds=1
    )
    d.start()
    try:
        answer(ws, "an answer")
        [job] = wait_for(lambda: job_creates(emu), "the Job", DEADLINE)
        d.wait_event("resume_timeout", workspace=str(ws), timeout=DEADLINE)
        d.wait_event("kubernetes_job_cancelled", job=job, timeout=DEADLINE)
        [exited] = d.wait_event("resume_exited", workspace=str(ws), timeout=DEADLINE)
        assert exited["timed_out"] is True
        # The client ended on the TERM, well inside the grace (whether it had ingested the
        # answer by then or not: the timeout counts from the pod's start).
        wait_for(lambda: kubelet.pods[job].ended is not None, "the Job's process ended", DEADLINE)
    finally:
        d.stop()
    # The cancel (sent again if the server did not take it at once, under load): every delete
    # of the Job is the cancel's, with the grace and the pods first.
    deletes = [
        dict(r.params)
        for r in list(emu.handler)
        if r.method.name == "DELETE" and r.url.path.endswith(f"/jobs/{job}")
    ]
    assert deletes and all(
        d == {"gracePeriodSeconds": "10", "propagationPolicy": "Foreground"} for d in deletes
    ), deletes
    assert kubelet.graces[job] == 10
    assert kubelet.pods[job].ended == -signal.SIGTERM


def run_elsewhere_status(ws: Path) -> tuple[str, str | None]:
    """(status, owner's host) of the workspace's latest run."""
    from deltad.protocol import Workspace, load_metadata

    w = Workspace.at(ws)
    run_id = w.latest_run_id()
    assert run_id
    meta = load_metadata(w.run(run_id).metadata)
    return str(meta.status), meta.owner.hostname if meta.owner else None


def test_a_run_on_another_host_whose_job_ends_under_it_is_interrupted_and_resumed(
    base: Path, owner: User, emu: Emulator, kubelet: Kubelet
) -> None:
    """The run says RUNNING on another host (the pod's node), so this host's /proc cannot judge
    it: its Job can. The client killed with SIGKILL in its pod, or the Job deleted by hand →
    INTERRUPTED (one logged transition naming the Job), resumed by a new Job; the run asks
    again, and a later answer resumes it to the end."""
    root, killed, record = stub_world(base, owner, "killed")
    deleted = root / "deleted"
    paused_workspace(deleted)
    chown_tree(deleted, owner)
    d = kube_daemon(
        base,
        emu,
        root,
        resume_command=stub_command(record, "elsewhere"),
        auto_resume_interrupted=True,
        liveness_sweep_seconds=0.5,  # the deleted Job's client still holds the lock at first
    )
    d.start()
    try:
        for ws in (killed, deleted):
            answer(ws, f"answer {ws.name}")
            claimed = lambda w=ws: run_elsewhere_status(w) == ("RUNNING", ELSEWHERE_HOST)  # noqa: E731
            wait_for(claimed, "RUNNING elsewhere", DEADLINE)
            [job] = [j for j in job_creates(emu) if kubelet.running(j)]
            if ws == killed:
                os.killpg(kubelet.pods[job].proc.pid, signal.SIGKILL)
            else:
                emu.batch.delete_namespaced_job(job, "default")  # kubectl delete job
            # INTERRUPTED, resumable: resumed, the run asks again; the later answer resumes it.
            asks = lambda w=ws: metadata_status(w) == "WAITING_FOR_INPUT"  # noqa: E731
            wait_for(asks, f"{ws.name}: INTERRUPTED, resumed, asking again", DEADLINE)
            answer(ws, f"later answer {ws.name}")
            done = lambda w=ws: metadata_status(w) == "COMPLETED"  # noqa: E731
            wait_for(done, f"{ws.name}: the later answer resumed", DEADLINE)
    finally:
        d.stop()
    marks = [e for e in d.events("status_transition", to="INTERRUPTED") if e["from"] == "RUNNING"]
    assert {e["workspace"] for e in marks} == {str(killed), str(deleted)} and len(marks) == 2
    reasons = {e["workspace"]: e["reason"] for e in marks}
    assert "ended: killed_by_SIGKILL" in reasons[str(killed)]
    assert "ended: unknown" in reasons[str(deleted)]  # gone: no pod said how it ended
    assert all(
        f"on {ELSEWHERE_HOST} stopped without finishing: job deltad-" in r for r in reasons.values()
    )
    resumed = [r["workspace"] for r in records(record) if "resumed" in r]
    assert sorted(resumed) == sorted([str(killed), str(deleted)])
    # each: the Job that ended under the run, the resume of the INTERRUPTED run, the later answer's
    assert len(job_creates(emu)) == 6


def test_an_unreachable_api_server_leaves_a_run_on_another_host_alone_and_says_so_once(
    base: Path,
) -> None:
    from deltad.protocol import Workspace, current_owner, load_metadata, transition
    from deltad.protocol.states import RunStatus

    with emulator(base) as emu:
        pass  # the server is gone now: its kubeconfig names a closed port
    root = base / "root"
    ws = root / "ws"
    run_id = paused_workspace(ws)
    path = Workspace.at(ws).run(run_id).metadata
    elsewhere = current_owner().model_copy(update={"hostname": ELSEWHERE_HOST})
    transition(path, load_metadata(path), RunStatus.RUNNING, owner=elsewhere)
    d = kube_daemon(base, emu, root, rescan_interval_seconds=0.5)
    d.start()
    try:
        [failed] = d.wait_event("resume_adopt_failed", timeout=DEADLINE)
        assert "cannot list this daemon's jobs" in failed["error"]
        d.wait_event("reconcile_full_started", count=3, reason="periodic", timeout=DEADLINE)
        [unknown] = d.events("run_elsewhere_unknown")  # once, however often it is looked at
        assert unknown["workspace"] == str(ws) and unknown["host"] == ELSEWHERE_HOST
        assert metadata_status(ws) == "RUNNING"  # nothing is decided without the engine
    finally:
        d.stop()


def at(event: dict[str, Any]) -> float:
    """A log line's time (wall clock, as `time.time()`)."""
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def test_answers_written_while_the_api_server_is_down_are_each_resumed_once_when_it_is_back(
    base: Path, owner: User, emu: Emulator, kubelet: Kubelet, record_property: Any
) -> None:
    """The API server stopped (every connection reset, each new one too) while answers arrive:
    the daemon goes on taking them, its submits wait in the executor's worker, and when the
    server is back the watch says so and each is submitted and resumed, once."""
    root, first, record = stub_world(base, owner, "ws0")
    spaces = [first]
    for n in (1, 2):
        ws = root / f"ws{n}"
        paused_workspace(ws)
        chown_tree(ws, owner)
        spaces.append(ws)
    proxy = HangingProxy(emu, base)
    d = kube_daemon(
        base,
        emu,
        root,
        proxy.kubeconfig,
        resume_command=stub_command(record),
        max_parallel_resumes_per_owner=len(spaces),  # none waits for another's slot
        http={"listen": "127.0.0.1:0"},
    )
    d.start()
    try:
        d.wait_event("kubernetes_jobs_listed", reason="start", timeout=DEADLINE)
        wait_for(lambda: emu.handler.streams == 1, "the daemon's watch open", DEADLINE)
        with proxy.down():
            d.wait_event("kubernetes_watch_failed", timeout=DEADLINE)
            for ws in spaces:
                answer(ws, f"answer {ws.name}")
            d.wait_event("resume_queued", count=len(spaces), timeout=DEADLINE)
            d.wait_event("executor_engine_failed", op="query", timeout=DEADLINE)
            assert job_creates(emu) == []  # nothing reached the server
        back = time.time()
        wait_for(lambda: len(records(record)) >= len(spaces), "every answer resumed", DEADLINE)
        for ws in spaces:
            wait_for(lambda w=ws: metadata_status(w) == "COMPLETED", "completed", DEADLINE)
        # What an operator sees: the watch's restarts and failures, counted in /metrics.
        with client(http_url(d), make_token(d.state_dir, "prom", role="metrics")) as http:
            text = http.get("/metrics").text
        counted = {
            s.labels["event"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "deltad_executor_engine_events_total"
        }
        assert counted["failures"] >= 1 and counted["watch_restarts"] >= 1, counted
        assert counted["lists"] == 1 + counted["relists"]
    finally:
        d.stop()
        proxy.close()
    resumed = records(record)
    made = [at(e) for e in d.events("kubernetes_job_submitted")]
    took = max(made) - back, max(r["t"] for r in resumed) - back
    record_property("submitted_after_back_seconds", round(took[0], 3))
    record_property("resumed_after_back_seconds", round(took[1], 3))
    print(
        "answers written during the outage, after the server was back: every Job made in "
        f"{took[0]:.2f} s, every resume running in {took[1]:.2f} s"
    )
    assert sorted(r["answer"] for r in resumed) == sorted(f"answer {ws.name}" for ws in spaces)
    assert sorted(job_creates(emu)) == sorted(set(job_creates(emu)))  # one Job per answer
    assert (
        d.events("resume_refused") == []
        and d.events("reconcile_full_started", reason="periodic") == []
    )
