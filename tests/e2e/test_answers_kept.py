"""An answer is never silently taken empty, nor silently dropped; and the small things a first
hour hits. Real `delta`/`deltad` processes against the fake model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status

from ..conftest import EXAMPLES, Delta, llm_env, wait_for, write_agent

REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]


def _ask(fake: FakeLLM, id: str = "q", **args: object) -> None:
    fake.call("ask_human", {"prompt": "Name?", **args}, id=id)


# -- empty answers ------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["touch", "whitespace", "respond_empty", "respond_stdin"])
def test_an_empty_answer_is_never_taken(delta: Delta, fake: FakeLLM, how: str) -> None:
    _ask(fake)
    fake.reply("done")
    assert delta.start().code == 101
    box = delta.delta_dir / "interaction"
    if how == "touch":
        (box / "response.txt").touch()
    elif how == "whitespace":
        (box / "response.txt").write_text("  \n\t\n")
    elif how == "respond_empty":
        r = delta("respond", "")
        assert r.code == 2 and "empty" in r.err
        assert not (box / "response.txt").exists()
        return
    else:
        r = delta("respond", input="")
        assert r.code == 2 and "empty" in r.err
        return
    r = delta("run")
    assert r.code == 101 and "empty" in r.err
    assert list(box.glob("response.rejected-*"))  # kept, with the reason
    delta.answer("Ada")
    assert delta("run").code == 0
    assert fake.tool_results()["q"] == "Ada"


def test_an_empty_answer_counts_when_the_question_allows_it(delta: Delta, fake: FakeLLM) -> None:
    _ask(fake, allow_empty=True)
    fake.reply("done")
    assert delta.start().code == 101
    assert delta("respond", "").code == 0
    assert delta("run").code == 0
    assert fake.tool_results()["q"] == ""


def test_the_daemon_does_not_consume_a_file_still_being_edited(
    tmp_path: Path, fake: FakeLLM
) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    ws.mkdir(parents=True)
    d = Delta(ws, fake, write_agent(tmp_path))
    _ask(fake)
    fake.reply("done")
    assert d.start().code == 101
    daemon = Daemon(tmp_path, [root], resume_command=REAL_CLIENT).start(env=llm_env(fake))
    try:
        response = ws / ".delta" / "interaction" / "response.txt"
        response.touch()  # the editor opens a new file...
        [problem] = daemon.wait_event("workspace_problem", workspace=str(ws))
        assert "empty" in problem["problem"]
        assert daemon.events("resume_spawned") == []
        tmp = response.with_name(".response.swp")
        tmp.write_text("Ada\n")
        os.replace(tmp, response)  # ...and saves the real answer seconds later
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the real answer to be taken")
    finally:
        daemon.stop()
        daemon.kill_children()
    assert fake.tool_results()["q"] == "Ada"


# -- two waiting runs, stale answers ---------------------------------------------------------------
def test_resuming_an_older_run_sets_the_waiting_one_aside(delta: Delta, fake: FakeLLM) -> None:
    _ask(fake, "qa")
    assert delta.start("task A").code == 101
    run_a = delta.metadata()["run_id"]
    _ask(fake, "qb")
    r = delta.start("task B", "--new")
    assert r.code == 101 and run_a in r.err
    run_b = delta.metadata()["run_id"]
    r = delta("run", "--run-id", run_a)
    # A waits again (on its re-posted question); B is set aside and says so.
    assert r.code == 101
    assert f"run {run_b} was waiting; it is set aside" in r.err
    statuses = {
        rid: json.loads(
            (delta.delta_dir / "runs" / rid / "execution" / "metadata.json").read_text()
        )["status"]
        for rid in (run_a, run_b)
    }
    assert statuses == {run_a: "WAITING_FOR_INPUT", run_b: "INTERRUPTED"}
    assert delta.request()["run_id"] == run_a
    said = delta("respond", "for A")
    assert said.code == 0 and run_a in said.out
    fake.reply("A done")
    r = delta("run")
    assert r.code == 0 and "A done" in r.out
    results = json.loads(
        (delta.delta_dir / "runs" / run_a / "execution" / "metadata.json").read_text()
    )
    assert results["status"] == "COMPLETED"


def test_an_answer_to_no_open_question_is_kept_and_reported_everywhere(
    tmp_path: Path, fake: FakeLLM
) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    ws.mkdir(parents=True)
    d = Delta(ws, fake, write_agent(tmp_path))
    _ask(fake)
    fake.reply("done")
    # A person stops `delta run -i` at its prompt: the run is INTERRUPTED, no question is posted.
    proc = subprocess.Popen(
        d.argv("run", "-i", "--agent", str(d.agent), "--task", "t"),
        cwd=ws,
        env=d.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    wait_for(lambda: "[ask_human]" in (proc.stdout.readline() or ""), "the terminal prompt")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert d.status() == "INTERRUPTED"
    box = ws / ".delta" / "interaction"
    box.mkdir(exist_ok=True)
    (box / "response.txt").write_text("ANSWER-CONTENT-XYZ")
    daemon = Daemon(
        tmp_path, [root], resume_command=REAL_CLIENT, auto_resume_interrupted=True
    ).start(env=llm_env(fake))
    try:
        [line] = daemon.wait_event("answer_set_aside", workspace=str(ws))
        assert line["file"].startswith("response.stale-")
        assert "ANSWER-CONTENT-XYZ" not in daemon.log_path.read_text()  # named, never read
    finally:
        daemon.stop()
        daemon.kill_children()
    kept = box / line["file"]
    assert kept.read_text() == "ANSWER-CONTENT-XYZ"
    s = d("status")
    assert "Set aside:" in s.out and line["file"] in s.out
    log = next(iter((tmp_path / "state" / "resume-logs").glob("*.log"))).read_text()
    assert "set aside as response.stale-" in log  # the client said it on stderr


def test_a_file_answer_written_during_an_interactive_prompt_wins(
    delta: Delta, fake: FakeLLM
) -> None:
    _ask(fake)
    fake.reply("done")
    assert delta.start().code == 101  # the question is in the mailbox
    proc = subprocess.Popen(
        delta.argv("run", "-i"),
        cwd=delta.ws,
        env=delta.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    wait_for(lambda: "[ask_human]" in (proc.stdout.readline() or ""), "the terminal prompt")
    delta.answer("from the file")
    out = proc.stdout.read()  # stdin stays open: the prompt notices the file without typing
    assert proc.wait(timeout=60) == 0
    assert proc.stdin is not None
    proc.stdin.close()
    assert "answered meanwhile through the mailbox" in out
    assert fake.tool_results()["q"] == "from the file"
    assert not list((delta.delta_dir / "interaction").glob("response*"))


def test_typing_first_keeps_a_later_file_answer_aside(delta: Delta, fake: FakeLLM) -> None:
    _ask(fake)
    fake.reply("done")
    assert delta.start().code == 101
    env = {**delta.env, "DELTA_HOLD": "after_journal", "DELTA_HOLD_SECONDS": "0"}
    proc = subprocess.Popen(
        delta.argv("run", "-i"),
        cwd=delta.ws,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    wait_for(lambda: "[ask_human]" in (proc.stdout.readline() or ""), "the terminal prompt")
    proc.stdin.write("typed\n")
    proc.stdin.flush()
    wait_for(
        lambda: any(
            e["payload"].get("phase") == "answered" for e in delta.events("HUMAN_INTERACTION")
        ),
        "the typed answer to be journaled",
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert fake.tool_results()["q"] == "typed"


def test_busy_resumes_back_off(tmp_path: Path, fake: FakeLLM) -> None:
    import fcntl

    root = tmp_path / "root"
    ws = root / "ws"
    ws.mkdir(parents=True)
    d = Delta(ws, fake, write_agent(tmp_path))
    _ask(fake)
    fake.reply("done")
    assert d.start().code == 101
    # Another process drives the workspace (it holds the lock) while an answer is there: each
    # resume exits 75 (busy).
    lock = os.open(ws / ".delta" / "lock", os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    d.answer("Ada")
    daemon = Daemon(tmp_path, [root], resume_command=REAL_CLIENT).start(env=llm_env(fake))
    try:
        busy = daemon.wait_event("resume_busy", count=3, workspace=str(ws), timeout=60)
        waits = [b["retry_in_s"] for b in busy[:3]]
        assert waits[0] < waits[1] < waits[2]  # growing, not every few seconds forever
        os.close(lock)  # the other process is done: the answer is taken
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the resume after the lock is free")
    finally:
        daemon.stop()
        daemon.kill_children()


def test_auto_approve_takes_the_default(tmp_path: Path, fake: FakeLLM) -> None:
    (tmp_path / "ws").mkdir()
    d = Delta(tmp_path / "ws", fake, EXAMPLES / "release-agent")
    fake.call(
        "ask_human",
        {"prompt": "Which channel?", "options": ["[S] stable", "[B] beta"], "default": "B"},
        id="ch",
    )
    fake.reply("ok")
    assert d.start("release", "--auto-approve").code == 0
    assert fake.tool_results()["ch"].startswith("beta")


# -- the first hour ----------------------------------------------------------------------------
def test_ctrl_c_says_the_run_is_interrupted_and_how_to_resume(delta: Delta, fake: FakeLLM) -> None:
    fake.call("slow", {"seconds": "30"}, id="s").reply("done")
    proc = delta.popen("run", "--agent", str(delta.agent), "--task", "t")
    wait_for(lambda: (delta.ws / "started.txt").exists(), "the tool to start")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted (SIGINT)" in err and "INTERRUPTED" in err and "delta run --work-dir" in err


def test_a_closed_pipe_keeps_the_runs_exit_code(delta: Delta, fake: FakeLLM) -> None:
    fake.reply("x" * 200_000)  # more than a pipe holds
    cmd = [*delta.argv("run", "--agent", str(delta.agent), "--task", "t")]
    p = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$@" | true; echo "rc=${PIPESTATUS[0]}"', "bash", *cmd],
        cwd=delta.ws,
        env=delta.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "rc=0" in p.stdout, p.stderr
    assert "Broken pipe" not in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("argv", [["delta", "-h"], ["delta", "--version"], ["deltad", "--version"]])
def test_help_and_version(argv: list[str]) -> None:
    exe = str(Path(sys.executable).parent / argv[0])
    p = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.strip(), p.stderr


def test_a_password_question_suggests_the_hidden_prompt(delta: Delta, fake: FakeLLM) -> None:
    _ask(fake, input_type="password")
    fake.reply("done")
    r = delta.start()
    assert r.code == 101
    assert "typing hidden" in r.out and "echo" not in r.out and "'your answer'" not in r.out


def test_agent_config_errors_say_why(tmp_path: Path, delta: Delta) -> None:
    home = tmp_path / "broken"
    home.mkdir()
    (home / "system_prompt.md").write_text("x\n")
    (home / "config.yaml").write_text("name: a\nllm: {model: m\ntools: []\n")
    r = delta("run", "--agent", str(home), "--task", "t")
    assert r.code == 2 and "line" in r.err and "expected" in r.err
    (home / "config.yaml").write_text("name: a\nllm: {model: m}\n")
    (home / "agent.yaml").write_text("name: b\nllm: {model: m}\n")
    r = delta("run", "--agent", str(home), "--task", "t", "--max-iterations", "1")
    assert "has both config.yaml and agent.yaml; using config.yaml" in r.err


@pytest.mark.parametrize(
    ("tool", "why"),
    [
        ("shell: \"echo 'running ${version}'\"", "inside single quotes"),
        ('exec: "ls ${dir"', "unfinished placeholder"),
    ],
)
def test_placeholders_that_never_expand_are_config_errors(
    tmp_path: Path, delta: Delta, tool: str, why: str
) -> None:
    home = write_agent(tmp_path, f"\n  - name: t\n    {tool}\n", name="bad")
    r = delta("run", "--agent", str(home), "--task", "t")
    assert r.code == 2 and why in r.err and "tools[0] (t)" in r.err


def test_serve_refuses_to_be_ready_watching_nothing(tmp_path: Path) -> None:
    exe = str(Path(sys.executable).parent / "deltad")
    for cmd in ("serve", "check"):
        p = subprocess.run(
            [exe, cmd, "--root", str(tmp_path / "nonexistent")],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
        )
        assert p.returncode == 2 and "no root directory exists" in p.stderr


def test_check_lists_every_problem(tmp_path: Path) -> None:
    cfg = tmp_path / "deltad.yaml"
    cfg.write_text(f"roots: [{tmp_path}]\nmax_parallel_resumes: 0\nlog_level: loud\nbogus: 1\n")
    exe = str(Path(sys.executable).parent / "deltad")
    p = subprocess.run([exe, "check", "--config", str(cfg)], capture_output=True, text=True)
    assert p.returncode == 2
    lines = [x for x in p.stderr.splitlines() if x.startswith("deltad: error:")]
    assert len(lines) == 3 and "more" not in p.stderr


def test_the_keyless_demo_pauses_and_resumes() -> None:
    script = EXAMPLES / "demo.sh"
    p = subprocess.run(
        ["bash", str(script), "Grace"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DELTA_BIN": str(Path(sys.executable).parent)},
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "exit 101" in p.stdout and "Hello Grace!" in p.stdout
