"""Reminders and escalation (deltad/core/followup.py): the rule from a table, the rule as
`decide` applies it, the state-dir record across a reload, and the settings' one-line errors."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from deltad.core.config import DaemonConfig
from deltad.core.decide import FRESH, FollowUpDue, Now, Rules, Schedule, decide
from deltad.core.decide import Facts as DecideFacts
from deltad.core.facts import Action, Done, State, Verdict
from deltad.core.followplan import Plan, Step, after, next_step
from deltad.core.followup import Store
from deltad.pacing import Pacing
from deltad.protocol.followup import FollowUp, from_args

T0 = 1_800_000_000.0  # when the question was asked
REMIND = Plan(remind_after=60.0, max_reminders=2)
ESCALATE = Plan(escalate_after=300.0, escalate_to=("boss",))
HOURLY = Plan(remind_after=60.0, max_reminders=20, per_hour=3)
BOTH = Plan(remind_after=60.0, max_reminders=3, escalate_after=100.0, escalate_to=("boss",))


@pytest.mark.parametrize(
    ("plan", "done", "now", "deadline", "want"),
    [
        # not yet: the first reminder is due remind_after after asking
        (REMIND, Done(), T0 + 10, None, Step(None, T0 + 60)),
        (REMIND, Done(), T0 + 60, None, Step("remind", T0 + 60)),
        # the next follows the last reminder, not the question
        (REMIND, Done((T0 + 70,)), T0 + 100, None, Step(None, T0 + 130)),
        # a daemon down for many periods sends one, not one per missed period
        (REMIND, Done(), T0 + 1000, None, Step("remind", T0 + 60)),
        (REMIND, Done((T0 + 1000,)), T0 + 1001, None, Step(None, T0 + 1060)),
        # at most max_reminders
        (REMIND, Done((T0 + 60, T0 + 120)), T0 + 9999, None, Step(None, None)),
        (replace(REMIND, max_reminders=0), Done(), T0 + 9999, None, Step(None, None)),
        # escalation: once, escalate_after after asking
        (ESCALATE, Done(), T0 + 299, None, Step(None, T0 + 300)),
        (ESCALATE, Done(), T0 + 300, None, Step("escalate", T0 + 300)),
        (ESCALATE, Done(escalated_at=T0 + 300), T0 + 9999, None, Step(None, None)),
        # both: the escalation notifies too, so the next reminder counts from it
        (BOTH, Done((T0 + 60,)), T0 + 100, None, Step("escalate", T0 + 100)),
        (BOTH, Done((T0 + 60,), T0 + 100), T0 + 101, None, Step(None, T0 + 160)),
        # a tie: escalation first
        (replace(BOTH, escalate_after=60.0), Done(), T0 + 60, None, Step("escalate", T0 + 60)),
        # nothing at or after the deadline (the question ends then)
        (REMIND, Done(), T0 + 10, T0 + 60, Step(None, None)),
        (BOTH, Done(), T0 + 10, T0 + 90, Step(None, T0 + 60)),
        (ESCALATE, Done(), T0 + 10, T0 + 200, Step(None, None)),
        # escalate_after without anyone to escalate to does nothing
        (Plan(escalate_after=10.0), Done(), T0 + 99, None, Step(None, None)),
        # the SLA's passing is said once, after reminders and escalation due at that time
        (Plan(sla=100.0), Done(), T0 + 99, None, Step(None, T0 + 100)),
        (Plan(sla=100.0), Done(), T0 + 100, None, Step("overdue", T0 + 100)),
        (Plan(sla=100.0), Done(overdue_at=T0 + 100), T0 + 999, None, Step(None, None)),
        (replace(BOTH, sla=100.0), Done((T0 + 60,)), T0 + 100, None, Step("escalate", T0 + 100)),
        (Plan(sla=100.0), Done(), T0 + 10, T0 + 100, Step(None, None)),  # it times out first
        # at most per_hour reminders in any hour: the next waits for the oldest to be an hour old
        (HOURLY, Done((T0 + 60, T0 + 120, T0 + 180)), T0 + 240, None, Step(None, T0 + 3660)),
        (HOURLY, Done((T0 + 60, T0 + 120, T0 + 180)), T0 + 3660, None, Step("remind", T0 + 3660)),
        (HOURLY, Done((T0 + 60, T0 + 120)), T0 + 180, None, Step("remind", T0 + 180)),
    ],
)
def test_next_step(plan: Plan, done: Done, now: float, deadline: float | None, want: Step) -> None:
    assert next_step(plan, T0, done, now, deadline) == want


def test_after_counts_what_was_done() -> None:
    assert after(Done(), "remind", 5.0) == Done((5.0,))
    assert after(Done((5.0,)), "escalate", 9.0) == Done((5.0,), 9.0)


@pytest.mark.parametrize(
    ("asked", "defaults", "want"),
    [
        (None, None, None),
        (FollowUp(), None, None),
        (FollowUp(remind_after_seconds=5), None, Plan(remind_after=5.0)),
        # the question's own win, key by key; the daemon's fill the rest
        (
            FollowUp(remind_after_seconds=5),
            FollowUp(remind_after_seconds=50, max_reminders=1, sla_seconds=9),
            Plan(remind_after=5.0, max_reminders=1, sla=9.0),
        ),
        (None, FollowUp(sla_seconds=9), Plan(sla=9.0)),
    ],
)
def test_plan_takes_the_question_over_the_daemon(
    asked: FollowUp | None, defaults: FollowUp | None, want: Plan | None
) -> None:
    assert Plan.of(asked, defaults, floor=1.0) == want


@pytest.mark.parametrize(
    ("asked", "floor", "want"),
    [
        # a question's 0.01 s (the model's or the owner's) is the daemon's floor, 60 s by default
        (FollowUp(remind_after_seconds=0.01, max_reminders=100), 60.0, 60.0),
        (FollowUp(remind_after_seconds=0.01), 1.0, 1.0),
        (FollowUp(remind_after_seconds=600), 60.0, 600.0),
    ],
)
def test_reminders_are_never_more_often_than_the_floor(
    asked: FollowUp, floor: float, want: float
) -> None:
    plan = Plan.of(asked, None, floor=floor)
    assert plan is not None and plan.remind_after == want


def test_the_floor_and_the_hourly_cap_are_the_configs_and_checked() -> None:
    default = Rules.of(DaemonConfig.model_validate({"roots": ["/srv"]}))
    assert (default.follow_up_floor, default.follow_up_per_hour) == (60.0, 10)
    doc = {"roots": ["/srv"], "follow_up_limits": {"min_interval_seconds": 5, "max_per_hour": 4}}
    rules = Rules.of(DaemonConfig.model_validate(doc))
    assert (rules.follow_up_floor, rules.follow_up_per_hour) == (5.0, 4)
    for bad in ({"min_interval_seconds": 0.01}, {"max_per_hour": 0}, {"per_hour": 3}):
        with pytest.raises(ValidationError):
            DaemonConfig.model_validate({"roots": ["/srv"], "follow_up_limits": bad})


RULES = Rules(resume=Pacing(5.0, 600.0), model=Pacing(10.0, 40.0))
NOW = Now(mono=1000.0, wall=T0 + 61)


def waiting(follow: FollowUp | None, **kw: object) -> Verdict:
    v = Verdict(Action.NONE, State.WAITING, "run1", request_id="q1", input_type="text")
    return replace(v, created=T0, follow_up=follow, **kw)  # type: ignore[arg-type]


def test_decide_reminds_a_waiting_question_and_looks_again_at_the_next() -> None:
    v = waiting(FollowUp(remind_after_seconds=60))
    effects = decide(DecideFacts(v), FRESH, NOW, RULES)
    due = [e for e in effects if isinstance(e, FollowUpDue)]
    assert [(d.request_id, d.action) for d in due] == [("q1", "remind")]
    # the next reminder 60 s after this one: 1 s later on the wall, 60 s on the monotonic
    assert Schedule(NOW.mono + 60.0) in effects


@pytest.mark.parametrize(
    "v",
    [
        waiting(FollowUp(remind_after_seconds=60), answer_sig=(1, 2, 3)),  # an answer coming
        replace(waiting(FollowUp(remind_after_seconds=60)), state=State.ANSWERED),
        waiting(None),
        waiting(FollowUp(sla_seconds=600)),  # not due yet
    ],
)
def test_decide_leaves_alone(v: Verdict) -> None:
    assert not [e for e in decide(DecideFacts(v), FRESH, NOW, RULES) if isinstance(e, FollowUpDue)]


def test_decide_uses_the_daemons_defaults_and_what_was_done() -> None:
    rules = replace(RULES, follow_up=FollowUp(remind_after_seconds=60))
    v = waiting(None)
    effects = decide(DecideFacts(v), FRESH, NOW, rules)
    assert [e.action for e in effects if isinstance(e, FollowUpDue)] == ["remind"]
    told = DecideFacts(v, followed=Done((T0 + 60,)))
    assert not [e for e in decide(told, FRESH, NOW, rules) if isinstance(e, FollowUpDue)]


def test_store_survives_a_reload_and_forgets_closed_questions(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    store = Store(tmp_path / "followup")
    store.load()
    store.record(ws, "q1", "remind", T0 + 60, BOTH, T0)
    store.record(ws, "q1", "escalate", T0 + 100, replace(BOTH, sla=50.0), T0)
    again = Store(tmp_path / "followup")
    assert again.load() == 1
    assert again.done(ws, "q1") == Done((T0 + 60,), T0 + 100)
    rec = again.get(ws, "q1")
    assert rec is not None and rec.escalated is not None and rec.escalated.to == ["boss"]
    assert rec.sla_due_at is not None and rec.sla_due_at.timestamp() == T0 + 50
    again.settle(ws, "q2")  # the workspace moved on to another question
    assert again.done(ws, "q1") == Done()
    assert Store(tmp_path / "followup").load() == 0


def test_a_damaged_record_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "followup").mkdir()
    (tmp_path / "followup" / "x.json").write_text("{not json")
    (tmp_path / "followup" / ".y.json.tmp").write_text("{")  # a write a crash cut short
    assert Store(tmp_path / "followup").load() == 0
    assert not (tmp_path / "followup" / ".y.json.tmp").exists()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"remind_after_seconds": 0}, "remind_after_seconds: Input should be greater than 0"),
        ({"remind_after_seconds": True}, "remind_after_seconds must be a number"),
        ({"escalate_to": ["bob"]}, "escalate_to needs escalate_after_seconds"),
        ({"escalate_after_seconds": 5, "escalate_to": ["a b"]}, "is not a token name"),
        ({"max_reminders": 1000}, "max_reminders: Input should be less than or equal to 100"),
        ({"sla_seconds": 10**9}, "sla_seconds: Input should be less than or equal to"),
    ],
)
def test_bad_arguments_are_one_line(args: dict[str, object], error: str) -> None:
    said = from_args(args)
    assert isinstance(said, str) and error in said and "\n" not in said


def test_the_documented_follow_up_example_is_valid() -> None:
    """config/deltad.yaml's commented `follow_up:` block, uncommented, is a valid section."""
    import yaml

    from deltad.core.config import DaemonConfig

    text = (Path(__file__).resolve().parents[2] / "config" / "deltad.yaml").read_text()
    doc: dict[str, Any] = {}
    for key in ("# follow_up:", "# follow_up_limits:"):
        block = text[text.index(key) :].split("\n\n")[0]  # up to the next blank line
        doc |= yaml.safe_load("\n".join(x[2:] for x in block.splitlines() if x.startswith("# ")))
    config = DaemonConfig.model_validate({"roots": [], **doc})
    assert config.follow_up is not None and config.follow_up.escalate_to == ["group:leads"]
    assert config.follow_up_limits.min_interval_seconds == 60.0  # the defaults, as documented


