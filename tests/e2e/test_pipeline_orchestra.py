"""Orchestra-style agents end to end: `agent="name"` resolved from the orchestra.yaml beside
the DOT file, in real `delta` processes against the fake model. The system prompt and model
the fake model received, the same after a kill -9 even with the prompt files edited, and
`delta pipeline check` naming each refusal with the node's `file:line:col`."""

from __future__ import annotations

import shutil
import signal
import textwrap
from pathlib import Path

from deltad.testing import FakeLLM

from ..conftest import EXAMPLES, Delta, wait_for, write_agent

EXAMPLE = EXAMPLES / "pipelines" / "orchestra"

ANALYST = (
    "You are a senior software consultant who helps teams design and build systems.\n\n"
    "You specialise in turning a vague idea into a list of clear requirements.\n\n"
    "You are patient and precise; you never guess what was not said.\n\n"
    "Gather the functional and non-functional requirements, one list each."
)
WRITER = (
    "You are a senior software consultant who helps teams design and build systems.\n\n"
    "You write design documents engineers can build from.\n\n"
    "Write a short design document from the requirements you are given."
)


def _setup(tmp_path: Path, fake: FakeLLM) -> tuple[Delta, Path]:
    """A copy of the example (edited by some tests) and an agent defining its provider."""
    agent = write_agent(
        tmp_path,
        extra=f"""\
        providers:
          local:
            base_url: {fake.url}
        """,
    )
    ws = tmp_path / "ws"
    ws.mkdir()
    copy = tmp_path / "example"
    shutil.copytree(EXAMPLE, copy)
    return Delta(ws, fake, agent), copy / "design-review.dot"


def _system(fake: FakeLLM, i: int) -> str:
    first = fake.requests[i]["messages"][0]
    assert first["role"] == "system"
    return str(first["content"])


def test_the_orchestra_example_gives_each_node_its_composed_prompt_and_model(
    tmp_path: Path, fake: FakeLLM
) -> None:
    d, dot = _setup(tmp_path, fake)
    fake.reply("REQUIREMENTS").reply("DESIGN")
    r = d("run", "--pipeline", str(dot), "--agent", str(d.agent))
    assert r.code == 0, r.err
    assert r.out.strip() == "DESIGN"
    assert [_system(fake, 0), _system(fake, 1)] == [ANALYST, WRITER]
    assert [q["model"] for q in fake.requests] == ["big-model-2025", "small-model-2025"]
    starts = {e["payload"]["node"]: e["payload"] for e in d.events("NODE_START")}
    assert starts["requirements"]["system_prompt"] == ANALYST
    assert starts["requirements"]["llm"] == {"llm_model": "big-model-2025", "llm_provider": "local"}


def test_a_resume_sends_what_was_recorded_though_the_prompt_files_changed(
    tmp_path: Path, fake: FakeLLM
) -> None:
    d, dot = _setup(tmp_path, fake)
    fake.reply("REQUIREMENTS").hang(120)
    proc = d.popen("run", "--pipeline", str(dot), "--agent", str(d.agent))
    try:
        wait_for(lambda: len(fake.requests) == 2, "design_doc's model call", timeout=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    task = dot.parent / "prompts" / "tasks" / "write-design-doc.yaml"
    task.write_text("content: an edited task\n")
    config = dot.parent / "orchestra.yaml"
    config.write_text(config.read_text().replace("small-model-2025", "edited-model"))
    fake.reply("DESIGN")
    r = d("run")
    assert r.code == 0, r.err
    assert fake.requests[2]["messages"] == fake.requests[1]["messages"]
    assert [_system(fake, 2), fake.requests[2]["model"]] == [WRITER, "small-model-2025"]


def _check(d: Delta, dot: Path, *extra: str) -> tuple[int, list[str]]:
    r = d("pipeline", "check", *extra, str(dot))
    assert "Traceback" not in r.err + r.out
    return r.code, r.err.splitlines()


def test_check_names_each_refusal_at_the_nodes_agent(tmp_path: Path, fake: FakeLLM) -> None:
    d, dot = _setup(tmp_path, fake)
    dot.write_text(
        textwrap.dedent(
            """\
            digraph d {
                start [shape=Mdiamond]
                exit [shape=Msquare]
                a [agent="nobody"]
                b [agent="missing-file"]
                c [agent="bad-alias"]
                e [agent="escapes"]
                start -> a -> b -> c -> e -> exit
            }
            """
        )
    )
    config = dot.parent / "orchestra.yaml"
    config.write_text(
        config.read_text()
        + textwrap.dedent(
            """\
              missing-file:
                task: prompts/tasks/nope.yaml
              bad-alias:
                task: prompts/tasks/write-design-doc.yaml
                model: genius
              escapes:
                role: ../outside.yaml
            backend: direct
            """
        )
    )
    code, lines = _check(d, dot)
    assert code == 2
    assert [line.split(": node ", 1)[0] for line in lines if "E012" in line] == [
        f"delta: error: {dot}:{n}:14" for n in (4, 5, 6, 7)
    ]
    text = "\n".join(lines)
    assert "agent 'nobody' is neither in" in text
    assert "nope.yaml: no such file" in text
    assert "model alias 'genius' is not in providers.local.models (quick, smart)" in text
    assert "'../outside.yaml' must be a path inside" in text
    assert f"{config}: backend is ignored [W006 ignored-config-key]" in text


def test_the_example_checks_without_warnings_listing_each_nodes_agent(
    tmp_path: Path, fake: FakeLLM
) -> None:
    d, _ = _setup(tmp_path, fake)
    r = d("pipeline", "check", "--strict", str(EXAMPLE / "design-review.dot"))
    assert (r.code, r.err) == (0, "")
    listed = {line.split()[0]: line.split()[-2:] for line in r.out.splitlines() if "agent=" in line}
    assert listed == {
        "requirements": ["agent=requirements-analyst", "(orchestra.yaml)"],
        "design_doc": ["agent=technical-writer", "(orchestra.yaml)"],
    }
