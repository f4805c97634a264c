"""Names are bytes: a workspace whose name is not UTF-8 is served like any other, and no string
from a file (a prompt, a request id) prints a line of its choosing on a terminal."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from deltad.protocol.printable import show_path
from deltad.testing import FakeLLM
from tests.support.daemon import DELTAD, Daemon, answer, paused_workspace, wait_for
from tests.support.inbox import EventReader, client, make_token

from ..conftest import Delta
from ..users import accounts, chown_tree, executable_by_all, need_root, shared_tmp


def _bytes_name(parent: Path, name: bytes) -> Path:
    return Path(os.fsdecode(os.fsencode(parent) + b"/" + name))


def _deltad_status(d: Daemon, *extra: str) -> subprocess.CompletedProcess[bytes]:
    argv = [DELTAD, "status", "--state-dir", str(d.state_dir), *extra]
    return subprocess.run(argv, capture_output=True, timeout=60)


def test_a_workspace_named_in_bytes_is_watched_listed_and_resumed(tmp_path: Path) -> None:
    need_root()
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        bob = acc.user()
        root = base / "root"
        ok = root / "alice" / "ok"
        bad, twin = _bytes_name(root / "bob", b"y\xfd"), _bytes_name(root / "bob", b"y\xfe")
        for ws, prompt in ((ok, "alice?"), (bad, "bob y-fd?"), (twin, "bob y-fe?")):
            ws.parent.mkdir(parents=True, exist_ok=True)
            paused_workspace(ws, prompt=prompt)
        chown_tree(root / "bob", bob)  # any user may name a directory so
        home = base / "daemon"
        home.mkdir()
        home.chmod(0o1777)  # the stand-in resume, run as the owner, records here
        d = Daemon(home, [root], http={"listen": "127.0.0.1:0"})
        d.record.touch()
        d.record.chmod(0o666)  # the resumes of root and of bob both record here
        d.record.touch()
        d.record.chmod(0o666)  # the resumes of root and of bob both record here
        d.start()  # READY, where a name that is not UTF-8 used to kill the daemon
        try:
            d.stop()
            d.start(wait=False)  # ... and every restart with it
            d.wait_event("daemon_ready", count=2)
            url = str(d.wait_event("http_listening", count=2)[-1]["url"])
            shown = {show_path(bad), show_path(twin), str(ok)}
            assert show_path(bad).endswith("/bob/y\\xfd")

            def listed() -> dict[str, dict[str, str]] | None:
                got = {q["workspace"]: q for q in http.get("/v1/requests").json()["requests"]}
                return got if set(got) == shown else None

            ops = make_token(d.state_dir, "ops", str(root))
            stream = EventReader(url, ops)
            with client(url, ops) as http:
                qs = wait_for(listed, "the three questions, two names escaped and distinct")
                assert qs[show_path(bad)]["prompt"] == "bob y-fd?"
                assert qs[show_path(twin)]["prompt"] == "bob y-fe?"
                mine = http.get("/v1/requests", params={"workspace": show_path(bad)}).json()
                assert [q["prompt"] for q in mine["requests"]] == ["bob y-fd?"]
                where = {"workspace": show_path(bad)}  # a shown name comes back as the path
                run = http.get(f"/v1/runs/{qs[show_path(bad)]['run_id']}", params=where)
                assert run.status_code == 200 and run.json()["workspace"] == show_path(bad)
                with client(url, make_token(d.state_dir, "alice", str(ok.parent))) as alice:
                    r = alice.get(f"/v1/runs/{run.json()['run_id']}", params=where)
                    # outside the scope: the same answer as no workspace at all (no probing)
                    assert r.status_code == 404 and r.json()["code"] == "unknown_workspace"

                def status_lists_them() -> str | None:
                    # status.json is rewritten at most once a second: the reads after READY
                    # that the listing above saw may not be in it yet
                    out = _deltad_status(d)
                    assert out.returncode == 0, out.stderr
                    text = out.stdout.decode("utf-8")  # strict: nothing undecodable printed
                    return text if show_path(bad) in text and show_path(twin) in text else None

                wait_for(status_lists_them, "deltad status listing both names escaped")
                doc = json.loads(_deltad_status(d, "--json").stdout)
                assert set(doc["workspaces"]) == shown
                argv = [DELTAD, "check", "--config", str(d.config_path)]
                checked = subprocess.run(argv, capture_output=True, timeout=60)
                assert checked.returncode == 0, checked.stderr
                listed_ws = checked.stdout.decode("utf-8").splitlines()  # strict, as above
                assert {f"  workspace {x}" for x in shown} <= set(listed_ws)

                answer(ok, "Ada")
                d.wait_resumed(ok)
                rid = qs[show_path(bad)]["request_id"]
                r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "Bob"})
                assert r.status_code == 202, r.text
                assert r.json()["workspace"] == show_path(bad)
            [resumed] = d.wait_resumed(bad)
            stream.wait(
                lambda e: e["type"] == "request.answered" and e["workspace"] == show_path(bad),
                "the event stream naming it as shown",
            )
            stream.close()
            assert json.loads(resumed["answer"])["answer"] == "Bob"
            d.wait_event("resume_exited", workspace=show_path(bad), exit_code=0)
            assert d.resumed(twin) == []  # its twin still waits
            assert os.fsencode(bad).endswith(b"/y\xfd")
        finally:
            d.stop()
            d.kill_children()


def test_a_prompt_and_a_request_id_cannot_print_lines_of_their_choosing(
    tmp_path: Path, fake: FakeLLM, agent: Path
) -> None:
    ws = _bytes_name(tmp_path, b"w\xfd")
    ws.mkdir()
    delta = Delta(ws, fake, agent)
    prompt = "Name?\n\x1b[31mFORGED LINE"
    fake.call("ask_human", {"prompt": prompt, "input_type": "choice", "options": ["a", "b"]})
    fake.reply("done")

    def lines_of(*args: str, typed: bytes = b"") -> tuple[int, list[str]]:
        argv, env = delta.argv(*args), delta.env
        p = subprocess.run(argv, env=env, input=typed, capture_output=True, timeout=60)
        text = (p.stdout + p.stderr).decode("utf-8")  # strict: every byte printed is UTF-8
        assert "\x1b" not in text
        return p.returncode, text.splitlines()

    task = "t\nTASK LINE"
    code, out = lines_of("run", "--agent", str(agent), "--task", task, "--work-dir", str(ws))
    assert code == 101
    assert "  Question: Name?\\n\\x1b[31mFORGED LINE" in out
    pasted = f"$'{show_path(ws)}'"  # bash reads the escapes back: the very bytes
    assert f"  Continue: delta run --work-dir {pasted}   (deltad does this by itself)" in out
    forged = {"request_id": "zz\nINJECTED LINE\x1b[2J", "answer": "a"}
    (ws / ".delta" / "interaction" / "response.json").write_text(json.dumps(forged))
    code, out = lines_of("run", "--work-dir", str(ws))
    assert code == 101
    code, status = lines_of("status", "--work-dir", str(ws))
    assert code == 0
    code, runs = lines_of("runs", "--work-dir", str(ws))
    assert code == 0 and "t\\nTASK LINE" in runs[0]
    for shown in (out, status, runs):
        assert not [x for x in shown if x.startswith(("INJECTED", "FORGED", "TASK"))], shown
    for shown in (out, status):
        assert any("zz\\nINJECTED LINE\\x1b[2J" in x for x in shown), shown
        assert any("Name?\\n\\x1b[31mFORGED LINE" in x for x in shown), shown
    code, asked = lines_of("run", "-i", "--work-dir", str(ws), typed=b"zz\n")  # then end of input
    assert code == 101 and "[ask_human] Name?\\n\\x1b[31mFORGED LINE" in asked, asked
    code, said = lines_of("respond", "a", "--work-dir", str(ws))
    assert code == 0 and pasted in "\n".join(said)
