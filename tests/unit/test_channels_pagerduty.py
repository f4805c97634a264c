"""The PagerDuty channel's rules (deltad/outbound/pagerduty.py) and its sender's reading of the
Events API's answers (deltad/outbound/senders.py), the API driven by a function through httpx's
transport seam. End to end against a stand-in: tests/e2e/test_pagerduty_channel.py."""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from deltad import wire
from deltad.outbound.base import Closed, Context, Question
from deltad.outbound.config import PagerDutyConfig
from deltad.outbound.courier import new_message
from deltad.outbound.outbox import Delivery
from deltad.outbound.pagerduty import SWEEP_EVERY, PagerDutyChannel, dedup_key
from deltad.outbound.senders import PagerDutySender, SenderError
from deltad.protocol import InteractionRequest, Mailbox, Workspace
from deltad.testing.stub import paused_workspace
from tests.support.pagerduty import problems

KEY = "0123456789abcdef0123456789abcdef"


def _question(ws: str = "/srv/ws/a", rid: str = "req_1", **more: Any) -> Question:
    r = InteractionRequest(
        prompt="Roll back?",
        run_id="20260101_000000_abcdef",
        action_id="act_1",
        request_id=rid,
        timestamp=datetime(2026, 1, 1, tzinfo=UTC),
    )
    return Question(Path(ws), r, task="ship it", **more)


def _channel(tmp: Path, page: bool = True) -> tuple[PagerDutyChannel, list[Delivery]]:
    handed: list[Delivery] = []
    config = PagerDutyConfig.model_validate(
        {"routing_key": {"secret_env": "UNUSED"}, "source": "host-1", "severity": "critical"}
    )
    ctx = Context(
        tmp / "pd",
        answer=lambda *a, **k: None,
        hand=handed.append,
        page=(lambda rid: f"https://inbox.example/#request={rid}") if page else None,
    )
    return PagerDutyChannel(config, ctx), handed


def test_only_an_escalation_pages_once_and_its_closing_resolves_it(tmp_path: Path) -> None:
    pd, handed = _channel(tmp_path)
    pd.send(_question())  # the first asking: the other channels'
    pd.send(_question(follow_up="reminder"))
    assert handed == []
    pd.send(_question(follow_up="escalation", only=("group:oncall",)))
    pd.send(_question(follow_up="escalation", only=("group:oncall",)))  # told again: once
    [trigger] = handed
    event = json.loads(trigger.body)
    assert "routing_key" not in event  # the sender adds it: no outbox file holds it
    assert problems({**event, "routing_key": KEY}) == []  # valid as PagerDuty reads it
    assert event["dedup_key"] == dedup_key("/srv/ws/a", "req_1")
    assert event["payload"]["summary"] == "Unanswered: Roll back?"
    assert (event["payload"]["source"], event["payload"]["severity"]) == ("host-1", "critical")
    assert event["payload"]["custom_details"]["escalated_to"] == ["group:oncall"]
    assert event["links"] == [
        {"href": "https://inbox.example/#request=req_1", "text": "Answer it on the inbox page"}
    ]
    pd.withdraw(Closed(Path("/srv/ws/b"), "req_1", "answered"))  # another workspace's
    assert len(handed) == 1
    pd.withdraw(Closed(Path("/srv/ws/a"), "req_1", "answered"))
    pd.withdraw(Closed(Path("/srv/ws/a"), "req_1", "answered"))  # told again: once
    assert [json.loads(d.body) for d in handed[1:]] == [
        {"event_action": "resolve", "dedup_key": event["dedup_key"]}
    ]


def test_a_long_prompt_is_cut_to_pagerdutys_limit_and_keys_differ_by_workspace() -> None:
    assert dedup_key("/srv/a", "req_1") != dedup_key("/srv/b", "req_1")
    assert len(dedup_key("/srv/a", "req_1")) <= 255
    long = _question(follow_up="escalation")
    r = long.request.model_copy(update={"prompt": "x" * 5000})
    from deltad.outbound.pagerduty import trigger

    event = trigger(Question(long.workspace, r, follow_up="escalation"), "h", "info", None)
    assert len(event["payload"]["summary"]) == 1024 and "links" not in event