# -- the loop: timers under a ManualClock, a restart, another daemon's record ---------------------
def _service(tmp_path: Path, state: str, clock: Any) -> Any:
    from deltad.core.config import load_config
    from deltad.core.service import Service

    from .test_daemon_loop import ScriptedResumer

    config = load_config(None, (str(tmp_path / "root"),))
    config.state_dir = tmp_path / state
    config.state_dir.mkdir(exist_ok=True)
    config.executor = "fresh"  # not a fork server (a Python start): no resume is started here
    svc = Service(config, None, (), clock=clock, resumer=ScriptedResumer(config))
    svc.followups.load()
    svc.life.build_backends()
    svc.ticks.start(clock.monotonic(), config)
    return svc


def _heard(svc: Any) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    svc.feed.subscribe(
        lambda e: (
            out.append((e.type, e.data.get("reminder") or e.data.get("escalated_to")))
            if e.type in ("request.reminder", "request.escalated", "request.overdue")
            else None
        )
    )
    return out


def test_the_loop_reminds_and_escalates_on_its_timers_and_a_restart_repeats_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltad.clock import ManualClock
    from deltad.protocol import followup as proto
    from deltad.testing.stub import paused_workspace

    monkeypatch.delenv("DELTAD_CONFIG", raising=False)
    ws = tmp_path / "root" / "ws"
    follow = {"remind_after_seconds": 60, "max_reminders": 2}
    follow |= {"escalate_after_seconds": 150, "escalate_to": ["bob"], "sla_seconds": 170}
    paused_workspace(ws, input_type="yes_no", respondents=["alice"], follow_up=follow)
    asked = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    clock = ManualClock(wall=datetime.fromisoformat(asked["timestamp"]).timestamp())

    def look(svc: Any, seconds: float = 0.0) -> None:
        clock.advance(seconds)
        svc.queue.put(ws)
        svc.turn()
        svc.turn()  # a timer that came due queued it: this turn looks

    svc = _service(tmp_path, "state", clock)
    heard = _heard(svc)
    look(svc)
    assert heard == [] and svc.timers.next_due() == clock.monotonic() + 60
    look(svc, 60)
    assert heard == [("request.reminder", 1)]
    assert svc.metrics.follow_ups.labels("remind")._value.get() == 1
    svc.life.close_backends()

    # A restart (the same state dir): nothing again, the next reminder on time.
    svc = _service(tmp_path, "state", clock)
    heard = _heard(svc)
    look(svc, 30)
    assert heard == []
    look(svc, 30)
    assert heard == [("request.reminder", 2)]
    look(svc, 30)
    assert heard == [("request.reminder", 2), ("request.escalated", ["bob"])]
    look(svc, 21)  # just past (a float sum of the steps may be a hair short of 170)
    assert heard[-1] == ("request.overdue", None)
    look(svc, 3600)  # max_reminders reached, escalated once, overdue said: nothing more
    assert len(heard) == 3
    svc.life.close_backends()
    beside = proto.read(ws / ".delta" / "interaction", asked["request_id"])
    assert beside is not None and len(beside.reminders) == 2
    assert beside.escalated is not None and beside.escalated.to == ["bob"]
    assert beside.overdue_at is not None and beside.sla_due_at is not None
    # Each send is one audit entry, once (not again after the restart), with who and what.
    from deltad.inbox import audit

    log = tmp_path / "state" / "audit.jsonl"
    assert audit.verify(audit.read_lines(log)).entries == 3
    sent = [json.loads(x) for x in audit.read_lines(log)]
    assert [(e["kind"], e.get("reminder"), e["to"], e["via"], e["channel"]) for e in sent] == [
        ("reminder", 1, ["alice"], [], "daemon"),
        ("reminder", 2, ["alice"], [], "daemon"),
        ("escalation", None, ["bob"], [], "daemon"),
    ]
    assert {e["request_id"] for e in sent} == {asked["request_id"]}
    assert all(e["run_id"] == asked["run_id"] and e["workspace"] == str(ws) for e in sent)

    # Another daemon (an HA standby taking over, its own state dir) reads that record.
    other = _service(tmp_path, "other-state", clock)
    heard = _heard(other)
    look(other, 10)
    assert heard == []
    other.life.close_backends()


