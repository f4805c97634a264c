"""Reminders and escalation through a real `deltad serve`: a question asked by a real `delta run`
with second-long durations is reminded, past its SLA and escalated by the daemon's timers, seen
by a webhook receiver; a restart between the reminder and the escalation repeats nothing and
loses nothing; the escalated-to token may then answer over HTTP; the journal, the history and
`delta status` say who was reminded and when."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from deltad.testing import FakeLLM
from deltad.testing.stub import paused_workspace
from tests.support.daemon import DELTAD, Daemon, metadata_status, wait_for
from tests.support.inbox import client, http_url, make_token
from tests.support.webhooks import Receiver

from ..conftest import llm_env, write_agent

DELTA = str(Path(sys.executable).parent / "delta")
# Reminders a second apart: the daemon's floor lowered (60 s by default) for the test's sake.
FAST = {"min_interval_seconds": 1, "max_per_hour": 60}
REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]
QUESTION = {
    "prompt": "Deploy to production?",
    "input_type": "yes_no",
    "respondents": ["alice"],
    "remind_after_seconds": 1,
    "max_reminders": 1,
    "escalate_after_seconds": 3,
    "escalate_to": ["bob"],
    "sla_seconds": 2,  # past it before the escalation: said once, ends nothing
}


def _hooks(recv: Receiver) -> list[dict[str, Any]]:
    return [json.loads(c.body) for c in recv.delivered()]


def _of(recv: Receiver, type_: str) -> list[dict[str, Any]]:
    return [h for h in _hooks(recv) if h["type"] == type_]


def _url(d: Daemon, n: int) -> str:
    return str(d.wait_event("http_listening", count=n)[-1]["url"])


def _counted(url: str, token: str) -> dict[str, float]:
    with client(url, token) as http:
        text = http.get("/metrics").text
    return {
        s.labels["action"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "deltad_question_follow_ups_total"
    }


def test_reminded_then_escalated_across_a_restart_and_the_escalated_token_answers(
    tmp_path: Path, fake: FakeLLM
) -> None:
    root, ws = tmp_path / "root", tmp_path / "root" / "ws"
    ws.mkdir(parents=True)
    fake.call("ask_human", QUESTION, id="ask1")
    fake.reply("deployed")
    with Receiver() as recv:
        events = ["request.reminder", "request.escalated", "request.overdue"]
        hook = {"url": recv.url, "events": events}
        d = Daemon(
            tmp_path,
            [root],
            resume_command=REAL_CLIENT,
            http={"listen": "127.0.0.1:0"},
            notify={"webhooks": [hook]},
            follow_up_limits=FAST,
        )
        env = llm_env(fake)
        d.start(env=env)
        try:
            prom = make_token(d.state_dir, "prom", role="metrics")
            bob = make_token(d.state_dir, "bob")
            carol = make_token(d.state_dir, "carol")
            agent = write_agent(tmp_path)
            argv = [DELTA, "run", "--agent", str(agent), "--task", "ship", "--work-dir", str(ws)]
            paused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
            assert paused.returncode == 101, paused.stderr

            [reminder] = wait_for(lambda: _of(recv, "request.reminder"), "a reminder delivered")
            assert reminder["reminder"] == 1 and reminder["workspace"] == str(ws)
            # The reminder carries the question, like its first notice.
            assert reminder["request"]["prompt"] == "Deploy to production?"
            assert reminder["url"].endswith(f"#request={reminder['request_id']}")
            assert _counted(_url(d, 1), prom).get("remind") == 1
            d.stop()

            # Down between the reminder and the escalation: the next daemon escalates once
            # (it was due meanwhile) and does not remind again.
            d.start(env=env, wait=False)
            d.wait_event("daemon_ready", count=2)
            [up] = wait_for(lambda: _of(recv, "request.escalated"), "the escalation delivered")
            assert up["escalated_to"] == ["bob"] and up["request"]["respondents"] == ["alice"]
            # The escalation comes after anything due before it (deliveries go oldest first).
            assert len(_of(recv, "request.reminder")) == 1
            [late] = _of(recv, "request.overdue")
            assert late["sla_due_at"] and late["request"]["prompt"] == "Deploy to production?"

            url = _url(d, 2)
            rid = reminder["request_id"]
            with client(url, carol) as c:  # anyone in scope sees it
                [q] = c.get("/v1/requests").json()["requests"]
            done = q["follow_up"]
            assert len(done["reminders"]) == 1 and done["escalated"]["to"] == ["bob"]
            # What carried them: the webhook (the page says "by webhook").
            assert done["reminders_via"] == ["webhook"] and done["escalated"]["via"] == ["webhook"]
            assert done["sla_due_at"] is not None and done["overdue_at"] is not None
            with client(url, carol) as c:  # not a respondent, nor escalated to
                r = c.post(f"/v1/requests/{rid}/answer", json={"answer": "yes"})
                assert r.status_code == 403 and r.json()["code"] == "not_a_respondent"
            with client(url, bob) as b:
                r = b.post(f"/v1/requests/{rid}/answer", json={"answer": "yes"})
                assert r.status_code == 202, r.text
            wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed")
            with client(url, bob) as b:
                history = b.get("/v1/history").json()["history"]
            [answered] = [h for h in history if h["kind"] == "answered"]
            assert answered["answered_by"] == "bob"
            assert answered["follow_up"]["escalated"]["to"] == ["bob"]
            assert len(answered["follow_up"]["reminders"]) == 1
            # A closed question's record leaves the state dir.
            wait_for(lambda: not list((d.state_dir / "followup").glob("*.json")), "forgotten")
        finally:
            d.stop()
            d.kill_children()
        assert len(_of(recv, "request.reminder")) == 1
        assert len(_of(recv, "request.escalated")) == 1
        assert len(_of(recv, "request.overdue")) == 1
    rid = (ws / ".delta" / "runs" / "LATEST").read_text().strip()
    lines = (ws / ".delta" / "runs" / rid / "execution" / "journal.jsonl").read_text()
    [reply] = [
        e["payload"]["reply"]
        for e in map(json.loads, lines.splitlines())
        if e["type"] == "HUMAN_INTERACTION" and e["payload"].get("phase") == "answered"
    ]
    assert reply["answered_by"] == "bob" and reply["follow_up"]["escalated"]["to"] == ["bob"]
    status = subprocess.run(
        [DELTA, "status", "--work-dir", str(ws)], capture_output=True, text=True, timeout=60
    )
    assert "Reminded: once, last at " in status.stdout, status.stdout
    assert "Escalated: to bob at " in status.stdout
    assert "(by webhook)" in status.stdout and "nobody was told" not in status.stdout
    assert "(SLA; overdue)" in status.stdout


def test_the_agent_sets_defaults_a_question_overrides_and_bad_ones_are_one_line(
    tmp_path: Path, fake: FakeLLM
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    extra = """
    follow_up:
      remind_after_seconds: 600
      escalate_after_seconds: 3600
      escalate_to: [group:oncall]
    """
    agent = write_agent(tmp_path, extra=extra)
    fake.call("ask_human", {"prompt": "Now?", "remind_after_seconds": -5}, id="bad")
    fake.call("ask_human", {"prompt": "Now?", "remind_after_seconds": 60}, id="good")
    argv = [DELTA, "run", "--agent", str(agent), "--task", "t", "--work-dir", str(ws)]
    out = subprocess.run(argv, env=llm_env(fake), capture_output=True, text=True, timeout=60)
    assert out.returncode == 101, out.stderr
    said = fake.tool_results()["bad"]
    assert said.startswith("Error: remind_after_seconds:") and "\n" not in said
    asked = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    follow = {k: v for k, v in asked["follow_up"].items() if v is not None}
    assert follow == {
        "remind_after_seconds": 60,  # the question's own
        "escalate_after_seconds": 3600,  # the agent's
        "escalate_to": ["group:oncall"],
    }
    # A bad agent setting: one line naming the key, before anything runs.
    broken = write_agent(tmp_path, extra="follow_up: {remind_after: 5}\n", name="broken")
    argv = [DELTA, "run", "--agent", str(broken), "--task", "t", "--work-dir", str(tmp_path)]
    out = subprocess.run(argv, env=llm_env(fake), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "follow_up" in out.stderr and "remind_after" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_with_no_channel_the_follow_ups_are_said_to_have_reached_nobody(tmp_path: Path) -> None:
    """No webhook, command, email or Slack: `deltad check` warns (exit 0) of the daemon's own
    `follow_up:`; `serve` says so at start, says once that a question asks for follow-ups
    nothing carries, and logs each that comes due as `followup_undelivered`; the record (the
    API, `delta status`) says nothing carried them."""
    root, ws = tmp_path / "root", tmp_path / "root" / "ws"
    follow = {"remind_after_seconds": 1, "max_reminders": 1}
    follow |= {"escalate_after_seconds": 1, "escalate_to": ["bob"]}
    paused_workspace(ws, "Deploy?", input_type="yes_no", respondents=["alice"], follow_up=follow)
    d = Daemon(
        tmp_path,
        [root],
        http={"listen": "127.0.0.1:0"},
        follow_up={"remind_after_seconds": 3600},
        follow_up_limits=FAST,
    )
    check = subprocess.run(
        [DELTAD, "check", "--config", str(d.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    [warned] = [line for line in check.stdout.splitlines() if line.startswith("warning:")]
    assert warned.startswith("warning: follow_up: its reminders have no channel to carry them")
    assert "nobody is told" in warned
    d.start()
    try:
        d.wait_event("followup_no_channel")
        escalated = d.wait_event("followup_undelivered", kind="escalation")[0]
        reminded = d.wait_event("followup_undelivered", kind="reminder")[0]
        for e in (escalated, reminded):
            assert e["workspace"] == str(ws) and e["level"] == "warning"
        # Said once: the daemon's own follow_up (which says questions' own go nowhere too).
        [said] = d.events("followup_no_channel")
        assert said["problem"] == warned.removeprefix("warning: ")
        alice = make_token(d.state_dir, "alice")
        with client(http_url(d), alice) as a:
            [q] = a.get("/v1/requests").json()["requests"]
        assert q["follow_up"]["reminders_via"] == [] and q["follow_up"]["escalated"]["via"] == []
    finally:
        d.stop()
        d.kill_children()
    status = subprocess.run(
        [DELTA, "status", "--work-dir", str(ws)], capture_output=True, text=True, timeout=60
    )
    assert "nobody was told: no channel is configured" in status.stdout, status.stdout
