"""The channels' hub: the feed's events reach every channel on a thread beside the loop; a
channel that fails never keeps another from hearing; quiet roots are never asked about."""

from __future__ import annotations

from pathlib import Path

from deltad.inbox.feed import Feed
from deltad.outbound.base import Channel, Closed, Question
from deltad.outbound.hub import Hub
from deltad.outbound.intake import Intake
from deltad.protocol import Mailbox, Workspace
from deltad.testing.stub import paused_workspace

from ..conftest import wait_for


class Recorder(Channel):
    name = "recorder"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.heard: list[Question | Closed] = []
        self.started = self.stopped = False

    def send(self, question: Question) -> None:
        self.heard.append(question)
        if self.fail:
            raise RuntimeError("down")

    def withdraw(self, closed: Closed) -> None:
        self.heard.append(closed)

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True


def test_every_channel_hears_every_question_and_its_end(tmp_path: Path) -> None:
    ws, quiet = tmp_path / "root" / "ws", tmp_path / "quiet" / "ws"
    run_id = paused_workspace(ws, prompt="Ship it?")
    paused_workspace(quiet)
    req = Mailbox(Workspace.at(ws)).read_request()
    assert req is not None
    feed = Feed()
    broken, fine = Recorder(fail=True), Recorder()
    hub = Hub([broken, fine], [tmp_path / "quiet"])
    intake = Intake(feed, [hub])
    hub.start()
    intake.start()
    try:
        base = {"run_id": run_id, "request_id": req.request_id}
        feed.publish("request.created", {"workspace": str(quiet), **base})
        feed.publish("request.created", {"workspace": str(ws), **base})
        feed.publish("run.status", {"workspace": str(ws), "run_id": run_id, "to": "RUNNING"})
        feed.publish("request.answered", {"workspace": str(ws), **base})
        feed.publish("request.expired", {"workspace": str(ws), **base})
        wait_for(lambda: len(fine.heard) == 3, "three events")
    finally:
        intake.stop()
        hub.stop()
    assert broken.started and broken.stopped and len(broken.heard) == 3
    question, answered, expired = fine.heard
    assert isinstance(question, Question) and question.workspace == ws
    assert question.request.prompt == "Ship it?" and question.task == "benchmark task"
    # The journal has no answer yet: who answered is not known, not guessed.
    assert answered == Closed(ws, req.request_id, "answered", None, None)
    assert expired == Closed(ws, req.request_id, "expired")


def test_a_reminder_asks_again_and_an_escalation_asks_whom_it_adds(tmp_path: Path) -> None:
    ws = tmp_path / "root" / "ws"
    run_id = paused_workspace(ws, prompt="Ship it?", respondents=["alice"])
    req = Mailbox(Workspace.at(ws)).read_request()
    assert req is not None
    feed = Feed()
    heard = Recorder()
    hub = Hub([heard], [])
    intake = Intake(feed, [hub])
    hub.start()
    intake.start()
    try:
        base = {"workspace": str(ws), "run_id": run_id, "request_id": req.request_id}
        feed.publish("request.reminder", {**base, "reminder": 1})
        feed.publish("request.escalated", {**base, "escalated_to": ["bob", "group:ops"]})
        wait_for(lambda: len(heard.heard) == 2, "two events")
    finally:
        intake.stop()
        hub.stop()
    again, up = heard.heard
    assert isinstance(again, Question) and (again.follow_up, again.only) == ("reminder", ())
    assert isinstance(up, Question) and up.follow_up == "escalation"
    assert up.only == ("bob", "group:ops") and up.request.request_id == req.request_id