def test_a_workspace_name_that_is_not_text_is_kept(tmp_path: Path) -> None:
    ws = tmp_path / os.fsdecode(b"caf\xe9")  # not UTF-8: names are bytes
    store = Store(tmp_path / "followup")
    store.load()
    store.record(ws, "q1", "remind", T0 + 60, REMIND, T0)
    again = Store(tmp_path / "followup")
    assert again.load() == 1 and again.done(ws, "q1") == Done((T0 + 60,))


def test_whom_it_was_escalated_to_may_answer_and_hand_it_on(tmp_path: Path) -> None:
    from deltad.inbox import delegation
    from deltad.inbox.respondents import Answerer
    from deltad.protocol import Mailbox, Workspace, utcnow
    from deltad.protocol import followup as proto
    from deltad.testing.stub import paused_workspace

    ws = Workspace.at(tmp_path / "ws")
    paused_workspace(ws.root, input_type="yes_no", respondents=["alice"])
    req = Mailbox(ws).read_request()
    assert req is not None
    bob = Answerer("bob")
    assert delegation.refuse_respondent(ws, req.request_id, bob) is not None
    rec = proto.Record(
        request_id=req.request_id, escalated=proto.Escalation(at=utcnow(), to=["bob"])
    )
    proto.path_of(ws.interaction_dir).write_text(rec.model_dump_json())
    assert delegation.refuse_respondent(ws, req.request_id, bob) is None
    assert delegation.refuse_respondent(ws, req.request_id, Answerer("carol")) is not None
    _, handed = delegation.delegate(ws, req.request_id, "carol", who=bob, known={"carol"})
    assert [d.to for d in handed] == ["carol"]
    # A record of another question widens nothing.
    other = rec.model_copy(update={"request_id": "another"})
    proto.path_of(ws.interaction_dir).write_text(other.model_dump_json())
    assert delegation.refuse_respondent(ws, req.request_id, bob) is not None


