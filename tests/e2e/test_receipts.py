"""Approvals bound to the call and receipts, through a real `deltad serve --listen`: a call
changed on disk after it was asked is refused at resume (it never runs, the run says why);
every decision (over HTTP, by `delta respond`) leaves a receipt in the hash-chained audit log,
which `deltad audit export` writes out and `deltad audit verify` checks, naming a tampered
entry."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deltad.protocol.calldigest import call_digest
from deltad.testing import FakeLLM, tool_call
from tests.support.daemon import DELTAD, Daemon, metadata_status, wait_for
from tests.support.inbox import client, http_url, make_token

from ..conftest import GATED_TOOLS_FOR_DAEMON, Delta, llm_env, write_agent

DELTA = str(Path(sys.executable).parent / "delta")
REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]
POLICY = "approval:\n  require: [deploy]\n"


def _delta(fake: FakeLLM, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DELTA, *args], env=llm_env(fake), capture_output=True, text=True, timeout=60
    )


def _pause(fake: FakeLLM, agent: Path, ws: Path) -> None:
    ws.mkdir(parents=True, exist_ok=True)
    out = _delta(fake, "run", "--agent", str(agent), "--task", "ship", "--work-dir", str(ws))
    assert out.returncode == 101, out.stderr


def _journal_path(ws: Path) -> Path:
    rid = (ws / ".delta" / "runs" / "LATEST").read_text().strip()
    return ws / ".delta" / "runs" / rid / "execution" / "journal.jsonl"


def _journal(ws: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in _journal_path(ws).read_text().splitlines() if x.strip()]


def _audit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DELTAD, "audit", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def served(tmp_path: Path, fake: FakeLLM) -> Iterator[tuple[Daemon, str, Path]]:
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], resume_command=REAL_CLIENT, http={"listen": "127.0.0.1:0"}).start(
        env=llm_env(fake)
    )
    try:
        yield d, http_url(d), root
    finally:
        d.stop()
        d.kill_children()


def test_a_call_changed_on_disk_after_it_was_asked_is_refused_at_resume(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    agent = write_agent(tmp_path, GATED_TOOLS_FOR_DAEMON, POLICY, name="gated")
    fake.reply(None, tool_call("deploy", {"env": "staging"}, id="d1"))
    fake.reply("done")
    ws = root / "ws1"
    _pause(fake, agent, ws)
    # The call as asked (request.json, the journal's question) says staging; now the model's
    # call in the journal, which the resume runs, is made to say prod.
    path = _journal_path(ws)
    lines = path.read_text().splitlines(keepends=True)
    changed = [
        line.replace('\\"staging\\"', '\\"prod\\"') if '"HUMAN_INTERACTION"' not in line else line
        for line in lines
    ]
    assert changed != lines, "the model's call is in the journal"
    path.write_text("".join(changed))
    http = client(url, make_token(d.state_dir, "alice"))
    [q] = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question")
    assert q["calls"][0]["arguments"] == {"env": "staging"}  # what alice approves
    body = {"decisions": [{"action_id": "d1", "decision": "approve"}]}
    r = http.post(f"/v1/requests/{q['request_id']}/answer", json=body)
    assert r.status_code == 202, r.text
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run to complete")
    assert not (ws / "deployed.txt").exists()  # the changed call never ran
    events = _journal(ws)
    [answered] = [
        e["payload"]
        for e in events
        if e["type"] == "HUMAN_INTERACTION" and e["payload"]["phase"] == "answered"
    ]
    approved = call_digest("deploy", {"env": "staging"})
    assert answered["reply"]["decisions"][0]["digest"] == approved
    [result] = [e["payload"] for e in events if e["type"] == "ACTION_RESULT"]
    assert result["status"] == "FAILED" and "Refused at resume" in result["observation_content"]
    assert approved in result["observation_content"]
    assert call_digest("deploy", {"env": "prod"}) in result["observation_content"]
    assert "Refused at resume" in fake.tool_results()["d1"]  # the model is told
    # An answer that names the digest of a call other than the one asked is refused at once.
    fake.reply(None, tool_call("deploy", {"env": "dev"}, id="d2"))
    fake.reply("done")
    ws2 = root / "ws2"
    _pause(fake, agent, ws2)
    rid = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question")[0][
        "request_id"
    ]
    stale = {"action_id": "d2", "decision": "approve", "digest": approved}
    r = http.post(f"/v1/requests/{rid}/answer", json={"decisions": [stale]})
    assert r.status_code == 422 and "changed since it was shown" in r.text, r.text


def _change_the_call(path: Path, old: str, new: str) -> None:
    """The model's call in the journal (not the question's record of it) made to say `new`."""
    lines = path.read_text().splitlines(keepends=True)
    changed = [x.replace(old, new) if '"HUMAN_INTERACTION"' not in x else x for x in lines]
    assert changed != lines
    path.write_text("".join(changed))


@pytest.mark.parametrize(
    ("answer", "file"),
    [
        ("approve", "response.txt"),  # plain text: bound to the call as asked
        (  # an edit binds its own arguments: a changed tool name is still refused
            {"decisions": [{"action_id": "d1", "decision": "edit", "arguments": {"env": "dev"}}]},
            "response.json",
        ),
    ],
)
def test_without_the_daemon_a_changed_call_is_refused_too(
    tmp_path: Path, fake: FakeLLM, answer: Any, file: str
) -> None:
    tools = GATED_TOOLS_FOR_DAEMON + '  - name: destroy\n    shell: "echo ${env} > destroyed.txt"\n'
    agent = write_agent(tmp_path, tools, "approval:\n  require: [deploy, destroy]\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    d = Delta(ws, fake, agent)
    fake.reply(None, tool_call("deploy", {"env": "staging"}, id="d1"))
    fake.reply("done")
    assert d.start("ship").code == 101
    if file == "response.txt":
        _change_the_call(_journal_path(ws), '\\"staging\\"', '\\"prod\\"')
    else:
        _change_the_call(_journal_path(ws), '"name":"deploy"', '"name":"destroy"')
    box = ws / ".delta" / "interaction" / file
    rid = d.request()["request_id"]
    box.write_text(answer if isinstance(answer, str) else json.dumps({**answer, "request_id": rid}))
    r = d("run")
    assert r.code == 0, r.err
    assert not (ws / "deployed.txt").exists() and not (ws / "destroyed.txt").exists()
    [result] = d.results()["d1"]
    assert result["status"] == "FAILED" and "Refused at resume" in result["observation_content"]


def test_receipts_of_every_channel_chain_export_verify_and_tampering_is_named(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    agent = write_agent(tmp_path, GATED_TOOLS_FOR_DAEMON, POLICY, name="gated")
    log = d.state_dir / "audit.jsonl"
    http = client(url, make_token(d.state_dir, "alice"))
    # 1. An approval answered over HTTP, edited.
    fake.reply(None, tool_call("deploy", {"env": "staging"}, id="d1"))
    fake.reply("done")
    ws1 = root / "ws1"
    _pause(fake, agent, ws1)
    [q] = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the question")
    edit = {"action_id": "d1", "decision": "edit", "arguments": {"env": "dev"}}
    assert (
        http.post(f"/v1/requests/{q['request_id']}/answer", json={"decisions": [edit]}).status_code
        == 202
    )
    wait_for(lambda: metadata_status(ws1) == "COMPLETED", "ws1 to complete")
    # 2. An approval answered by `delta respond` (a person at a shell).
    fake.reply(None, tool_call("deploy", {"env": "prod"}, id="d2"))
    fake.reply("done")
    ws2 = root / "ws2"
    _pause(fake, agent, ws2)
    out = _delta(fake, "respond", "--work-dir", str(ws2), "--reject", "--as", "bob")
    assert out.returncode == 0, out.stderr
    wait_for(lambda: metadata_status(ws2) == "COMPLETED", "ws2 to complete")
    # 3. A secret answered over HTTP: recorded as answered, never what.
    fake.call("ask_human", {"prompt": "Token?", "input_type": "password"}, id="s1")
    fake.reply("done")
    ws3 = root / "ws3"
    _pause(fake, agent, ws3)
    [q] = wait_for(lambda: http.get("/v1/requests").json()["requests"], "the secret question")
    r = http.post(f"/v1/requests/{q['request_id']}/answer", json={"answer": "hunter2-secret"})
    assert r.status_code == 202, r.text
    wait_for(lambda: metadata_status(ws3) == "COMPLETED", "ws3 to complete")
    # 4. Nobody answers: the deadline decides, and that is recorded too.
    fake.call("ask_human", {"prompt": "Go?", "input_type": "yes_no", "timeout_seconds": 1})
    fake.reply("moved on")
    ws4 = root / "ws4"
    _pause(fake, agent, ws4)
    wait_for(lambda: metadata_status(ws4) in ("COMPLETED", "FAILED"), "ws4 to time out")

    def receipts() -> list[dict[str, Any]]:
        text = log.read_text() if log.exists() else ""
        return [json.loads(x) for x in text.splitlines()]

    entries = wait_for(lambda: len(receipts()) >= 4 and receipts(), "four receipts")
    assert [e["seq"] for e in entries] == [1, 2, 3, 4]
    assert (log.stat().st_mode & 0o777) == 0o600
    one, two, three, four = entries
    assert (one["channel"], one["answered_by"], one["workspace"]) == ("http", "alice", str(ws1))
    [dec] = one["what"]["decisions"]
    assert (dec["decision"], dec["tool_name"], dec["arguments"]) == (
        "edit",
        "deploy",
        {"env": "dev"},
    )
    assert dec["digest"] == call_digest("deploy", {"env": "dev"})
    assert one["request_id"] and one["run_id"] and one["at"]
    assert (two["channel"], two["answered_by"]) == ("cli", "bob")
    assert two["what"]["decisions"][0]["decision"] == "reject"
    assert three["what"] == {"secret": "answered (the value is not recorded)"}
    assert "hunter2" not in log.read_text()
    assert (four["kind"], four["channel"], four["workspace"]) == ("timeout", "deadline", str(ws4))
    assert four["what"]["timeout"].startswith("no answer by ")
    assert two["prev"] == one["hash"] and three["prev"] == two["hash"]

    sd = ["--state-dir", str(d.state_dir)]
    export = _audit("export", *sd)
    assert export.returncode == 0, export.stderr
    assert export.stdout == log.read_text()
    ok = _audit("verify", *sd)
    assert ok.returncode == 0 and f"4 entries (seq 1..4), head {four['hash']}" in ok.stdout, ok
    since = _audit("export", *sd, "--since", two["at"])
    assert [json.loads(x)["seq"] for x in since.stdout.splitlines()][-3:] == [2, 3, 4]
    exported = tmp_path / "export.jsonl"
    exported.write_text(since.stdout)
    assert _audit("verify", "--partial", str(exported)).returncode == 0
    # Piped as the docs say: a piece of the chain, said to be one (not a dropped entry).
    piped = subprocess.run(
        f"{DELTAD} audit export --state-dir {d.state_dir} --since {two['at']} "
        f"| {DELTAD} audit verify -",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.strip() == (
        "audit: ok, partial: it starts at seq 2 (an export --since): the entry before it is "
        f"not checked; 3 entries (seq 2..4), head {four['hash']}"
    )
    # A piece of the chain with a hole in it is still named.
    holed = tmp_path / "holed.jsonl"
    holed.write_text("".join(since.stdout.splitlines(keepends=True)[i] for i in (0, 2)))
    bad = _audit("verify", str(holed))
    assert bad.returncode == 2 and "entry seq 4" in bad.stderr and "dropped" in bad.stderr, bad

    # Tampering: a receipt edited to say "approve" is named; so is a dropped one.
    lines = log.read_text().splitlines(keepends=True)
    forged = tmp_path / "forged.jsonl"
    forged.write_text(lines[0] + lines[1].replace('"reject"', '"approve"') + "".join(lines[2:]))
    bad = _audit("verify", str(forged))
    assert bad.returncode == 2 and "entry seq 2 (line 2)" in bad.stderr, bad
    assert "edited" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    dropped = tmp_path / "dropped.jsonl"
    dropped.write_text(lines[0] + "".join(lines[2:]))
    bad = _audit("verify", str(dropped))
    assert bad.returncode == 2 and "entry seq 3" in bad.stderr and "dropped" in bad.stderr, bad
    short = tmp_path / "short.jsonl"
    short.write_text(lines[0] + lines[1])  # the tail dropped: seen against the recorded head
    bad = _audit("verify", "--head", four["hash"], str(short))
    assert bad.returncode == 2 and "recorded head" in bad.stderr, bad


def test_no_resume_without_its_receipt(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    """A log that will not take the receipt (its last line torn) holds the resume, counted and
    said once; repaired, the same answer resumes with its receipt, the first of the chain."""
    d, url, root = served
    agent = write_agent(tmp_path, GATED_TOOLS_FOR_DAEMON, POLICY, name="gated")
    log = d.state_dir / "audit.jsonl"
    log.write_text('{"seq": 1, "torn')  # a crash in mid-write
    fake.reply(None, tool_call("deploy", {"env": "prod"}, id="d1"))
    fake.reply("done")
    ws = root / "ws"
    _pause(fake, agent, ws)
    out = _delta(fake, "respond", "--work-dir", str(ws), "--approve", "--as", "bob")
    assert out.returncode == 0, out.stderr
    metrics = client(url, make_token(d.state_dir, "prom", role="metrics"))

    def failures() -> float:
        for line in metrics.get("/metrics").text.splitlines():
            if line.startswith("deltad_audit_failures_total "):
                return float(line.split()[1])
        return 0.0

    # Looked at again and held again: a resume that went on would not be tried a second time.
    wait_for(lambda: failures() >= 2, "the resume held twice for its receipt")
    assert metadata_status(ws) == "WAITING_FOR_INPUT"
    assert (ws / ".delta" / "interaction" / "response.json").exists()  # the answer waits
    said = [x for x in d.log_path.read_text().splitlines() if '"audit_failed"' in x]
    assert len(said) == 1
    log.unlink()  # repaired
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the resume, once its receipt is in")
    [entry] = [json.loads(x) for x in log.read_text().splitlines()]
    assert (entry["seq"], entry["answered_by"], entry["workspace"]) == (1, "bob", str(ws))


def test_the_chain_verifies_across_a_rotation(tmp_path: Path) -> None:
    """Past `audit.rotate_bytes` the log is moved aside and the chain goes on in the next file:
    `verify` checks it whole from seq 1 across the files, and `export` writes it whole."""
    from deltad.inbox.audit import rotated
    from deltad.testing.stub import paused_workspace
    from tests.support.daemon import answer

    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], audit={"rotate_bytes": 4096}).start()
    log = d.state_dir / "audit.jsonl"
    try:
        n = 0
        while len(rotated(log)) < 2:
            n += 1
            assert n <= 60, "no two rotations after 60 receipts"
            ws = root / f"ws{n}"
            paused_workspace(ws)
            answer(ws, f"answer {n}")
            d.wait_resumed(ws, 1)
    finally:
        d.stop()
        d.kill_children()
    rotations = d.events("audit_rotated")
    assert len(rotations) >= 2
    first = json.loads(log.read_text().splitlines()[0])
    assert first["kind"] == "log_rotated" and first["moved_aside"] == rotations[-1]["moved_aside"]
    ok = _audit("verify", "--state-dir", str(d.state_dir))
    assert ok.returncode == 0, ok.stderr
    total = n + len(rotations)  # a receipt per answer, and an entry per rotation
    assert ok.stdout.startswith(f"audit: ok: {total} entries (seq 1..{total})"), ok.stdout
    export = _audit("export", "--state-dir", str(d.state_dir))
    assert [json.loads(x)["seq"] for x in export.stdout.splitlines()] == list(range(1, total + 1))


def test_anchors_kept_by_the_daemon_find_entries_cut_off_the_end(tmp_path: Path) -> None:
    """The daemon files the chain's head as it moves (`audit.anchor_file`); entries cut off the
    end later leave a chain that verifies alone, and `verify --anchors` names the cut."""
    from deltad.testing.stub import paused_workspace
    from tests.support.daemon import answer

    root, anchors = tmp_path / "root", tmp_path / "anchors.jsonl"
    root.mkdir()
    settings = {"anchor_file": str(anchors), "anchor_every_seconds": 1}
    d = Daemon(tmp_path, [root], audit=settings).start()
    log = d.state_dir / "audit.jsonl"
    try:
        for n in (1, 2):
            ws = root / f"ws{n}"
            paused_workspace(ws)
            answer(ws, f"answer {n}")
            d.wait_resumed(ws, 1)
            wait_for(lambda n=n: d.events("audit_anchored", seq=n), f"the head at seq {n} anchored")
    finally:
        d.stop()
        d.kill_children()
    sd = ("--state-dir", str(d.state_dir))
    ok = _audit("verify", *sd, "--anchors", str(anchors))
    assert ok.returncode == 0 and "2 anchors hold" in ok.stdout, ok.stdout + ok.stderr
    log.write_text(log.read_text().splitlines(keepends=True)[0])  # the last entry cut off
    assert _audit("verify", *sd).returncode == 0  # alone, a shorter chain verifies
    bad = _audit("verify", *sd, "--anchors", str(anchors))
    assert bad.returncode == 2
    assert "names seq 2, but the log ends at seq 1 (entries were cut off its end)" in bad.stderr
