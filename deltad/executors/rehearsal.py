"""The fork server's rehearsal: before its first fork, it runs one whole resume in itself.

A resume's child pays, on the path from the answer to its journal entry, for everything the
client builds lazily on first use: pydantic's per-class setattr handlers, loggers, the
sandbox's look at the host, ABC subclass caches, the first allocations of each kind. A child
forked from a server that has already run a resume finds them built and shared (about a fifth
of a warm child's time to ACTION_RESULT; `bench/warm_breakdown.py --old`).

So the server runs one: in a private temporary directory, an agent with no tools asks a
question (`delta run` pauses), the answer is written and `delta run` resumes and finishes. The
model is answered in this process through the model client's transport seam
(`deltad.engine.llm.TRANSPORT`): nothing leaves it. Then everything a run changes in its
process is put back as it was (the environment, working directory, argv and sys.path, signal
dispositions, umask, logging, stdio) and the host's cached look is dropped: it holds the
effective uid, and the server is root while its children are not.

An optimisation only: whatever goes wrong, the server still serves, colder (`rehearse` says
why, and deltad logs it with `fork_server_ready`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# The agent and its question (no tools: nothing is started, nothing is sandboxed).
AGENT_CONFIG = "name: rehearsal\nllm:\n  model: rehearsal\ntools: []\n"
QUESTION = {"prompt": "rehearsal?"}
PAUSED = 101  # `delta run`'s exit when it waits for an answer
# A rehearsal that has not ended by then is given up (it takes ~0.1 s): deltad waits for the
# server's `ready` no longer than executors/fork.py's READY_TIMEOUT, imports included.
LIMIT_SECONDS = 10.0


class Overran(BaseException):
    """The rehearsal's time is up (a BaseException: no `except Exception` in a run keeps it)."""


def model_replies() -> Callable[[Any], Any]:
    """The model's side, as the transport's handler: an ask_human call, then a final reply
    once the conversation carries the answer (a tool message)."""
    import httpx2

    def completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
        return {
            "id": "chatcmpl-rehearsal",
            "object": "chat.completion",
            "created": 0,
            "model": "rehearsal",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def handle(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content or b"{}")
        answered = any(m.get("role") == "tool" for m in body.get("messages", []))
        if answered:
            doc = completion({"role": "assistant", "content": "done"}, "stop")
        else:
            call = {
                "id": "call_rehearsal",
                "type": "function",
                "function": {"name": "ask_human", "arguments": json.dumps(QUESTION)},
            }
            asks = {"role": "assistant", "content": None, "tool_calls": [call]}
            doc = completion(asks, "tool_calls")
        return httpx2.Response(200, json=doc)

    return handle


def rehearse(delta: Callable[[list[str]], None], limit: float = LIMIT_SECONDS) -> str | None:
    """Run a question, its answer and the resume in this process (`delta`: the fork server's
    entry for a `delta` command line, which ends in SystemExit). None when the resume ran
    through; else why not, in one line."""
    from deltad.engine import llm, sandbox

    argv0 = os.path.join(os.path.dirname(sys.executable), "delta")
    try:
        with (
            _restored(),
            _quiet(),
            _limited(limit),
            tempfile.TemporaryDirectory(prefix="deltad-rehearsal-") as tmp,
        ):
            agent, ws = Path(tmp, "agent"), Path(tmp, "workspace")
            agent.mkdir()
            ws.mkdir()
            (agent / "config.yaml").write_text(AGENT_CONFIG)
            (agent / "system_prompt.md").write_text("A rehearsal.\n")
            for name in [n for n in os.environ if n.startswith(("DELTA_", "OPENAI_"))]:
                del os.environ[name]
            os.environ |= {"OPENAI_BASE_URL": "http://rehearsal.invalid/v1", "OPENAI_API_KEY": "-"}
            import httpx2

            llm.TRANSPORT = httpx2.MockTransport(model_replies())
            os.chdir(ws)
            start = ["run", "--agent", str(agent), "--task", "rehearsal", "--work-dir", str(ws)]
            if (code := _exit_code(delta, [argv0, *start])) != PAUSED:
                return f"the question's run exited {code}, not {PAUSED}"
            (ws / ".delta" / "interaction" / "response.txt").write_text("yes")
            if (code := _exit_code(delta, [argv0, "run", "--work-dir", str(ws)])) != 0:
                return f"the resume exited {code}"
    except Overran:
        return f"it did not end within {limit:g} s"
    except Exception as e:  # an optimisation only
        return f"{type(e).__name__}: {e}"[:200]
    finally:
        llm.TRANSPORT = None
        sandbox.host.cache_clear()  # it holds this process's euid: root, not the child's
    return None


def _exit_code(delta: Callable[[list[str]], None], argv: list[str]) -> object:
    try:
        delta(argv)
    except SystemExit as e:
        return e.code if e.code is not None else 0
    return 0


@contextlib.contextmanager
def _restored() -> Iterator[None]:
    """Put back what a run changes in its process."""
    env, cwd, umask = dict(os.environ), os.getcwd(), os.umask(0o077)
    os.umask(umask)
    argv, path = list(sys.argv), list(sys.path)
    dispositions = {}
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError):
            dispositions[sig] = signal.getsignal(sig)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import structlog

    structlog_config = structlog.get_config()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        os.umask(umask)
        sys.argv[:], sys.path[:] = argv, path
        for sig, handler in dispositions.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(sig, handler)
        for h in root.handlers:
            if h not in handlers:
                with contextlib.suppress(Exception):
                    h.close()  # the run's log file, in the removed directory
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**structlog_config)


@contextlib.contextmanager
def _limited(seconds: float) -> Iterator[None]:
    """Overran is raised in this (the main) thread once `seconds` have passed."""

    def overran(signum: int, frame: object) -> None:
        raise Overran

    signal.signal(signal.SIGALRM, overran)  # the disposition before: put back by _restored
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The runs' terminal lines go nowhere (the server's stderr is deltad's log)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)