# -- what carries a follow-up to people ---------------------------------------------------------
def _config(tmp_path: Path, **keys: Any) -> Any:
    from deltad.core.config import DaemonConfig

    roots = keys.pop("roots", [{"path": str(tmp_path / "root")}])
    return DaemonConfig.model_validate({"roots": roots, **keys})


HOOK = {"url": "http://127.0.0.1:9/hook"}
HOOKS = {"webhooks": [HOOK]}
EMAIL = {
    "from_address": "deltad@example.org",
    "reply_domain": "example.org",
    "maildir": "/nonexistent/Maildir",
}
TEAMS = {
    "app_id": "6d4c8a2e-1f0b-4c3a-9e7d-5b2a1c0d9e8f",
    "app_password": {"secret_env": "UNUSED"},
    "service_url": "https://smba.example/amer/",
    "conversations": ["19:a@thread.tacv2"],
}
DAEMON_REMINDS = {"remind_after_seconds": 60}


@pytest.mark.parametrize(
    ("keys", "action", "want"),
    [
        ({}, "remind", []),  # nothing configured: nobody is told
        ({}, "escalate", []),
        ({"notify": {"webhooks": [HOOK]}}, "remind", ["webhook"]),  # the default events
        ({"notify": {"webhooks": [HOOK | {"events": ["request.created"]}]}}, "remind", []),
        ({"notify": {"webhooks": [HOOK | {"exclude": ["/srv/**"]}]}}, "escalate", []),
        ({"notify": {"webhooks": [HOOK | {"exclude": ["/x/**"]}]}}, "escalate", ["webhook"]),
        ({"notify": {"commands": [{"argv": ["true"]}]}}, "remind", ["command"]),
        ({"channels": {"email": EMAIL}}, "remind", ["email"]),
        ({"channels": {"email": EMAIL}}, "overdue", []),  # the channels carry no SLA notice
        ({"notify": {"webhooks": [HOOK]}}, "overdue", ["webhook"]),
        ({"notify": HOOKS, "channels": {"email": EMAIL}}, "escalate", ["webhook", "email"]),
        ({"channels": {"teams": TEAMS}}, "remind", ["teams"]),  # a reply to its card
        ({"channels": {"teams": TEAMS}}, "escalate", ["teams"]),
        ({"channels": {"teams": TEAMS}}, "overdue", []),
        # a root that notifies nobody
        ({"roots": [{"path": "/srv", "notify": False}], "notify": HOOKS}, "remind", []),
    ],
)
def test_what_carries_a_follow_up(
    tmp_path: Path, keys: dict[str, Any], action: str, want: list[str]
) -> None:
    from deltad.core.followup import carriers

    keys.setdefault("roots", [{"path": "/srv"}])
    assert carriers(_config(tmp_path, **keys), Path("/srv/ws"), action) == want  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("keys", "want"),
    [
        ({"follow_up": DAEMON_REMINDS}, ("warning", "follow_up: its reminders have no channel")),
        (
            {"follow_up": DAEMON_REMINDS | {"escalate_after_seconds": 60, "escalate_to": ["bob"]}},
            ("warning", "follow_up: its reminders and escalations have no channel"),
        ),
        # asked for, but only some roots are quiet
        (
            {
                "follow_up": DAEMON_REMINDS,
                "notify": {"webhooks": [HOOK]},
                "roots": ["/srv/a", {"path": "/srv/b", "notify": False}],
            },
            ("warning", "follow_up: the reminders and escalations of workspaces under /srv/b"),
        ),
        # the daemon asks for none: only an agent or a question could (a note)
        ({}, ("note", "reminders and escalations that an agent or a question asks for")),
        ({"follow_up": {"sla_seconds": 60}}, ("note", "reminders and escalations that")),
        # carried: nothing to say
        ({"follow_up": DAEMON_REMINDS, "notify": {"webhooks": [HOOK]}}, None),
        ({"channels": {"email": EMAIL}}, None),
        # a webhook for reminders only: escalations are the daemon's? none asked: a note
        (
            {"notify": {"webhooks": [HOOK | {"events": ["request.reminder"]}]}},
            ("note", "escalations that an agent"),
        ),
    ],
)
def test_check_and_start_say_when_a_follow_up_has_no_channel(
    tmp_path: Path, keys: dict[str, Any], want: tuple[str, str] | None
) -> None:
    from deltad.core.followup import unsent

    said = unsent(_config(tmp_path, **keys))
    if want is None:
        assert said is None
    else:
        assert said is not None and said[0] == want[0] and said[1].startswith(want[1]), said
        assert "\n" not in said[1] and "nobody is told" in said[1]


