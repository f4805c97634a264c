"""The image's smoke test: `deltad serve` from the image built by deploy/image/build.sh, run by
podman over a mounted root, resumes an answered workspace as its owner (a uid the image has no
account for) and then reports ready.

Required with CI=true (`.ci/run` builds the image first); skipped elsewhere when podman or the
image is missing (build it with `deploy/image/build.sh`). The image is `DELTAD_IMAGE`, default
`localhost/deltad:<version>`. Podman runs with runc and cgroupfs (deploy/image/containers.conf)
and the host's network, so the container reaches the fake model on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from deltad.testing import FakeLLM
from tests.support.daemon import metadata_status

from ..conftest import llm_env
from ..podman import events as _events
from ..podman import podman as _podman
from ..podman import status as _status
from ..podman import the_image
from ..users import User, accounts, chown_tree, executable_by_all, shared_tmp

DELTA = str(Path(sys.executable).parent / "delta")  # the host's: it pauses the run
DEADLINE = 180.0  # seconds: a container start and a resume on a loaded 2-core machine
PROBE = """name: probe
llm: {model: fake}
# The image has no bubblewrap (and a container rarely allows its namespaces): the operator's
# choice, said once per run (docs/delta.md, "Tools run sandboxed").
sandbox: {unavailable: unsandboxed}
tools:
  - name: probe
    shell: 'echo "uid=$(id -u) gid=$(id -g)"; id -un 2>&1 || true'
"""
T = TypeVar("T")


@pytest.fixture
def image() -> str:
    return the_image("the image's smoke test")


def _poll(cond: Callable[[], T], what: str, logs: Callable[[], str]) -> T:
    end = time.monotonic() + DEADLINE
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {DEADLINE}s waiting for {what}:\n{logs()}")
        time.sleep(0.25)


def _as(user: User, fake: FakeLLM, *args: str) -> subprocess.CompletedProcess[str]:
    env = [f"{k}={v}" for k, v in llm_env(fake).items() if k.startswith(("OPENAI_", "DELTA_"))]
    argv = user.argv("env", *env, DELTA, *args, umask="022")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")


@contextlib.contextmanager
def _container(image: str, name: str, base: Path, config: Path, fake: FakeLLM) -> Iterator[str]:
    _podman("rm", "--force", "--ignore", name, check=False)
    model = llm_env(fake)
    _podman(
        "run",
        "--detach",
        "--name",
        name,
        "--network=host",
        "--volume",
        f"{base}:{base}",
        "--volume",
        f"{config}:/etc/deltad/deltad.yaml:ro",
        *[f"--env={k}={model[k]}" for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY")],
        "--env=DELTA_LLM_MAX_RETRIES=0",
        image,  # its own command: deltad serve --config /etc/deltad/deltad.yaml
    )
    try:
        yield name
    finally:
        _podman("rm", "--force", "--time", "5", name, check=False)


@pytest.mark.timeout(3 * DEADLINE + 120)  # three waits, the pause and podman's start and stop
def test_the_image_resumes_an_answered_workspace_as_its_owner_then_is_ready(
    image: str, fake: FakeLLM
) -> None:
    fake.call("ask_human", {"prompt": "go?"}, id="q").call("probe", {}, id="p").reply("done")
    with accounts() as acc, executable_by_all(), shared_tmp() as base:
        owner = acc.user()
        root = base / "root"
        ws = root / "ws1"
        ws.mkdir(parents=True)
        agent = base / "agent"
        agent.mkdir()
        (agent / "config.yaml").write_text(PROBE)
        (agent / "system_prompt.md").write_text("Probe.\n")
        chown_tree(ws, owner)
        # Paused and answered before the daemon starts: it finds the answer by its first look.
        r = _as(owner, fake, "run", "--agent", str(agent), "--task", "t", "-w", str(ws))
        assert r.returncode == 101, r.stderr
        assert _as(owner, fake, "respond", "-w", str(ws), "yes").returncode == 0
        config = base / "deltad.yaml"
        config.write_text(
            json.dumps(
                {
                    "roots": [str(root)],
                    "state_dir": "/var/lib/deltad",
                    "log_format": "json",
                    "http": {"listen": "127.0.0.1:0"},
                }
            )
        )
        with _container(image, f"deltad-smoke-{os.getpid()}", base, config, fake) as name:

            def logs() -> str:
                return _podman("logs", name, check=False)

            _poll(lambda: metadata_status(ws) == "COMPLETED", "the resume to complete", logs)
            [spawned] = _events(logs(), "resume_spawned")
            assert spawned["uid"] == owner.uid
            # The resume ran in the image as the workspace's numeric owner, whom the image has
            # no account for (no name), and it ingested the answer.
            probe = fake.tool_results()["p"]
            assert f"uid={owner.uid}" in probe and owner.name not in probe
            assert "yes" in fake.tool_results()["q"]
            [listening] = _poll(lambda: _events(logs(), "http_listening"), "the inbox", logs)
            port = listening["port"]
            _poll(lambda: _status(f"http://127.0.0.1:{port}/readyz") == 200, "/readyz 200", logs)
