"""Four eyes through a real `deltad serve --listen`: a question with `approvals_required: 2`
is answered only when two distinct tokens agree (resumed exactly once, both recorded); one
vote is kept beside the question, shown by the API and `delta status`, and survives a restart
without resuming anything; a rejection rejects at once; the same token twice and the owner's
own approval are refused; a bulk answer is one vote per question; a deadline passing with a
partial vote applies the question's timeout, the vote on record. Every vote is a receipt."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from deltad.protocol import utcnow
from deltad.protocol.models import GatedCall, Option
from deltad.testing import FakeLLM, tool_call
from deltad.testing.stub import paused_workspace
from tests.mta import Mta, postfix  # noqa: F401  (the fixture)
from tests.support.daemon import DELTAD, Daemon, metadata_status, records, wait_for
from tests.support.inbox import client, http_url, make_token

from ..conftest import GATED_TOOLS_FOR_DAEMON, llm_env, write_agent

DELTA = str(Path(sys.executable).parent / "delta")
OPTIONS = [Option(key="a", label="Apple"), Option(key="p", label="Pear")]
DEPLOY = GatedCall(
    action_id="act_1", tool_name="deploy", arguments={"env": "prod"}, resolved_command="deploy"
)


def _rid(ws: Path) -> str:
    return str(json.loads((ws / ".delta/interaction/request.json").read_text())["request_id"])


def _approval(ws: Path, **more: Any) -> None:
    paused_workspace(
        ws, "Deploy?", input_type="approval", calls=[DEPLOY], approvals_required=2, **more
    )


def _decide(decision: str) -> dict[str, Any]:
    return {"decisions": [{"action_id": "act_1", "decision": decision, "reason": "not now"}]}


def _answer(http: Any, ws: Path, body: dict[str, Any]) -> Any:
    return http.post(f"/v1/requests/{_rid(ws)}/answer", params={"workspace": str(ws)}, json=body)


def _given(http: Any, ws: Path) -> list[str]:
    doc = http.get(f"/v1/requests/{_rid(ws)}", params={"workspace": str(ws)}).json()
    return [v["by"] for v in doc["approvals"]["given"]]


def _token(d: Daemon, name: str, person: str) -> str:
    argv = [DELTAD, "token", "add", name, "--person", person, "--state-dir", str(d.state_dir)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_two_tokens_must_agree_and_a_vote_outlives_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "root"
    two, rejected, owned = root / "two", root / "rejected", root / "owned"
    _approval(two)
    two_rid = _rid(two)
    _approval(rejected)
    _approval(owned, owner_may_approve=False)
    late = root / "late"
    fleet = [root / "bulk-1", root / "bulk-2"]
    for ws in fleet:
        paused_workspace(ws, "Fruit?", input_type="choice", options=OPTIONS, approvals_required=2)
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    me = pwd.getpwuid(os.getuid()).pw_name  # the workspaces' owner
    alice, bob = make_token(d.state_dir, "alice"), make_token(d.state_dir, "bob")
    owner = make_token(d.state_dir, me)
    items = [{"request_id": _rid(ws), "workspace": str(ws)} for ws in fleet]
    try:
        url = http_url(d)
        with client(url, alice) as a, client(url, bob) as b, client(url, owner) as o:
            wait_for(lambda: len(a.get("/v1/requests").json()["requests"]) == 5, "five listed")
            # Asked now, with a deadline a few seconds away: a partial vote, then the deadline.
            soon = utcnow() + timedelta(seconds=5)
            paused_workspace(
                late,
                "Fruit?",
                input_type="choice",
                options=OPTIONS,
                approvals_required=2,
                expires_at=soon,
            )
            wait_for(lambda: len(a.get("/v1/requests").json()["requests"]) == 6, "six listed")
            r = _answer(a, late, {"answer": "p"})  # a partial vote, then the deadline
            assert r.status_code == 202 and r.json()["answered"] is False, r.text
            # One vote counts, shows, and answers nothing.
            r = _answer(a, two, _decide("approve"))
            assert r.status_code == 202, r.text
            assert (r.json()["answered"], r.json()["approvals"]["required"]) == (False, 2)
            again = _answer(a, two, _decide("approve"))
            assert again.status_code == 409 and again.json()["code"] == "already_voted"
            assert _given(a, two) == ["alice"]
            # Four eyes counts people: alice's second token is alice again.
            phone = _token(d, "alice-phone", "alice")
            listed = subprocess.run(
                [DELTAD, "token", "list", "--state-dir", str(d.state_dir)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.splitlines()
            [line] = [x for x in listed if x.startswith("alice-phone\t")]
            assert line.endswith("person:alice"), line
            with client(url, phone) as p:
                again = _answer(p, two, _decide("approve"))
                assert again.status_code == 409 and again.json()["code"] == "already_voted"
            status = subprocess.run(
                [DELTA, "status", "--work-dir", str(two)], capture_output=True, text=True
            )
            assert "Approvals: 1 of 2 (alice)" in status.stdout, status.stdout
            # The owner may not approve their own run's request (configured), but a link
            # names nobody and cannot be one of two either.
            r = _answer(o, owned, _decide("approve"))
            assert r.status_code == 403 and r.json()["code"] == "owner_may_not_approve", r.text
            with client(url, _token(d, "owners-laptop", me)) as laptop:  # the owner, as a person
                r = _answer(laptop, owned, _decide("approve"))
                assert r.status_code == 403 and r.json()["code"] == "owner_may_not_approve"
            # Fail closed: one approval, then one rejection, rejects.
            assert _answer(a, rejected, _decide("approve")).json()["answered"] is False
            r = _answer(b, rejected, _decide("reject"))
            assert r.status_code == 202 and r.json()["answered"] is True, r.text
            # A bulk answer is one vote per question.
            body = {"items": items, "answer": {"answer": "p"}}
            first = a.post("/v1/answers", json=body).json()
            assert first["accepted"] == 2
            assert [x["answered"] for x in first["results"]] == [False, False]
            prom = make_token(d.state_dir, "prom", role="metrics")
            with client(url, prom) as m:
                text = m.get("/metrics").text
            for outcome, n in (("pending", 5), ("answered", 1), ("refused", 4)):
                assert f'deltad_approval_votes_total{{outcome="{outcome}"}} {n}.0' in text
        d.wait_resumed(rejected)
        d.stop()
        early = {x["workspace"] for x in records(d.record)}
        assert early <= {str(rejected), str(late)}  # late: its deadline may have passed
        d.kill_children()
        # A new daemon on the same state dir: the votes are on disk; nothing resumes, and
        # they still show.
        d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
        with client(url := http_url(d), alice) as a, client(url, bob) as b:
            wait_for(lambda: len(a.get("/v1/requests").json()["requests"]) >= 4, "listed again")
            assert _given(a, two) == ["alice"]
            assert not d.resumed(two)
            handed = a.post(
                f"/v1/requests/{_rid(two)}/delegate",
                params={"workspace": str(two)},
                json={"to": "bob", "note": "your turn"},
            )
            assert handed.status_code == 200 and handed.json()["status"] == "delegated", handed.text
            r = _answer(b, two, _decide("approve"))
            assert r.status_code == 202 and r.json()["answered"] is True, r.text
            second = b.post("/v1/answers", json={"items": items, "answer": {"answer": "p"}})
            assert [x["answered"] for x in second.json()["results"]] == [True, True]
        for ws in (two, *fleet):
            d.wait_resumed(ws)
        # The deadline passed with one vote of two: the timeout is the daemon's to apply
        # (the stand-in resume leaves the run waiting), its receipt keeps the partial vote.
        log = d.state_dir / "audit.jsonl"

        def timeouts() -> list[dict[str, Any]]:
            entries = [json.loads(x) for x in log.read_text().splitlines()]
            return [e for e in entries if e["kind"] == "timeout"]

        timeout = wait_for(timeouts, "the deadline's receipt")[0]
        d.stop()
    finally:
        d.stop()  # again after a failure too: never a daemon left behind
        d.kill_children()
    resumed = Counter(x["workspace"] for x in records(d.record))
    resumed.pop(str(late), None)
    assert resumed == Counter({str(w): 1 for w in (two, rejected, *fleet)})
    answers = {x["workspace"]: x.get("answer") for x in records(d.record)}
    doc = json.loads(answers[str(two)])
    assert doc["answered_by"] == "alice, bob"
    assert [(v["by"], v["verdict"]) for v in doc["approvals"]] == [
        ("alice", "approve"),
        ("bob", "approve"),
    ]
    assert doc["decisions"][0]["digest"].startswith("sha256:")
    no = json.loads(answers[str(rejected)])
    assert (no["answered_by"], no["decisions"][0]["decision"]) == ("bob", "reject")
    assert [v["by"] for v in no["approvals"]] == ["alice", "bob"]
    # Every vote is a receipt; the deadline's keeps the partial vote; the chain verifies.
    entries = [json.loads(x) for x in log.read_text().splitlines()]
    votes = [(e["answered_by"], e["quorum"]["outcome"]) for e in entries if e["kind"] == "vote"]
    assert Counter(votes) == Counter({("alice", "pending"): 5, ("bob", "answered"): 4})
    assert timeout["workspace"] == str(late)
    assert [v["by"] for v in timeout["votes"]] == ["alice"]
    ok = subprocess.run(
        [DELTAD, "audit", "verify", "--state-dir", str(d.state_dir)], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    # The refused votes and the hand-over are in the export too: one refused entry per person
    # and refusal (alice's second token is alice refused again: not another entry).
    out = subprocess.run(
        [DELTAD, "audit", "export", "--state-dir", str(d.state_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = [json.loads(x) for x in out.splitlines()]
    refused = [
        (e["workspace"], e["code"], e.get("voter", e["answered_by"]), e["channel"])
        for e in exported
        if e["kind"] == "refused"
    ]
    assert Counter(refused) == Counter(
        {(str(two), "already_voted", "alice", "http"): 1,
         (str(owned), "owner_may_not_approve", me, "http"): 1}
    ), refused  # fmt: skip
    [handover] = [e for e in exported if e["kind"] == "handover"]
    assert (handover["from"], handover["to"], handover["note"]) == ("alice", "bob", "your turn")
    assert handover["workspace"] == str(two) and handover["request_id"] == two_rid


def test_an_agents_policy_asks_two_and_the_run_records_both(tmp_path: Path, fake: FakeLLM) -> None:
    """The agent's `approvals_required: 2` reaches the question through the engine; two tokens
    approve and the real `delta run` resumes once, the call runs, and the journal, the
    history and `delta status` name both."""
    root = tmp_path / "root"
    root.mkdir()
    policy = "approval:\n  require: [deploy]\n  approvals_required: 2\n"
    agent = write_agent(tmp_path, GATED_TOOLS_FOR_DAEMON, policy, name="gated")
    fake.reply(None, tool_call("deploy", {"env": "prod"}, id="d1"))
    fake.reply("done")
    ws = root / "ws"
    ws.mkdir()
    out = subprocess.run(
        [DELTA, "run", "--agent", str(agent), "--task", "ship", "--work-dir", str(ws)],
        env=llm_env(fake),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 101, out.stderr
    assert (
        json.loads((ws / ".delta/interaction/request.json").read_text())["approvals_required"] == 2
    )
    real = ["delta", "run", "--work-dir", "{workspace}"]
    d = Daemon(tmp_path, [root], resume_command=real, http={"listen": "127.0.0.1:0"})
    d.start(env=llm_env(fake))
    try:
        url = http_url(d)
        alice, bob = make_token(d.state_dir, "alice"), make_token(d.state_dir, "bob")
        with client(url, alice) as a, client(url, bob) as b:
            [q] = wait_for(lambda: a.get("/v1/requests").json()["requests"], "the question")
            body = {"decisions": [{"action_id": "d1", "decision": "approve"}]}
            path = f"/v1/requests/{q['request_id']}/answer"
            assert a.post(path, json=body).json()["answered"] is False
            assert b.post(path, json=body).json()["answered"] is True
            wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run to complete")
            assert (ws / "deployed.txt").read_text().strip() == "prod"
            [h] = [x for x in a.get("/v1/history").json()["history"] if x["kind"] == "answered"]
            assert h["answered_by"] == "alice, bob"
            assert [v["by"] for v in h["approvals"]] == ["alice", "bob"]
    finally:
        d.stop()
        d.kill_children()
    [answered] = [
        json.loads(x)["payload"]
        for x in (ws / ".delta/runs")
        .glob("*/execution/journal.jsonl")
        .__next__()
        .read_text()
        .splitlines()
        if '"answered"' in x and '"HUMAN_INTERACTION"' in x
    ]
    assert [v["by"] for v in answered["reply"]["approvals"]] == ["alice", "bob"]
    status = subprocess.run(
        [DELTA, "status", "--work-dir", str(ws)], capture_output=True, text=True
    )
    assert "alice, bob" in status.stdout, status.stdout


def test_votes_by_mail_and_from_slack_are_receipts_and_a_swap_is_named_moved(
    tmp_path: Path,
    postfix: Mta,  # noqa: F811  (the fixture imported above)
) -> None:
    """Under `approvals_required: 2` alice votes by mail (the question waits: `email_voted`)
    and bob from Slack (the quorum: the answer); `deltad audit export` has each vote as one
    entry with its channel and origin (the mail's Message-ID; the Slack user and the message
    clicked), each with its `approval_vote` line; two export lines swapped verify as moved."""
    from tests.e2e.test_email_channel import _mail, _reply
    from tests.mta import DELTAD_DOMAIN, PEOPLE_DOMAIN
    from tests.support.slackapi import SlackApi, interaction

    alice, slack_bob = f"alice@{PEOPLE_DOMAIN}", "U0BOB"
    root = tmp_path / "root"
    root.mkdir()
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "token").write_text("xoxb-four-eyes\n")
    (secrets / "signing").write_text("signing-secret-four-eyes\n")
    email = {
        "from_address": f"deltad@{DELTAD_DOMAIN}",
        "reply_domain": DELTAD_DOMAIN,
        "maildir": str(postfix.deltad_maildir),
        "smtp": {"host": "127.0.0.1", "port": postfix.port, "ca_file": str(postfix.cert)},
        "people": {alice: "alice"},
        "poll_seconds": 0.2,
        # This MTA checks no DKIM (test_email_channel.py's last test does): a vote by mail
        # counts here without the MTA's verdict.
        "authentication": "off",
    }
    with SlackApi(token="xoxb-four-eyes") as api:
        slack = {
            "token": {"secret_file": str(secrets / "token")},
            "signing_secret": {"secret_file": str(secrets / "signing")},
            "channel": "C0DELTAD",
            "users": {slack_bob: "bob"},
            "api_url": api.url,
        }
        d = Daemon(
            tmp_path,
            [root],
            http={"listen": "127.0.0.1:0"},
            channels={"email": email, "slack": slack},
        ).start()
        try:
            url = http_url(d)
            ws = root / "fruit"  # asked once the daemon is up: the channels announce it
            paused_workspace(
                ws, "Fruit?", input_type="choice", options=OPTIONS, approvals_required=2
            )
            rid = _rid(ws)
            [asked] = wait_for(lambda: _mail(postfix, alice, rid, "[deltad]"), "alice's mail")
            vote = _reply(str(asked["Reply-To"]), alice, "Pear")
            vote["Message-ID"] = f"<alice-vote@{PEOPLE_DOMAIN}>"
            postfix.send(vote)
            [voted] = d.wait_event("email_voted", request_id=rid)
            assert voted["voter"] == "alice" and not d.events("email_answered")
            assert not (ws / ".delta/interaction/response.json").exists()

            [post] = wait_for(
                lambda: [c for c in api.calls("chat.postMessage") if rid in json.dumps(c.args)],
                "the question posted to Slack",
            )
            [actions] = [b for b in post.args["blocks"] if b["type"] == "actions"]
            [pear] = [e for e in actions["elements"] if e["text"]["text"] == "Pear"]
            press = {
                "type": "block_actions",
                "user": {"id": slack_bob},
                "trigger_id": "trigger-bob",
                "channel": {"id": "C0DELTAD"},
                "container": {"channel_id": "C0DELTAD", "message_ts": post.result["ts"]},
                "actions": [{"action_id": pear["action_id"], "value": pear["value"]}],
            }
            body, headers = interaction(press, "signing-secret-four-eyes")
            r = httpx.post(
                url + "/v1/channels/slack/interactions", content=body, headers=headers, timeout=30
            )
            assert r.status_code == 200, r.text
            d.wait_event("slack_answered", request_id=rid)
            d.wait_event("resume_spawned", workspace=str(ws))
            wait_for(
                lambda: any(
                    json.loads(x)["kind"] == "decision"
                    for x in (d.state_dir / "audit.jsonl").read_text().splitlines()
                ),
                "the decision's receipt",
            )
        finally:
            d.stop()
    lines = [
        (e["channel"], e["voter"], e["outcome"]) for e in d.events("approval_vote", request_id=rid)
    ]
    assert lines == [("email", "alice", "pending"), ("slack", "bob", "answered")]
    export = subprocess.run(
        [DELTAD, "audit", "export", "--state-dir", str(d.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert export.returncode == 0, export.stderr
    entries = [json.loads(x) for x in export.stdout.splitlines()]
    votes = [e for e in entries if e["kind"] == "vote"]
    assert [(e["channel"], e["voter"], e["quorum"]["outcome"]) for e in votes] == [
        ("email", "alice", "pending"),
        ("slack", "bob", "answered"),
    ]
    by_mail, by_slack = (e["origin"] for e in votes)
    assert by_mail["message_id"] == f"<alice-vote@{PEOPLE_DOMAIN}>" and by_mail["from"] == alice
    assert (by_slack["user"], by_slack["message_ts"]) == (slack_bob, post.result["ts"])
    [decision] = [e for e in entries if e["kind"] == "decision"]
    assert (decision["channel"], decision["answered_by"]) == ("slack", "alice, bob")
    audit = [DELTAD, "audit", "verify"]
    ok = subprocess.run([*audit, "-"], input=export.stdout, capture_output=True, text=True)
    assert ok.returncode == 0 and f"{len(entries)} entries" in ok.stdout, ok.stderr
    # Two lines swapped (bob's vote and the decision): named as moved, not as a dropped entry.
    swapped = export.stdout.splitlines(keepends=True)
    assert len(swapped) == 3
    swapped[1], swapped[2] = swapped[2], swapped[1]
    moved = tmp_path / "swapped.jsonl"
    moved.write_text("".join(swapped))
    own = subprocess.run([*audit, "--state-dir", str(d.state_dir)], capture_output=True, text=True)
    assert own.returncode == 0, own.stderr  # the daemon's own log is untouched
    bad = subprocess.run([*audit, str(moved)], capture_output=True, text=True)
    assert bad.returncode == 2, bad
    assert "entry seq 3 (line 2): seq 3 where 2 was expected" in bad.stderr, bad.stderr
    assert "(an entry was moved: seq 2 is at line 3)" in bad.stderr, bad.stderr