def test_a_follow_up_nothing_carries_is_recorded_as_such_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from structlog.testing import capture_logs

    from deltad.clock import ManualClock
    from deltad.protocol import followup as proto
    from deltad.testing.stub import paused_workspace

    monkeypatch.delenv("DELTAD_CONFIG", raising=False)
    ws = tmp_path / "root" / "ws"
    follow = {"remind_after_seconds": 60, "escalate_after_seconds": 90, "escalate_to": ["bob"]}
    paused_workspace(ws, input_type="yes_no", respondents=["alice"], follow_up=follow)
    asked = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    clock = ManualClock(wall=datetime.fromisoformat(asked["timestamp"]).timestamp())
    svc = _service(tmp_path, "state", clock)
    try:
        with capture_logs() as logs:
            for step in (0, 60, 30):
                clock.advance(step)
                svc.queue.put(ws)
                svc.turn()
                svc.turn()
    finally:
        svc.life.close_backends()
    said = [(e["event"], e.get("kind")) for e in logs if e["log_level"] == "warning"]
    assert said == [
        ("followup_no_channel", None),  # once, when the question is first seen
        ("followup_undelivered", "reminder"),
        ("followup_undelivered", "escalation"),
    ]
    assert all(e["workspace"] == str(ws) for e in logs if e["event"] == "followup_undelivered")
    beside = proto.read(ws / ".delta" / "interaction", asked["request_id"])
    assert beside is not None and beside.reminders_via == [] and beside.escalated is not None
    assert beside.escalated.via == []


def test_a_carried_follow_up_names_its_channel_and_logs_no_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from structlog.testing import capture_logs

    from deltad.clock import ManualClock
    from deltad.protocol import followup as proto
    from deltad.testing.stub import paused_workspace

    monkeypatch.delenv("DELTAD_CONFIG", raising=False)
    ws = tmp_path / "root" / "ws"
    paused_workspace(ws, input_type="yes_no", follow_up={"remind_after_seconds": 60})
    asked = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    clock = ManualClock(wall=datetime.fromisoformat(asked["timestamp"]).timestamp())
    svc = _service(tmp_path, "state", clock)
    carried = _config(tmp_path, notify={"webhooks": [HOOK]})  # not started: only read
    carried.state_dir = svc.config.state_dir
    svc.config = carried
    try:
        with capture_logs() as logs:
            for step in (0, 60):
                clock.advance(step)
                svc.queue.put(ws)
                svc.turn()
                svc.turn()
    finally:
        svc.life.close_backends()
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == []
    beside = proto.read(ws / ".delta" / "interaction", asked["request_id"])
    assert beside is not None and len(beside.reminders) == 1 and beside.reminders_via == ["webhook"]
