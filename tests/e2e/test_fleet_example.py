"""examples/fleet.sh, the operator's road to a page with questions on it: it makes the fleet and
keeps it (every workspace paused on the question of its kind, the fake model left running), and
the two commands it prints, run as printed, serve the fleet: every question is listed over
HTTP, and an answer is resumed against the kept fake model. With `--owners` (root) each
workspace is its owner's."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.daemon import metadata_status, wait_for

from ..conftest import EXAMPLES
from ..users import accounts, executable_by_all, shared_tmp

FLEET = EXAMPLES / "fleet.sh"
BIN = str(Path(sys.executable).parent)
FOLLOW_UP = {
    "remind_after_seconds": 300.0,
    "max_reminders": 3,
    "escalate_after_seconds": 900.0,
    "escalate_to": ["bob"],
    "sla_seconds": 3600.0,
}
# workspace -> (the owner's place in --owners, its input_type, what else its request says)
EXPECTED: dict[str, tuple[int, str, dict[str, Any]]] = {
    "release-channel": (0, "choice", {"prompt": "Which channel should 1.4.0 ship to?"}),
    "deploy-prod": (0, "approval", {"approvals_required": 2, "owner_may_approve": False}),
    "cost-report": (0, "yes_no", {"respondents": ["alice"], "follow_up": FOLLOW_UP}),
    "release-day": (0, "date", {"prompt": "On which day should 1.4.0 go out?"}),
    **{
        f"web-{i}": (1, "yes_no", {"prompt": "Rotate the log files on this host now?"})
        for i in range(1, 5)
    },
    "billing-migration": (1, "text", {"respondents": ["alice", "bob"]}),
    "api-scale": (2, "number", {"minimum": 1, "maximum": 12}),
    "release-note": (2, "choice", {"node_id": "review_gate"}),
}


def _fleet(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DELTA_BIN": BIN}
    return subprocess.run(
        ["bash", str(FLEET), *args], capture_output=True, text=True, timeout=300, env=env
    )


@contextlib.contextmanager
def _fake_model_stopped(fleet: Path) -> Iterator[None]:
    """The fake model fleet.sh leaves running, stopped by its pid at the end."""
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int((fleet / ".fleet" / "fake-model.pid").read_text()), signal.SIGTERM)


def _request(ws: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    return doc


def _paused_as_expected(fleet: Path, owners: list[str]) -> None:
    found = sorted(p.parent.parent.name for p in fleet.glob("*/*/.delta/interaction"))
    assert found == sorted(EXPECTED)
    for name, (place, kind, fields) in EXPECTED.items():
        owner = owners[place % len(owners)]
        ws = fleet / owner / name
        assert metadata_status(ws) == "WAITING_FOR_INPUT", name
        req = _request(ws)
        assert req["input_type"] == kind, name
        assert {k: req.get(k) for k in fields} == fields, name
        assert ws.stat().st_uid == int(subprocess.check_output(["id", "-u", owner])), name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_fleet_is_made_kept_and_served_by_the_commands_it_prints(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet"
    with _fake_model_stopped(fleet):
        made = _fleet(str(fleet))
        assert made.returncode == 0, made.stdout + made.stderr
        _paused_as_expected(fleet, [subprocess.check_output(["id", "-un"], text=True).strip()])
        lines = [ln.strip() for ln in made.stdout.splitlines()]
        [serve] = [ln for ln in lines if " serve --root " in ln]
        [token_add] = [ln for ln in lines if " token add " in ln]
        assert serve.endswith(f"deltad serve --root {fleet} --listen 127.0.0.1:8470"), serve

        # As printed, on a free port; the default state dir (no config) under the test's dir.
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DELTA", "OPENAI"))}
        env |= {"XDG_STATE_HOME": str(tmp_path / "state"), "HOME": str(tmp_path)}
        env.pop("STATE_DIRECTORY", None)
        argv = ["env", *shlex.split(serve.replace(":8470", f":{port}"))]
        with open(tmp_path / "serve.log", "wb") as log:
            daemon = subprocess.Popen(argv, stdout=log, stderr=log, env=env)
        try:
            token = subprocess.run(
                shlex.split(token_add), capture_output=True, text=True, env=env, check=True
            ).stdout.splitlines()[-1]
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as http:

                def listed() -> list[dict[str, Any]] | None:
                    with contextlib.suppress(httpx.TransportError):
                        r = http.get("/v1/requests")
                        if r.status_code == 200 and len(r.json()["requests"]) == len(EXPECTED):
                            return list(r.json()["requests"])
                    return None

                questions = wait_for(listed, "every question of the fleet listed")
                by_ws = {Path(q["workspace"]).name: q for q in questions}
                assert {n: q["input_type"] for n, q in by_ws.items()} == {
                    n: kind for n, (_, kind, _) in EXPECTED.items()
                }
                choice = by_ws["release-channel"]
                r = http.post(f"/v1/requests/{choice['request_id']}/answer", json={"answer": "B"})
                assert r.status_code == 202, r.text
            ws = Path(choice["workspace"])
            wait_for(lambda: metadata_status(ws) == "COMPLETED", "the answer resumed")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
        run = (ws / ".delta" / "runs" / "LATEST").read_text().strip()
        journal = ws / ".delta" / "runs" / run / "execution" / "journal.jsonl"
        assert "Shipping 1.4.0 to beta (option B)." in journal.read_text()  # the kept model's


def test_with_owners_each_workspace_is_its_owners() -> None:
    with accounts() as a, executable_by_all(), shared_tmp() as base:
        owners = [a.user().name, a.user().name]
        fleet = base / "fleet"
        with _fake_model_stopped(fleet):
            made = _fleet("--owners", ",".join(owners), str(fleet))
            assert made.returncode == 0, made.stdout + made.stderr
            assert f"(owners: {' '.join(owners)})" in made.stdout
            _paused_as_expected(fleet, owners)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "usage: bash examples/fleet.sh [--owners NAME,NAME,...] DIR"),
        (["--owner", "x", "d"], "unknown option --owner"),
        (["{nonempty}"], "is not empty: name a new directory"),
    ],
)
def test_a_wrong_call_is_one_line_and_exit_2(tmp_path: Path, args: list[str], says: str) -> None:
    (tmp_path / "taken").write_text("")
    out = _fleet(*(a.format(nonempty=tmp_path) for a in args))
    assert out.returncode == 2 and says in out.stderr and len(out.stderr.splitlines()) == 1
