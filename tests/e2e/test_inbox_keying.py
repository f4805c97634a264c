"""Which question an HTTP answer reaches, end to end: a request id names a question only within
its workspace (a copied id never routes an answer to another tenant), what gets 202 is what
the resume will take, an Idempotency-Key belongs to one question, agent configs are read only
as the workspace's owner could, an expired question is 410, and a question is answerable the
moment `delta run` exits 101. Real `deltad serve --listen`, real `delta`, real users."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deltad.protocol import (
    InputType,
    InteractionRequest,
    Mailbox,
    Workspace,
    load_metadata,
    save_metadata,
)
from deltad.protocol.models import GatedCall
from deltad.testing import FakeLLM
from deltad.testing.stub import paused_workspace
from tests.support.daemon import Daemon, metadata_status, wait_for
from tests.support.inbox import WebhookReceiver, client, http_url, make_token

from ..conftest import llm_env, write_agent
from ..users import User, accounts, chown_tree, executable_by_all, need_root, shared_tmp

DELTA = str(Path(sys.executable).parent / "delta")
REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]


def _run(fake: FakeLLM, tmp: Path, ws: Path) -> subprocess.CompletedProcess[str]:
    ws.mkdir(parents=True, exist_ok=True)
    agent = write_agent(tmp)
    return subprocess.run(
        [DELTA, "run", "--agent", str(agent), "--task", "paint", "--work-dir", str(ws)],
        env=llm_env(fake),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _pause(fake: FakeLLM, tmp: Path, ws: Path) -> str:
    """`delta run` until it exits 101; the request id it left in the mailbox."""
    out = _run(fake, tmp, ws)
    assert out.returncode == 101, out.stderr
    return str(
        json.loads((ws / ".delta" / "interaction" / "request.json").read_text())["request_id"]
    )


def _asked_in_journal(ws: Path) -> str:
    runs = ws / ".delta" / "runs"
    journal = runs / (runs / "LATEST").read_text().strip() / "execution" / "journal.jsonl"
    for line in journal.read_text().splitlines():
        event = json.loads(line)
        payload = event.get("payload") or {}
        if event["type"] == "HUMAN_INTERACTION" and payload.get("phase") == "asked":
            return str(payload["request"]["request_id"])
    raise AssertionError("no question asked in the journal")


@pytest.fixture
def served(tmp_path: Path, fake: FakeLLM) -> Iterator[tuple[Daemon, str, Path]]:
    root = tmp_path / "root"
    root.mkdir()
    # Runs started by hand are known at once only where `.delta/runs/` is watched: the fanotify
    # mark (with inotify, at the next full reconcile; docs/daemon.md, "Watching").
    roots = [{"path": str(root), "backend": "fanotify"}]
    d = Daemon(tmp_path, roots, resume_command=REAL_CLIENT, http={"listen": "127.0.0.1:0"}).start(
        env=llm_env(fake)
    )
    try:
        yield d, http_url(d), root
    finally:
        d.stop()
        d.kill_children()


def _listed(http: Any, n: int) -> list[dict[str, Any]]:
    def enough() -> list[dict[str, Any]] | None:
        qs: list[dict[str, Any]] = http.get("/v1/requests").json()["requests"]
        return qs if len(qs) == n else None

    return wait_for(enough, f"{n} questions listed")


# -- a request id is a name within a workspace --------------------------------------------------
def _staged(stage: Path, dest: Path, owner: User, prompt: str, request_id: str | None) -> str:
    """A paused workspace (a password question) made aside, given to `owner`, then moved into
    the watched root in one rename, so the daemon sees it whole."""
    run_id = paused_workspace(stage, prompt=prompt)
    (stage / ".delta" / "interaction" / "request.json").unlink()
    req = InteractionRequest(
        prompt=prompt, input_type=InputType.PASSWORD, run_id=run_id, action_id="act_1"
    )
    if request_id is not None:
        req = req.model_copy(update={"request_id": request_id})
    Mailbox(Workspace.at(stage)).post(req)
    chown_tree(stage, owner)
    stage.rename(dest)
    return req.request_id


def test_a_copied_request_id_never_routes_an_answer_to_another_tenant() -> None:
    need_root()
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        bob_user, mallory_user = acc.user(), acc.user()
        root, stage, home = base / "root", base / "stage", base / "daemon"
        for p in (root, stage, home):
            p.mkdir()
        home.chmod(0o1777)  # the stand-in resume, run as the owner, records here
        hook = WebhookReceiver()
        notify = {"answer_links": True, "webhooks": [{"url": hook.url}]}
        http_settings = {"listen": "127.0.0.1:0"}
        d = Daemon(home, [root], mode="hold", http=http_settings, notify=notify).start()
        try:
            url = http_url(d)
            bob, mallory = root / "bob", root / "mallory"
            rid = _staged(stage / "bob", bob, bob_user, "Bob's password?", None)
            bobs = make_token(d.state_dir, "bob", str(bob))
            admin = make_token(d.state_dir, "ops", str(root))
            with client(url, admin) as ops:
                _listed(ops, 1)
                # Mallory copies Bob's id (it is in his link, the webhooks, the stream).
                _staged(stage / "mallory", mallory, mallory_user, "Mallory's copy", rid)
                assert {q["request_id"] for q in _listed(ops, 2)} == {rid}
                wait_for(
                    lambda: ops.get(f"/v1/requests/{rid}").status_code == 409,
                    "the daemon's index holding both",
                )
                r = ops.post(f"/v1/requests/{rid}/answer", json={"answer": "from ops"})
                assert r.status_code == 409 and r.json()["code"] == "ambiguous_request"
                assert sorted(r.json()["workspaces"]) == [str(bob), str(mallory)]
            with client(url, bobs) as http:
                q = http.get(f"/v1/requests/{rid}")
                assert q.status_code == 200 and q.json()["prompt"] == "Bob's password?"

            def bobs_link() -> str | None:
                for _, body in hook.received:
                    doc = json.loads(body)
                    if doc["type"] == "request.created" and doc["workspace"] == str(bob):
                        return str(doc["answer_link"])
                return None

            token = wait_for(bobs_link, "Bob's signed link").rsplit("/", 1)[1]
            with client(url) as anon:
                assert anon.get(f"/v1/links/{token}").json()["prompt"] == "Bob's password?"
                r = anon.post(f"/v1/links/{token}/answer", json={"answer": "hunter2"})
                assert r.status_code == 202 and r.json()["workspace"] == str(bob)
            with client(url, bobs) as http:  # his own question, which the link answered
                r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "again"})
                assert r.status_code == 409 and r.json()["code"] == "answer_waiting"
            answer = bob / ".delta" / "interaction" / "response.json"
            assert answer.stat().st_uid == bob_user.uid  # the held resume has not taken it
            assert not (mallory / ".delta" / "interaction" / "response.json").exists()
            (d.record.parent / (d.record.name + ".go")).touch()
            d.wait_resumed(bob)
        finally:
            d.stop()
            d.kill_children()
            hook.close()


def test_copies_of_one_workspace_are_each_answered_by_name(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    options = ["Red", "Blue"]
    fake.call("ask_human", {"prompt": "Pick", "input_type": "choice", "options": options})
    fake.reply("painted")
    first, second = root / "ws1", root / "ws2"
    rid = _pause(fake, tmp_path, first)
    with client(url, make_token(d.state_dir, "ops")) as http:
        _listed(http, 1)
        shutil.copytree(first, tmp_path / "copy", symlinks=True)
        (tmp_path / "copy").rename(second)
        assert sorted(q["workspace"] for q in _listed(http, 2)) == [str(first), str(second)]
        # Listed at once (read from the disk); ambiguous once the daemon's index has the copy.
        r = wait_for(
            lambda: (r := http.get(f"/v1/requests/{rid}")).status_code == 409 and r,
            "the id ambiguous",
        )
        assert r.json()["workspaces"] == [str(first), str(second)]
        named = {"workspace": str(second)}
        assert http.get(f"/v1/requests/{rid}", params=named).json()["workspace"] == str(second)
        r = http.post(f"/v1/requests/{rid}/answer", params=named, json={"answer": "b"})
        assert r.status_code == 202 and r.json()["workspace"] == str(second)
        wait_for(lambda: metadata_status(second) == "COMPLETED", "the copy's run completed")
        assert metadata_status(first) == "WAITING_FOR_INPUT"
        assert http.get(f"/v1/requests/{rid}").json()["workspace"] == str(first)


# -- what gets 202 is delivered -------------------------------------------------------------------
def test_an_answer_over_the_size_the_resume_reads_is_refused_and_nothing_is_written(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    fake.call("ask_human", {"prompt": "Name?"}, id="ask1").reply("hello")
    ws = root / "ws1"
    rid = _pause(fake, tmp_path, ws)
    with client(url, make_token(d.state_dir, "alice")) as http:
        _listed(http, 1)  # the daemon has seen it (this test is not about read-through)
        path = f"/v1/requests/{rid}/answer"
        # Over what the resume reads (1 MiB) but under the HTTP body cap, so it is the answering
        # path that refuses it (a body over the cap is refused unread: test_inbox_bounds.py).
        r = http.post(path, json={"answer": "Ada", "comment": "c" * (1024 * 1024 + 1024)})
        assert r.status_code == 413 and r.json()["code"] == "too_large", r.text
        assert "limit" in r.json()["error"] and "\n" not in r.json()["error"]
        assert not (ws / ".delta" / "interaction" / "response.json").exists()
        assert http.post(path, json={"answer": "Ada"}).status_code == 202
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run resumed and completed")
    assert "Ada" in fake.tool_results()["ask1"]


def test_an_idempotency_key_reused_on_another_question_answers_that_question(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    fake.call("ask_human", {"prompt": "Name?"}, id="ask1")
    fake.call("ask_human", {"prompt": "Name?"}, id="ask2")
    fake.reply("hello").reply("hello")
    first, second = root / "ws1", root / "ws2"
    one, two = _pause(fake, tmp_path, first), _pause(fake, tmp_path, second)
    key = {"Idempotency-Key": "same-key"}
    with client(url, make_token(d.state_dir, "ci")) as http:
        _listed(http, 2)
        a = http.post(f"/v1/requests/{one}/answer", json={"answer": "Ada"}, headers=key)
        b = http.post(f"/v1/requests/{two}/answer", json={"answer": "Ada"}, headers=key)
        assert (a.status_code, b.status_code) == (202, 202)
        assert (a.json()["request_id"], b.json()["request_id"]) == (one, two)
    for ws in (first, second):
        wait_for(lambda ws=ws: metadata_status(ws) == "COMPLETED", f"{ws.name} completed")


# -- agent configs, read as the owner would --------------------------------------------------------
def _agent(home: Path, secret: str) -> None:
    param = {"name": "target", "description": secret}
    tool = {
        "name": "deploy",
        "description": secret,
        "exec": "echo ${target}",
        "parameters": [param],
    }
    write_agent(home.parent, json.dumps([tool]), name=home.name)


def _gated(stage: Path, dest: Path, owner: User, agent_ref: Path) -> None:
    run_id = paused_workspace(stage, prompt="Deploy?")
    paths = Workspace.at(stage).run(run_id)
    meta = load_metadata(paths.metadata)
    save_metadata(paths.metadata, meta.model_copy(update={"agent_ref": str(agent_ref)}))
    (stage / ".delta" / "interaction" / "request.json").unlink()
    call = GatedCall(action_id="act_1", tool_name="deploy", arguments={"target": "prod"})
    req = InteractionRequest(
        prompt="Deploy?",
        input_type=InputType.APPROVAL,
        run_id=run_id,
        action_id="act_1",
        calls=[call],
    )
    Mailbox(Workspace.at(stage)).post(req)
    chown_tree(stage, owner)
    stage.rename(dest)


def test_an_agent_config_the_owner_could_not_read_or_others_could_plant_is_not_shown() -> None:
    need_root()
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        mallory = acc.user()
        root, stage, home = base / "root", base / "stage", base / "daemon"
        for p in (root, stage, home):
            p.mkdir()
        home.chmod(0o1777)
        agents = base / "agents"
        agents.mkdir()
        _agent(agents / "root-only" / "agent", "ROOT-ONLY-SCHEMA")
        (agents / "root-only").chmod(0o700)
        _agent(agents / "shared", "PLANTED-SCHEMA")
        (agents / "shared").chmod(0o777)  # anyone could have written it
        _agent(agents / "hers", "HER-OWN-SCHEMA")
        chown_tree(agents / "hers", mallory)
        (agents / "via-link").symlink_to(agents / "hers")
        cases = {
            "root-only": agents / "root-only" / "agent",
            "shared": agents / "shared",
            "via-link": agents / "via-link",
            "hers": agents / "hers",
        }
        d = Daemon(home, [root], mode="hold", http={"listen": "127.0.0.1:0"}).start()
        try:
            url = http_url(d)
            for name, agent_ref in cases.items():
                _gated(stage / name, root / name, mallory, agent_ref)
            with client(url, make_token(d.state_dir, "mallory", str(root))) as http:
                shown = {Path(q["workspace"]).name: q for q in _listed(http, len(cases))}
                text = json.dumps(shown)
        finally:
            d.stop()
            d.kill_children()
    assert "HER-OWN-SCHEMA" in json.dumps(shown["hers"]["calls"][0]["schema"])
    assert "agent_error" not in shown["hers"]
    assert "ROOT-ONLY-SCHEMA" not in text and "PLANTED-SCHEMA" not in text
    reasons = {
        "root-only": "not readable by the workspace's owner",
        "shared": "writable by others",
        "via-link": "symlink",
    }
    for name, why in reasons.items():
        assert "schema" not in shown[name]["calls"][0]
        assert why in shown[name]["agent_error"] and "\n" not in shown[name]["agent_error"]


# -- 410, and no gap after `delta run` exits 101 ---------------------------------------------------
def test_an_expired_question_is_410_after_the_run_moved_on(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    ask = {"prompt": "Soon?", "timeout_seconds": 1, "default": "later"}
    fake.call("ask_human", ask, id="ask1").reply("done")
    ws = root / "ws1"
    out = _run(fake, tmp_path, ws)
    assert out.returncode == 101, out.stderr
    # From the journal: with a 1 s deadline the daemon may resume (and clear the mailbox) before
    # this test could read request.json.
    rid = _asked_in_journal(ws)
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run went on with the default")
    with client(url, make_token(d.state_dir, "alice")) as http:
        r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "now"})
        assert r.status_code == 410 and r.json()["code"] == "expired", r.text


def test_a_question_is_answerable_the_moment_delta_run_exits_101(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    d, url, root = served
    fake.reply("first run done")
    fake.call("ask_human", {"prompt": "Name?"}, id="ask1").reply("hello")
    ws = root / "ws1"
    with client(url, make_token(d.state_dir, "alice")) as http:
        # A workspace the daemon knows (an earlier run finished) gets a new question.
        first = _run(fake, tmp_path, ws)
        assert first.returncode == 0, first.stderr
        wait_for(lambda: http.get("/v1/runs").json()["runs"], "the finished run listed")
        rid = _pause(fake, tmp_path, ws)
        r = http.get(f"/v1/requests/{rid}")
        assert r.status_code == 200 and r.json()["prompt"] == "Name?", r.text
        assert http.post(f"/v1/requests/{rid}/answer", json={"answer": "Ada"}).status_code == 202
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed")
