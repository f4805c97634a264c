"""Escalation to PagerDuty end to end: a real `deltad serve --listen` whose question nobody
answered escalates, and its inbox process sends the Events API v2 `trigger` to a stand-in on
127.0.0.1 that answers as PagerDuty documents (tests/support/pagerduty.py): throttled first
(429, retried), then accepted (202). The answer closes the question, and the alert is resolved
with the same dedup key. A question answered before its escalation pages nobody. Nothing leaves
127.0.0.1, and no file the daemon or the inbox writes holds the integration key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.outbound.pagerduty import dedup_key
from deltad.protocol.followup import FollowUp
from deltad.protocol.printable import show_path
from deltad.testing.stub import paused_workspace
from tests.support.daemon import Daemon, answer, wait_for
from tests.support.pagerduty import EventsApi

ROUTING_KEY = "R0UT1NGKEYOFTHETEST0123456789abc"  # 32 characters, as PagerDuty's
# Follow-ups a second apart: the daemon's floor lowered (60 s by default) for the test's sake.
FAST = {"min_interval_seconds": 1, "max_per_hour": 60}


@pytest.fixture
def pagerduty() -> Iterator[EventsApi]:
    with EventsApi(throttle=1) as api:
        yield api


def _daemon(tmp: Path, api: EventsApi) -> Daemon:
    (tmp / "root").mkdir(parents=True)
    key = tmp / "routing-key"
    key.write_text(ROUTING_KEY + "\n")
    key.chmod(0o600)
    channel = {
        "routing_key": {"secret_file": str(key)},
        "events_url": api.url,
        "severity": "error",
        "source": "deltad-e2e",
        "outbox": {"backoff_seconds": 0.2, "backoff_max_seconds": 0.5},
    }
    return Daemon(
        tmp,
        [tmp / "root"],
        http={"listen": "127.0.0.1:0"},
        channels={"pagerduty": channel},
        follow_up_limits=FAST,
    )


def test_an_escalated_question_pages_once_and_its_answer_resolves_the_alert(
    tmp_path: Path, pagerduty: EventsApi
) -> None:
    d = _daemon(tmp_path, pagerduty).start()
    try:
        ws = tmp_path / "root" / "ws"
        soon = FollowUp(escalate_after_seconds=1, escalate_to=["oncall"])
        paused_workspace(ws, "Roll back the release?", follow_up=soon)
        quick = tmp_path / "root" / "quick"
        later = FollowUp(escalate_after_seconds=30, escalate_to=["oncall"])
        paused_workspace(quick, "Answered in time", follow_up=later)
        quick_rid = _request_id(quick)
        answer(quick, "yes")  # closed long before its escalation: nobody is paged for it
        d.wait_resumed(quick)

        key = dedup_key(show_path(str(ws)), _request_id(ws))
        [trigger] = wait_for(
            lambda: [e for e in pagerduty.accepted() if e["event_action"] == "trigger"] or None,
            "the escalation's trigger accepted by PagerDuty",
        )
        # The first attempt was throttled (429) and retried: the same event, accepted.
        assert [status for status, _ in pagerduty.calls[:2]] == [429, 202]
        assert pagerduty.calls[0][1] == trigger
        assert trigger["routing_key"] == ROUTING_KEY and trigger["dedup_key"] == key
        payload = trigger["payload"]
        assert payload["summary"] == "Unanswered: Roll back the release?"
        assert (payload["severity"], payload["source"]) == ("error", "deltad-e2e")
        assert payload["custom_details"]["escalated_to"] == ["oncall"]
        assert pagerduty.alerts[key].status == "triggered"

        answer(ws, "yes")
        d.wait_resumed(ws)
        wait_for(lambda: pagerduty.alerts[key].status == "resolved", "the alert resolved")
        resolves = [e for e in pagerduty.accepted() if e["event_action"] == "resolve"]
        assert [e["dedup_key"] for e in resolves] == [key]  # once, for the question that paged
        quick_key = dedup_key(show_path(str(quick)), quick_rid)
        assert quick_key not in pagerduty.alerts
        # The integration key is handed to the inbox at connect, never written down.
        for f in tmp_path.rglob("*"):
            if f.is_file() and f.name != "routing-key":
                assert ROUTING_KEY.encode() not in f.read_bytes(), f
    finally:
        d.stop()
        d.kill_children()


def _request_id(ws: Path) -> str:
    doc = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    return str(doc["request_id"])
