"""A third-party executor, installed through the `deltad.executors` entry point, resumes a real
`delta` run through a real `deltad`; `deltad check` names the executor and refuses bad
options in one line.

The toy executor (`tests/toy_executor/`) is pip-installed into the venv by `.ci/run`; the
fixture below installs it the same way when a developer's venv lacks it.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import yaml

from deltad.testing import FakeLLM
from tests.support.daemon import DELTAD, answer, metadata_status

from .test_daemon_client import _daemon, _pause

TOY = Path(__file__).parent.parent / "toy_executor"


@pytest.fixture(scope="session")
def toy_installed() -> Iterator[None]:
    if not list(entry_points(group="deltad.executors", name="toy")):
        with open(TOY / "pyproject.toml") as lock:  # one installer at a time (xdist workers)
            fcntl.flock(lock, fcntl.LOCK_EX)
            pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(TOY)]
            subprocess.run(pip, check=True, timeout=600)
    yield


def _check(tmp: Path, **settings: object) -> subprocess.CompletedProcess[str]:
    (tmp / "root").mkdir(exist_ok=True)
    config = tmp / "deltad.yaml"
    config.write_text(
        yaml.safe_dump({"roots": [str(tmp / "root")], "state_dir": str(tmp / "s"), **settings})
    )
    return subprocess.run(
        [DELTAD, "check", "--config", str(config)], capture_output=True, text=True, timeout=60
    )


def test_a_toy_executor_from_an_entry_point_resumes_a_real_run(
    tmp_path: Path, fake: FakeLLM, toy_installed: None
) -> None:
    fake.call("ask_human", {"prompt": "q?"}, id="ask1").reply("done")
    root, ws = tmp_path / "root", tmp_path / "root" / "ws1"
    _pause(fake, tmp_path, ws)
    journal = tmp_path / "toy.jsonl"
    toy = {"executor": "toy", "executors": {"toy": {"journal": str(journal)}}}
    with _daemon(tmp_path, root, fake, **toy) as d:
        answer(ws, "blue")
        [exited] = d.wait_event("resume_exited", workspace=str(ws))
        assert exited["exit_code"] == 0 and exited["outcome"] == "completed"
        [spawned] = d.events("resume_spawned", workspace=str(ws))
        assert spawned["executor"] == "toy"
        assert metadata_status(ws) == "COMPLETED"
        assert "blue" in fake.tool_results()["ask1"]
    rows = [json.loads(line) for line in journal.read_text().splitlines()]
    assert [r["what"] for r in rows] == ["submitted", "started", "ended"]
    assert {r["workspace"] for r in rows} == {str(ws)} and rows[-1]["rc"] == 0


def test_check_names_the_executor_and_where_it_comes_from(
    tmp_path: Path, toy_installed: None
) -> None:
    out = _check(tmp_path, executor="toy")
    assert out.returncode == 0, out.stderr
    assert "resumes start with the toy executor (toy_executor:make)" in out.stdout


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"executor": "toy", "executors": {"toy": {"colour": 1}}}, "toy.colour: unknown option"),
        (
            {"executor": "toy", "executors": {"toy": {"jurnal": "/j"}}},
            "executors.toy.jurnal: unknown option; did you mean 'journal'?",
        ),
        ({"executor": "nope"}, "unknown executor 'nope'"),
        ({"executor": "fresh", "executors": {"fresh": {"x": 1}}}, "takes no options (got x)"),
    ],
)
def test_check_refuses_a_bad_executor_in_one_line(
    tmp_path: Path, toy_installed: None, settings: dict[str, object], says: str
) -> None:
    out = _check(tmp_path, **settings)
    assert out.returncode != 0 and says in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