def _target(**settings: Any) -> wire.ChannelTarget:
    return wire.ChannelTarget(
        name="pagerduty",
        key="pagerduty",
        kind="pagerduty",
        settings={"events_url": "https://events.example/v2/enqueue", "timeout_seconds": 5.0}
        | settings,
        secret=KEY,
        max_attempts=3,
        backoff_seconds=1.0,
        backoff_max_seconds=5.0,
        max_age_seconds=60.0,
        outbox_max=10,
    )


@pytest.mark.parametrize(
    ("status", "sent", "permanent"),
    [
        (202, True, False),  # accepted
        (400, False, True),  # not a valid event: a retry cannot mend it
        (404, False, True),
        (429, False, False),  # throttled: retried later
        (500, False, False),
        (503, False, False),
    ],
)
def test_the_events_apis_answers_as_pagerduty_documents_them(
    status: int, sent: bool, permanent: bool
) -> None:
    seen: list[dict[str, Any]] = []

    def api(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(status, stream=httpx.ByteStream(b'{"status": "whatever"}'))

    send = PagerDutySender(_target(), httpx.Client(transport=httpx.MockTransport(api)))
    body = json.dumps({"event_action": "resolve", "dedup_key": "deltad-1"})
    failed = send(new_message("resolve", "resolve", body, 0))
    assert seen == [{"event_action": "resolve", "dedup_key": "deltad-1", "routing_key": KEY}]
    assert (failed is None) == sent
    assert failed is None or failed.permanent == permanent


def test_a_sender_without_its_key_or_settings_is_one_line() -> None:
    with pytest.raises(SenderError, match="no routing key"):
        PagerDutySender(_target().model_copy(update={"secret": None}))
    with pytest.raises(SenderError, match="the PagerDuty settings"):
        PagerDutySender(_target().model_copy(update={"settings": {}}))


def _paged(tmp: Path, ws: Path) -> str:
    """An alert paged for `ws`'s open question (as on disk); the alert's dedup key."""
    paused_workspace(ws, "Roll back?")
    request = Mailbox(Workspace(ws)).read_request()
    assert request is not None
    pd, handed = _channel(tmp)
    pd.send(Question(ws, request, task="t", follow_up="escalation"))
    assert len(handed) == 1
    return dedup_key(str(ws), request.request_id)


def test_an_alert_whose_question_is_gone_from_disk_is_resolved_by_a_sweep(tmp_path: Path) -> None:
    open_ws, gone_ws, answered_ws = (tmp_path / n for n in ("open", "gone", "answered"))
    keys = {ws: _paged(tmp_path, ws) for ws in (open_ws, gone_ws, answered_ws)}
    # A record from before records kept the path: left to its question's close.
    (tmp_path / "pd" / "paged" / "deltad-old").write_text('{"workspace": "/x", "request_id": "r"}')
    shutil.rmtree(gone_ws)  # removed while paged: no event will say so
    (answered_ws / ".delta" / "interaction" / "request.json").unlink()
    pd, handed = _channel(tmp_path)
    pd.start()  # a restart sweeps at once
    events = [json.loads(d.body) for d in handed]
    assert sorted(e["dedup_key"] for e in events) == sorted([keys[gone_ws], keys[answered_ws]])
    assert {e["event_action"] for e in events} == {"resolve"}
    left = sorted(p.name for p in (tmp_path / "pd" / "paged").iterdir())
    assert left == sorted(["deltad-old", keys[open_ws]])  # the open question still pages
    assert pd.sweep(time.time()) == 0  # at most hourly
    shutil.rmtree(open_ws)
    assert pd.sweep(time.time() + SWEEP_EVERY) == 1
    assert json.loads(handed[-1].body)["dedup_key"] == keys[open_ws]
