"""The README's "No API key yet?" scripts through real `delta` processes: each question kind,
an approval and the review-gate pipeline, answered through the mailbox (`delta respond`) as a
person would, then resumed to the script's final message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deltad.testing import FakeLLM
from deltad.testing.fakescript import load

from ..conftest import EXAMPLES, Delta

SCRIPTS = EXAMPLES / "fake-model"
# kind -> (an answer a person gives, what the final message then says)
KINDS = {
    "text": ("Aurora", "The release will be called Aurora."),
    "password": ("s3cret-XYZZY", "its value never reached me"),
    "confirmation": ("yes", "You said yes"),
    "yes_no": ("no", "Slow tests: no"),
    "choice": ("beta", "Shipping to beta"),
    "number": ("3", "Scaling to 3 replicas."),
    "date": ("2026-12-01", "Release day: 2026-12-01."),
}


def _scripted(fake: FakeLLM, name: str) -> None:
    fake.scripted(load(SCRIPTS / f"{name}.yaml"))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_question_kind_script_pauses_and_resumes(
    delta: Delta, fake: FakeLLM, kind: str
) -> None:
    _scripted(fake, kind)
    r = delta("run", "--agent", str(EXAMPLES / "hello-agent"), "--task", f"try {kind}")
    assert r.code == 101, r.err
    assert delta.request()["input_type"] == kind
    answer, says = KINDS[kind]
    r = delta("respond", answer)
    assert r.code == 0, r.err
    r = delta("run")
    assert r.code == 0, r.err
    assert says in r.out, r.out
    if kind == "password":
        assert answer not in r.out and answer not in str(fake.requests)


def test_the_approval_script_asks_before_the_deploy_runs(delta: Delta, fake: FakeLLM) -> None:
    _scripted(fake, "approval")
    r = delta("run", "--agent", str(EXAMPLES / "release-agent"), "--task", "ship 1.4.0")
    assert r.code == 101, r.err
    assert delta.request()["input_type"] == "approval"
    assert delta("respond", "--approve").code == 0
    r = delta("run")
    assert r.code == 0, r.err
    assert "deploying 1.4.0 to stable" in r.out


def test_the_pipeline_gate_script_runs_the_review_gate(delta: Delta, fake: FakeLLM) -> None:
    _scripted(fake, "pipeline-gate")
    dot = EXAMPLES / "pipelines" / "review-gate.dot"
    args = ("run", "--pipeline", str(dot), "--agent", str(EXAMPLES / "hello-agent"))
    assert delta(*args).code == 101
    assert delta.request()["node_id"] == "review_gate"
    assert delta("respond", "R").code == 0
    assert delta("run").code == 101  # revised, then asked again
    assert delta("respond", "A").code == 0
    r = delta("run")
    assert r.code == 0, r.err
    path = [e["payload"]["node"] for e in delta.events("NODE_START")]
    assert path == ["start", "do_work", "review_gate", "revise", "review_gate", "apply"]
    assert delta.status() == "COMPLETED"


def test_try_lists_every_kind_a_script_exists_for() -> None:
    """The README sends a newcomer to `bash examples/try.sh`, which lists the kinds."""
    listed = _try().stderr + _try().stdout
    for path in SCRIPTS.glob("*.yaml"):
        assert path.stem in listed, (path.stem, listed)


def _try(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(EXAMPLES / "try.sh"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,  # no answer given on the terminal: the run waits
        env={**os.environ, "DELTA_BIN": str(Path(sys.executable).parent)},
    )


@pytest.mark.parametrize(("args", "says"), [([], "usage: "), (["yes-no"], "no kind 'yes-no'")])
def test_try_without_a_kind_it_has_lists_the_kinds(args: list[str], says: str) -> None:
    out = _try(*args)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    listed = out.stderr.split("KIND: " if not args else "the kinds: ")[1].strip(" )\n").split()
    assert sorted(listed) == sorted(p.stem for p in SCRIPTS.glob("*.yaml"))


def test_try_keeps_a_waiting_run_and_the_line_it_prints_continues_it(tmp_path: Path) -> None:
    """The pause message's `delta respond --work-dir WS` names a workspace that still exists,
    and the `--continue` line printed after it resumes the run against the fake model. The
    approval kind takes the agent that has the deploy tool."""
    out = _try("approval")
    assert out.returncode == 101, out.stdout + out.stderr
    [ws] = {
        line.split("--work-dir ")[1].split()[0]
        for line in out.stdout.splitlines()
        if "delta respond --work-dir" in line
    }
    assert Path(ws, ".delta").is_dir()
    [cont] = [ln.strip() for ln in out.stdout.splitlines() if "--continue" in ln]
    assert cont == f"bash examples/try.sh approval --continue {ws}"
    respond = subprocess.run(
        [str(Path(sys.executable).parent / "delta"), "respond", "--work-dir", ws, "--approve"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert respond.returncode == 0, respond.stderr
    done = _try("approval", "--continue", ws)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deploying 1.4.0 to stable" in done.stdout
    assert not Path(ws).exists()  # try.sh's own workspace, done: removed
