"""Nothing in a workspace can stop deltad, and tools get secrets without argv or model keys.

Real `deltad`/`delta` processes; the multi-user cases are in test_tenant_users.py.
"""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest

from deltad.protocol import Workspace, load_metadata, save_metadata
from deltad.protocol.models import OwnerProcess
from deltad.protocol.states import RunStatus
from deltad.testing import FakeLLM
from tests.support.daemon import answer, metadata_status, paused_workspace, running, wait_for

from ..conftest import Delta, write_agent


def _set_owner_pid(ws: Path, pid: int) -> None:
    w = Workspace.at(ws)
    path = w.run(w.latest_run_id() or "").metadata
    meta = load_metadata(path)
    meta.status = RunStatus.RUNNING
    meta.owner = OwnerProcess(pid=pid, hostname=os.uname().nodename)
    save_metadata(path, meta)


@pytest.mark.parametrize("pid", [2**31, 2**40, 0, -1])
def test_impossible_owner_pids_neither_kill_nor_fool_the_daemon(tmp_path: Path, pid: int) -> None:
    root = tmp_path / "root"
    bad, good = root / "bad", root / "good"
    paused_workspace(bad)
    paused_workspace(good)
    _set_owner_pid(bad, pid)
    with running(tmp_path, [root]) as d:  # a restart used to die again before READY
        wait_for(
            lambda: metadata_status(bad) == "INTERRUPTED", "the impossible owner declared dead"
        )
        answer(good, "still serving")
        assert d.wait_resumed(good)[0]["answer"] == "still serving"


