"""The feed's state-dir records (deltad/inbox/feedlog.py): the event log replays across a
restart and says when it cannot; a question is announced once per workspace, restarts
included. A "restart" here is a new Feed attached to the same state dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deltad.inbox import feedlog
from deltad.inbox.feed import Feed, View
from deltad.inbox.feedlog import EVENTS_FILE, FEED_DIR


def waiting(ws: str, rid: str) -> View:
    return View(Path(ws), "waiting", "r1", "WAITING_FOR_INPUT", rid)


def started(state: Path, buffer: int = 10) -> tuple[Feed, list[str]]:
    feed = Feed(buffer=buffer)
    said: list[str] = []
    feed.subscribe(lambda e: said.append(f"{e.type} {e.workspace} {e.data.get('request_id')}"))
    feed.attach(state)
    return feed, said


def prime(feed: Feed, *views: View) -> None:
    feed.priming = True
    for view in views:
        feed.changed(view.workspace, None, view)
    feed.priming = False


def test_events_replay_across_a_restart_with_ids_that_keep_growing(tmp_path: Path) -> None:
    feed, _ = started(tmp_path)
    mark = feed.last_id()
    feed.changed(Path("/a"), None, waiting("/a", "q1"))
    ids = [e.id for e in feed.since(mark)]
    feed.close()
    again, _ = started(tmp_path)
    assert [e.id for e in again.since(mark)] == ids
    assert not again.gap(mark)
    assert again.since(mark)[0].data["request_id"] == "q1"
    new = again.publish("run.status", {"workspace": "/a", "from": None, "to": "RUNNING"})
    assert new.id > ids[-1]


def test_a_last_event_id_older_than_what_is_kept_is_a_gap(tmp_path: Path) -> None:
    feed, _ = started(tmp_path, buffer=3)
    first = feed.publish("run.status", {"workspace": "/a", "to": "RUNNING"}).id
    for _ in range(10):
        feed.publish("run.status", {"workspace": "/a", "to": "RUNNING"})
    assert feed.gap(first) and not feed.gap(feed.last_id() - 1)
    feed.close()
    lines = (tmp_path / FEED_DIR / EVENTS_FILE).read_text().splitlines()
    assert len(lines) <= 2 * 3 + 1  # bounded: compacted at twice the cap
    again, _ = started(tmp_path, buffer=3)
    assert again.gap(first) and len(again.since(first)) == 3
    assert not again.gap(again.last_id() - 1)


def test_without_a_log_anything_from_before_the_start_is_a_gap() -> None:
    feed = Feed()
    assert feed.gap(feed.last_id() - 5) and not feed.gap(feed.last_id()) and not feed.gap(None)


def test_a_question_written_while_down_is_announced_once_after_the_restart(
    tmp_path: Path,
) -> None:
    feed, said = started(tmp_path)
    prime(feed, waiting("/a", "q1"))  # the first start: what is there counts as announced
    assert said == []
    feed.changed(Path("/a"), waiting("/a", "q1"), waiting("/a", "q1"))
    feed.close()
    # down: /b gets a question, /a's is the same one
    again, said = started(tmp_path)
    prime(again, waiting("/a", "q1"), waiting("/b", "q7"))
    assert said == ["request.created /b q7"]
    again.close()
    third, said = started(tmp_path)
    prime(third, waiting("/a", "q1"), waiting("/b", "q7"))
    assert said == []  # announced already: never again


def test_announced_is_keyed_by_workspace(tmp_path: Path) -> None:
    feed, said = started(tmp_path)
    prime(feed)
    feed.changed(Path("/a"), None, waiting("/a", "q1"))
    assert said[0] == "request.created /a q1"
    feed.close()
    again, said = started(tmp_path)
    prime(again, waiting("/a", "q1"), waiting("/evil", "q1"))  # a copied request id
    assert said == ["request.created /evil q1"]


def test_a_question_closed_while_down_is_forgotten_and_a_new_one_announced(
    tmp_path: Path,
) -> None:
    feed, said = started(tmp_path)
    prime(feed)
    feed.changed(Path("/a"), None, waiting("/a", "q1"))
    feed.close()
    again, said = started(tmp_path)
    prime(again, View(Path("/a"), "done", "r1", "COMPLETED"))
    again.close()
    third, said = started(tmp_path)
    prime(third, waiting("/a", "q1"))  # the same id again (a new run copied it): new here
    assert said == ["request.created /a q1"]


def test_an_answer_seen_live_closes_the_record(tmp_path: Path) -> None:
    feed, said = started(tmp_path)
    prime(feed)
    feed.changed(Path("/a"), None, waiting("/a", "q1"))
    answered = View(Path("/a"), "answered", "r1", "WAITING_FOR_INPUT", "q1")
    feed.changed(Path("/a"), waiting("/a", "q1"), answered)
    feed.close()
    again, said = started(tmp_path)
    prime(again, waiting("/a", "q1"))  # asked again after its answer: a new announcement
    assert said == ["request.created /a q1"]


def test_a_workspace_only_just_found_keeps_its_record(tmp_path: Path) -> None:
    feed, said = started(tmp_path)
    prime(feed)
    feed.changed(Path("/a"), None, waiting("/a", "q1"))
    feed.close()
    again, said = started(tmp_path)
    prime(again, View(Path("/a"), "idle"))  # the startup walk's placeholder, read later
    again.priming = True
    again.changed(Path("/a"), View(Path("/a"), "idle"), waiting("/a", "q1"))
    assert said == []


def test_an_event_is_fsynced_at_the_end_of_the_turn_not_as_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer's event is written as the loop looks, before the resume starts; its fsync
    waits for `sync_due` at the turn's end (feedlog.py), and is not skipped there."""
    feed, _ = started(tmp_path)
    log_file = tmp_path / FEED_DIR / EVENTS_FILE
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.samefile(f"/proc/self/fd/{fd}", log_file):
            synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(feedlog.os, "fsync", fsync)
    monkeypatch.setattr(feedlog, "SYNC_SECONDS", 0.0)  # every turn is due
    feed.changed(Path("/a"), None, waiting("/a", "q1"))
    assert b'"q1"' in log_file.read_bytes() and synced == []  # written, not yet fsynced
    feed.sync_due()
    assert len(synced) == 1
    feed.sync_due()  # nothing new: no fsync
    assert len(synced) == 1
    feed.close()
