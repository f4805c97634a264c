"""Shared fixtures: a fake OpenAI server per test and a `delta` subprocess runner.

Nothing of the project is mocked: `delta` runs as a real process against a real HTTP server on
127.0.0.1, and tests look at the files it leaves behind.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deltad.testing import FakeLLM

# Before hypothesis is imported: its plugins are third parties' (trio registers one, which
# imports all of trio: ~0.3 s of CPU in every pytest process and xdist worker; none is used).
# Hypothesis itself (~0.5 s of CPU to import) and its profiles come with tests/fuzz, where the
# property tests are (tests/fuzz/__init__.py), not with every pytest process.
os.environ.setdefault("HYPOTHESIS_NO_PLUGINS", "1")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A hypothesis test takes its settings from the profile loaded when it is decorated: one
    outside tests/fuzz may run without them (a fresh draw in CI)."""
    if hasattr(getattr(item, "obj", None), "hypothesis") and not item.nodeid.startswith(
        "tests/fuzz/"
    ):
        pytest.fail(
            "a hypothesis test outside tests/fuzz: put it there, where the profiles are loaded"
            " before it is decorated (README, Fuzzing)",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Iterator[object]:
    """No cyclic garbage collection while the test modules are imported: collection makes
    hundreds of thousands of objects that all live to the end (modules, classes, pydantic's
    schemas, the items), and the collector kept walking them (0.8 s of the unit layer's 2.7 s
    of collection CPU). Then one collection, and what is left is frozen out of the collector's
    way for the session (as deltad's fork server does for its children)."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.collect()
        gc.freeze()
        gc.enable()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Hypothesis's pytest plugin imports hypothesis at the end of every session, for its
    summary (~0.3 s of CPU): where no test collected uses hypothesis, it has nothing to say."""
    if "hypothesis" not in sys.modules:
        plugin = session.config.pluginmanager.get_plugin("hypothesispytest")
        if plugin is not None:
            session.config.pluginmanager.unregister(plugin)


BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True, scope="session")
def _inbox_can_run_python() -> None:
    """A root daemon runs its HTTP inbox as the `deltad-inbox` system user: that user must
    be able to run this venv's interpreter (tests/users.py: traverse only, never read)."""
    if os.geteuid() == 0:
        from tests.users import executable_by_all

        with executable_by_all():
            pass


@pytest.fixture
def notify_out() -> Iterator[Path]:
    """A directory a `notify.commands` command may write in: it runs as the inbox's user,
    never root, and pytest's own tmp dirs are root's 0700."""
    from tests.users import shared_tmp

    with shared_tmp() as base:
        out = base / "out"
        out.mkdir()
        out.chmod(0o1777)
        yield out


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def bin_path(name: str) -> str:
    found = BIN / name
    return str(found) if found.exists() else (shutil.which(name) or name)


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM() as f:
        yield f


@dataclass
class Result:
    code: int
    out: str
    err: str


def llm_env(fake: FakeLLM) -> dict[str, str]:
    """The environment that points `delta` (or a daemon's resumes) at the fake model."""
    env = {
        **os.environ,
        "OPENAI_BASE_URL": fake.url,
        "OPENAI_API_KEY": "test-key",
        "DELTA_LLM_MAX_RETRIES": "0",
    }
    for k in ("DELTA_BASE_URL", "DELTA_API_KEY", "DELTA_FAULT", "DELTA_HOLD"):
        env.pop(k, None)
    return env


class Delta:
    """Runs `delta` in a workspace, pointed at the test's fake model."""

    def __init__(self, ws: Path, fake: FakeLLM, agent: Path) -> None:
        self.ws = ws
        self.agent = agent
        self.env = llm_env(fake)

    def argv(self, *args: str) -> list[str]:
        return [bin_path("delta"), *args]

    def __call__(
        self,
        *args: str,
        input: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> Result:
        p = subprocess.run(
            self.argv(*args),
            cwd=self.ws,
            env={**self.env, **(env or {})},
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Result(p.returncode, p.stdout, p.stderr)

    def start(self, task: str = "do the task", *extra: str, **kw: Any) -> Result:
        return self("run", "--agent", str(self.agent), "--task", task, *extra, **kw)

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            cwd=self.ws,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )

    # -- reading the workspace ---------------------------------------------------------------
    @property
    def delta_dir(self) -> Path:
        return self.ws / ".delta"

    @property
    def run_dir(self) -> Path:
        rid = (self.delta_dir / "runs" / "LATEST").read_text().strip()
        return self.delta_dir / "runs" / rid

    def metadata(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "execution" / "metadata.json").read_text())

    def status(self) -> str:
        return self.metadata()["status"]

    def journal(self) -> list[dict[str, Any]]:
        lines = (self.run_dir / "execution" / "journal.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def events(self, type_: str) -> list[dict[str, Any]]:
        return [e for e in self.journal() if e["type"] == type_]

    def results(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for e in self.events("ACTION_RESULT"):
            out.setdefault(e["payload"]["action_id"], []).append(e["payload"])
        return out

    def request(self) -> dict[str, Any]:
        return json.loads((self.delta_dir / "interaction" / "request.json").read_text())

    def answer(self, text: str) -> None:
        (self.delta_dir / "interaction" / "response.txt").write_text(text)


def write_agent(root: Path, tools: str = "[]", extra: str = "", name: str = "agent") -> Path:
    home = root / name
    home.mkdir(parents=True, exist_ok=True)
    head = "name: test-agent\nllm:\n  model: fake-model\n"
    (home / "config.yaml").write_text(f"{head}tools: {tools}\n{textwrap.dedent(extra)}")
    (home / "system_prompt.md").write_text("You are a test agent.\n")
    return home


TOOLS = """
  - name: echo
    description: Echo text back.
    exec: "echo ${text}"
  - name: slow
    description: Sleep, then say done.
    shell: "echo started > started.txt; sleep ${seconds}; echo finished > finished.txt"
  - name: use_secret
    description: Write a secret into the workspace, and print it.
    shell: "printf '%s' ${value} > secret-seen.txt; echo the value is ${value}"
"""


@pytest.fixture
def agent(tmp_path: Path) -> Path:
    return write_agent(tmp_path, TOOLS)


@pytest.fixture
def delta(tmp_path: Path, fake: FakeLLM, agent: Path) -> Delta:
    ws = tmp_path / "ws"
    ws.mkdir()
    return Delta(ws, fake, agent)


def wait_for(cond: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll until `cond()` is truthy. The deadline guards against hangs, not speed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# A gated tool that leaves a trace in the workspace if it ever runs.
GATED_TOOLS_FOR_DAEMON = """
  - name: deploy
    shell: "echo ${env} > deployed.txt; echo deployed ${env}"
"""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "linux_only: needs what deltad/platform.py hides off Linux (DELTAD_PLATFORM)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from deltad import platform

    if platform.LINUX:
        return
    skip = pytest.mark.skip(reason="Linux only (DELTAD_PLATFORM=other)")
    for item in items:
        if "linux_only" in item.keywords:
            item.add_marker(skip)