def test_year_one_deadline_is_just_expired(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    paused_workspace(ws, expires_at=datetime(1, 1, 1, tzinfo=UTC))  # asked so: long expired
    with running(tmp_path, [root]) as d:
        d.wait_event("resume_queued", workspace=str(ws), reason="question_expired")
        other = root / "other"
        paused_workspace(other)
        answer(other, "alive")
        assert d.wait_resumed(other)[0]["answer"] == "alive"


@pytest.mark.parametrize(
    "text",
    ["roots: 5\n", "roots: /srv/ws\n", "roots: [\xff]\n", "- just\n- a list\n", "roots: [\n"],
    ids=["number", "string", "not_utf8", "list", "broken_yaml"],
)
def test_any_bad_config_on_sighup_keeps_the_old_one(tmp_path: Path, text: str) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    paused_workspace(ws)
    with running(tmp_path, [root]) as d:
        d.config_path.write_bytes(text.encode("latin-1"))
        d.signal(signal.SIGHUP)
        [failed] = d.wait_event("config_reload_failed")
        assert "\n" not in failed["error"]
        answer(ws, "after the bad reload")
        assert d.wait_resumed(ws)[0]["answer"] == "after the bad reload"


def test_refusal_notes_are_named_never_read(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws, other = root / "ws", root / "other"
    paused_workspace(ws)
    paused_workspace(other)
    box = ws / ".delta" / "interaction"
    os.mkfifo(box / "response.rejected-20990101T000000000000.error")
    with open(box / "response.rejected-20990101T000000000001.error", "wb") as f:
        f.truncate(300 * 1024 * 1024)
        f.write(b"CONTENT-NOT-FOR-LOGS")
    with running(tmp_path, [root]) as d:
        (box / "elsewhere").write_text("x")
        os.symlink(box / "elsewhere", box / "response.txt")  # the stand-in client refuses it
        line = d.wait_event("answer_refused", workspace=str(ws))[0]
        assert line["file"].startswith("response.rejected-")
        answer(other, "next")  # a FIFO did not block the loop
        assert d.wait_resumed(other)[0]["answer"] == "next"
        assert "CONTENT-NOT-FOR-LOGS" not in d.log_path.read_text()


def test_a_run_directory_that_is_a_file_is_one_problem(tmp_path: Path) -> None:
    root = tmp_path / "root"
    bad, good = root / "bad", root / "good"
    paused_workspace(bad)
    paused_workspace(good)
    # A run directory name that is a valid id but a file: every look at it fails oddly.
    w = Workspace.at(bad)
    run = w.run(w.latest_run_id() or "")
    os.rename(run.dir, run.dir.with_name("moved"))
    run.dir.write_text("not a directory")
    with running(tmp_path, [root]) as d:
        d.wait_event("workspace_problem", workspace=str(bad))
        answer(good, "fine")
        assert d.wait_resumed(good)[0]["answer"] == "fine"


# -- tools: secrets not in argv, no model credentials -------------------------------------------
SECRET = "s3cr3t-V4lue-9981"
WAIT = "echo $$ > started.pid; while [ ! -f go ]; do sleep 0.02; done"
TOOLS = f"""
  - name: via_shell
    shell: '{WAIT}; printf %s ${{token}} > seen.txt; env > env.txt'
  - name: via_env
    command: ["sh", "-c", '{WAIT}; printf %s "$TOKEN" > seen.txt']
    parameters: [{{name: token, inject_as: env, env_name: TOKEN}}]
  - name: via_stdin
    command: ["sh", "-c", '{WAIT}; cat > seen.txt']
    parameters: [{{name: token, inject_as: stdin}}]
  - name: via_fd
    exec: 'sh -c "{WAIT}; cat \\"$0\\" > seen.txt" ${{token}}'
    parameters: [{{name: token, inject_as: fd}}]
  - name: via_argv
    exec: "echo ${{token}}"
  - name: via_argv_opted_in
    exec: "sh -c 'printf %s \\"$0\\" > seen.txt' ${{token}}"
    secrets_in_argv: true
"""


def _cmdlines() -> str:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
            except OSError:
                continue
    return "\n".join(out)


@pytest.mark.parametrize("tool", ["via_shell", "via_env", "via_stdin", "via_fd"])
def test_a_secret_reaches_the_tool_but_never_its_argv(
    tmp_path: Path, fake: FakeLLM, tool: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    d = Delta(ws, fake, write_agent(tmp_path, TOOLS))
    fake.call("ask_human", {"prompt": "Token?", "sensitive": True}, id="k")
    fake.call(tool, {"token": "${secret:k}"}, id="t").reply("done")
    assert d.start().code == 101
    assert d("respond", input=SECRET + "\n").code == 0
    proc = d.popen("run")
    wait_for(lambda: (ws / "started.pid").exists(), "the tool to start")
    seen_in_argv = SECRET in _cmdlines()
    (ws / "go").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not seen_in_argv
    assert (ws / "seen.txt").read_text().strip() == SECRET
    assert SECRET not in out + err


def test_argv_secret_is_refused_unless_the_tool_opts_in(tmp_path: Path, fake: FakeLLM) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    d = Delta(ws, fake, write_agent(tmp_path, TOOLS))
    fake.call("ask_human", {"prompt": "Token?", "sensitive": True}, id="k")
    fake.call("via_argv", {"token": "${secret:k}"}, id="a")
    fake.call("via_argv_opted_in", {"token": "${secret:k}"}, id="b").reply("done")
    assert d.start().code == 101
    assert d("respond", input=SECRET + "\n").code == 0
    r = d("run")
    assert r.code == 0, r.err
    assert "not set up to receive secrets safely" in fake.tool_results()["a"]
    assert "secrets_in_argv" in r.err  # the opted-in one warns
    assert (ws / "seen.txt").read_text() == SECRET


def test_tools_do_not_inherit_the_model_key(tmp_path: Path, fake: FakeLLM) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    d = Delta(ws, fake, write_agent(tmp_path, TOOLS))
    fake.call("via_shell", {"token": "plain"}, id="t").reply("done")
    proc = d.popen("run", "--agent", str(d.agent), "--task", "t")
    wait_for(lambda: (ws / "started.pid").exists(), "the tool to start")
    (ws / "go").touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    env = (ws / "env.txt").read_text()
    assert "test-key" not in env and "OPENAI_" not in env and "DELTA_" not in env
    assert "AGENT_HOME=" in env
