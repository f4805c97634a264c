"""The fork server's rehearsal (deltad/executors/rehearsal.py): what it says when a run does
not go as rehearsed, and that whatever a run changed in the process is put back. The real
rehearsal, a real `delta` run in a real server: tests/e2e/test_executor_server.py."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

import httpx2
import pytest

from deltad.engine import llm, sandbox
from deltad.executors.rehearsal import PAUSED, model_replies, rehearse


def _reply(handle: object, messages: list[dict[str, object]]) -> dict[str, object]:
    request = httpx2.Request("POST", "http://x/v1/chat/completions", json={"messages": messages})
    response = handle(request)  # type: ignore[operator]
    message: dict[str, object] = json.loads(response.content)["choices"][0]["message"]
    return message


def test_the_model_asks_then_finishes_once_it_has_the_answer() -> None:
    handle = model_replies()
    asked = _reply(handle, [{"role": "user", "content": "rehearsal"}])
    [call] = asked["tool_calls"]  # type: ignore[misc]
    assert call["function"]["name"] == "ask_human"
    answered = _reply(handle, [{"role": "tool", "tool_call_id": call["id"], "content": "yes"}])
    assert answered == {"role": "assistant", "content": "done"}


def _tampering(code: int, seen: list[list[str]]) -> object:
    """A `delta` that changes what a run changes in its process, then exits with `code`."""

    def delta(argv: list[str]) -> None:
        seen.append(argv)
        assert llm.TRANSPORT is not None  # the model is answered in-process
        assert "OPENAI_API_KEY" in os.environ and "DELTA_BASE_URL" not in os.environ
        os.environ["LEFT_BEHIND"] = "1"
        os.chdir("/")
        os.umask(0o022)
        sys.argv[:] = argv
        sys.path[0] = "/nowhere"
        signal.signal(signal.SIGTERM, lambda *_: None)
        logging.getLogger().addHandler(logging.StreamHandler(open(os.devnull, "w")))  # noqa: SIM115
        logging.getLogger().setLevel(logging.DEBUG)
        sandbox.host()
        if code == PAUSED:  # as a run that asks: its mailbox
            Path(argv[-1], ".delta", "interaction").mkdir(parents=True, exist_ok=True)
        raise SystemExit(code)

    return delta


def _state() -> dict[str, object]:
    root = logging.getLogger()
    umask = os.umask(0o077)
    os.umask(umask)
    return {
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "umask": umask,
        "argv": list(sys.argv),
        "path": list(sys.path),
        "sigterm": signal.getsignal(signal.SIGTERM),
        "handlers": list(root.handlers),
        "level": root.level,
        "transport": llm.TRANSPORT,
        "host_cached": sandbox.host.cache_info().currsize,
    }


@pytest.mark.parametrize(
    ("code", "why"),
    [(3, f"the question's run exited 3, not {PAUSED}"), (PAUSED, f"the resume exited {PAUSED}")],
)
def test_a_run_that_does_not_go_as_rehearsed_is_said_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, code: int, why: str
) -> None:
    monkeypatch.setenv("DELTA_BASE_URL", "http://the-operators-model.example")
    sandbox.host.cache_clear()
    before = _state()
    seen: list[list[str]] = []
    assert rehearse(_tampering(code, seen)) == why  # type: ignore[arg-type]
    assert _state() == before
    # The question's run, then (when it paused) the resume of its workspace, now removed.
    assert seen[0][1:4] == ["run", "--agent", seen[0][3]] and "--task" in seen[0]
    work = Path(seen[0][-1])
    assert len(seen) == (1 if code != PAUSED else 2) and not work.exists()
    assert work.parent.parent == Path(tempfile.gettempdir())


def test_a_run_that_raises_is_said_and_changes_nothing() -> None:
    before = _state()

    def delta(argv: list[str]) -> None:
        os.chdir("/")
        raise RuntimeError("no model today")

    assert rehearse(delta) == "RuntimeError: no model today"
    assert _state() == before


def test_a_spares_touch_leaves_logging_as_it_was() -> None:
    """The spare parses a resume's command line and sets up logging as `delta` does, for the
    pages those write, then puts logging back: a `python -m MODULE` resume finds none of it."""
    import structlog

    from deltad.executors.forkserver import _touch_what_a_resume_writes_first

    root = logging.getLogger()
    before = (list(root.handlers), root.level, structlog.get_config())
    _touch_what_a_resume_writes_first()
    assert (list(root.handlers), root.level, structlog.get_config()) == before


def test_a_rehearsal_that_does_not_end_is_given_up_and_changes_nothing() -> None:
    """The server is ready only after its rehearsal: one that hangs must not keep it from
    serving (deltad gives a server that is not ready in time up)."""
    import threading

    before = _state()
    alarm = signal.getsignal(signal.SIGALRM)

    def delta(argv: list[str]) -> None:
        os.chdir("/")
        threading.Event().wait()  # never set: only the rehearsal's limit ends this

    assert rehearse(delta, limit=0.2) == "it did not end within 0.2 s"
    assert _state() == before
    assert signal.getsignal(signal.SIGALRM) == alarm
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
