"""The daemon's loop (`Service.turn`) under a ManualClock with a recording resume queue: real
workspaces on disk, no processes. What `decide` returns is carried out: resumes queued, a failed
resume paced, its timer bringing the workspace back once the clock has moved."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.clock import ManualClock
from deltad.core.config import DaemonConfig, load_config
from deltad.core.resumer import Finished, InFlight, Resumer
from deltad.core.service import Service
from deltad.core.tenancy import Launch
from deltad.executors.seam import Handle, RequestKey
from deltad.testing.stub import paused_workspace
from deltad.watch.hints import Why


class ScriptedResumer(Resumer):
    """Records what the loop queues; `exit` makes the next `reap` report that resume's end."""

    def __init__(self, config: DaemonConfig) -> None:
        super().__init__(config)
        self.resumed: list[Path] = []
        self.requests: list[str] = []
        self._exits: list[Finished] = []

    def submit(
        self,
        ws: Path,
        run_id: str | None,
        launch: Launch,
        owner: int,
        request: str = "resume",
        answered_at: float | None = None,
    ) -> bool:
        self.resumed.append(ws)
        self.requests.append(request)
        return True

    def exit(self, ws: Path, rc: int) -> None:
        handle = Handle(RequestKey(ws, "", "resume"), "scripted", "1")
        self._exits.append(Finished(InFlight(handle, 0.0), rc, 1))

    def reap(self) -> list[Finished]:
        done, self._exits = self._exits, []
        return done


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    monkeypatch.delenv("DELTAD_CONFIG", raising=False)
    config = load_config(None, (str(tmp_path / "root"),))
    config.state_dir = tmp_path / "state"
    config.state_dir.mkdir()
    config.executor = "fresh"  # not a fork server (a Python start): no resume is started here
    clock = ManualClock(wall=__import__("time").time())
    svc = Service(config, None, (), clock=clock, resumer=ScriptedResumer(config))
    svc.life.build_backends()
    svc.ticks.start(clock.monotonic(), config)  # periodic sweeps are not what is tested here
    yield svc
    svc.life.close_backends()


def _answer(ws: Path) -> None:
    p = ws / ".delta" / "interaction" / "response.txt"
    p.with_name(".tmp").write_text("yes")
    os.replace(p.with_name(".tmp"), p)


@pytest.mark.linux_only  # leases, /proc or the fork server (deltad/platform.py)
def test_a_failed_resume_is_paced_and_its_timer_brings_it_back(service: Service) -> None:
    resumer = service.resumer
    assert isinstance(resumer, ScriptedResumer) and isinstance(service.clock, ManualClock)
    ws = service.config.roots[0].path / "ws"
    paused_workspace(ws)
    _answer(ws)
    service.queue.put(ws, Why.ANSWER_CLOSED)
    service.turn()
    assert resumer.resumed == [ws]
    asked = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    assert resumer.requests == [asked["request_id"]]  # the job's key names what is answered

    resumer.exit(ws, 1)  # it failed and the same answer is still there
    service.turn()
    assert service.memory[ws].failures == 1
    delay = service.config.backoff_initial_seconds
    assert service.timers.next_due() == service.clock.monotonic() + delay

    service.queue.put(ws, Why.ANSWER_CLOSED)  # another look before the backoff ends
    service.turn()
    assert resumer.resumed == [ws]

    service.clock.advance(delay)
    service.turn()  # the timer fires: the workspace is queued ...
    service.turn()  # ... and looked at
    assert resumer.resumed == [ws, ws]


def test_a_dropped_workspace_is_forgotten_whole(service: Service) -> None:
    resumer = service.resumer
    assert isinstance(resumer, ScriptedResumer)
    ws = service.config.roots[0].path / "ws"
    paused_workspace(ws)
    _answer(ws)
    service.queue.put(ws, Why.ANSWER_CLOSED)
    service.turn()
    resumer.exit(ws, 1)
    service.turn()
    assert ws in service.memory
    for p in sorted(ws.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() else p.rmdir()
    ws.rmdir()
    service.queue.put(ws)
    service.turn()
    assert ws not in service.memory and ws not in service.registry


def _running_elsewhere(ws: Path) -> Path:
    """The workspace's run says RUNNING, owned by a process on another host; its metadata."""
    from deltad.protocol import Workspace, current_owner, load_metadata, transition
    from deltad.protocol.states import RunStatus

    run_id = paused_workspace(ws)
    path = Workspace.at(ws).run(run_id).metadata
    owner = current_owner().model_copy(update={"hostname": "node-b.invalid", "pid": 4242})
    transition(path, load_metadata(path), RunStatus.RUNNING, owner=owner)
    return path


def test_a_job_that_ended_under_a_run_elsewhere_gets_it_marked(service: Service) -> None:
    """The loop's wiring of the rule (decide, runfacts): a job's end reaches `decide` as a
    job's, and the mark is written under the lock with the job in its reason."""
    from deltad.protocol import load_metadata

    resumer = service.resumer
    assert isinstance(resumer, ScriptedResumer)
    ws = service.config.roots[0].path / "ws"
    meta = _running_elsewhere(ws)
    run_id = load_metadata(meta).run_id
    service.queue.put(ws)
    service.turn()
    assert load_metadata(meta).status == "RUNNING"  # no job known for it: left alone

    key = RequestKey(ws, run_id, "resume", 1)
    resumer._exits.append(Finished(InFlight(Handle(key, "fakejobs", "77"), 0.0), -9, 1))
    service.turn()
    after = load_metadata(meta)
    assert after.status == "INTERRUPTED"
    assert after.error == (
        f"process 4242 on node-b.invalid stopped without finishing: job {key.name} (77) "
        "ended: killed_by_SIGKILL"
    )
