"""Operating a real `deltad serve --listen 127.0.0.1:0`: /readyz stays 503 until every one of
1,000 workspaces is in the index (held incomplete by the test, never raced), /livez while the
loop turns, `deltad status` saying the same; /metrics behind a metrics token, an answer counted
by channel and its resume by executor and result; the access log and the failed-login line."""

from __future__ import annotations

import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench import trees
from tests.support.daemon import DELTAD, Daemon, answer, paused_workspace, wait_for
from tests.support.inbox import client, http_url, make_token

HOLD_HOOK = Path(__file__).parent / "hold"  # its sitecustomize.py holds the daemon's pace
N = 1000


def _held_env(hold: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(HOLD_HOOK), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "DELTAD_TEST_HOLD": str(hold)}


def _status_out(d: Daemon, *extra: str) -> str:
    out = subprocess.run(
        [DELTAD, "status", *extra, "--state-dir", str(d.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def _status(d: Daemon) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_status_out(d, "--json"))
    return doc


def _health_line(d: Daemon) -> str:
    [line] = [x for x in _status_out(d).splitlines() if x.startswith("health: ")]
    return line


def _failing(url: str, path: str) -> list[str]:
    with client(url) as http:
        r = http.get(path, params={"verbose": "1"})
    checks = r.json()["checks"]
    failing = [c["name"] for c in checks if not c["ok"]]
    assert (r.status_code == 200) is (not failing), r.text
    return failing


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_readyz_is_503_until_all_1000_workspaces_are_indexed_then_200(tmp_path: Path) -> None:
    root = tmp_path / "root"
    trees.build(root, N, jobs=1, out=io.StringIO(), reserve=trees.Reserve(0, 0))
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "walk").touch()
    (hold / "reads").touch()
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}, log_level="info")
    token = make_token(d.state_dir, "alice", role="reader")
    prom = make_token(d.state_dir, "prom", role="metrics")
    d.start(env=_held_env(hold), wait=False)
    try:
        url = http_url(d)  # listening before the startup walk, which is held
        assert _failing(url, "/readyz") == ["ready", "index"]
        assert _failing(url, "/healthz") == ["ready", "index"]
        assert _failing(url, "/livez") == []  # a walk's slices are turns
        assert not d.events("daemon_ready")
        (hold / "walk").unlink()
        d.wait_event("daemon_ready")
        # READY, and the questions the walk only glanced at are not read yet: still 503.
        assert _failing(url, "/readyz") == ["index"]
        with client(url) as http:
            checks = http.get("/readyz", params={"verbose": ""}).json()["checks"]
        assert checks[1]["detail"] == f"{N} of {N} workspaces still to read"
        with client(url, token) as http:
            assert len(http.get("/v1/requests").json()["requests"]) < 100  # what 200 [] was
        with client(url, prom) as http:
            got = samples(http.get("/metrics").text)
        assert (got[("deltad_ready", ())], got[("deltad_index_complete", ())]) == (0.0, 0.0)
        assert _failing(url, "/livez") == []  # the loop turns: it only reads nothing
        health = _status(d)["health"]
        assert (health["ready"], [c["name"] for c in health["checks"] if not c["ok"]]) == (
            False,
            ["index"],
        )
        assert _health_line(d) == (
            f"health: not ready (index: {N} of {N} workspaces still to read), live"
        )
        (hold / "reads").unlink()
        with client(url) as http:
            wait_for(lambda: http.get("/readyz").status_code == 200, "/readyz 200")
        d.wait_event("index_complete", workspaces=N)
        with client(url, token) as http:
            page = http.get("/v1/requests", params={"limit": N}).json()
        assert len(page["requests"]) == N and page["next"] is None
        with client(url, prom) as http:
            got = samples(http.get("/metrics").text)
        assert got[("deltad_ready", ())] == 1.0
        assert sum(v for (name, _), v in got.items() if name == "deltad_requests_pending") == N
        assert got[("deltad_workspaces", (("state", "waiting"),))] == N
        wait_for(lambda: _status(d)["health"]["ready"], "deltad status: ready")
        assert _health_line(d) == "health: ready, live"
    finally:
        d.stop()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Daemon, str, Path]]:
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        yield d, http_url(d), root
    finally:
        d.stop()
        d.kill_children()


def test_metrics_count_an_answer_and_its_resume_and_the_log_names_each_request(
    served: tuple[Daemon, str, Path],
) -> None:
    d, url, root = served
    prom = make_token(d.state_dir, "prom", role="metrics")
    alice = make_token(d.state_dir, "alice", role="answerer")
    with client(url) as http:
        assert http.get("/livez").status_code == 200
        wait_for(lambda: http.get("/readyz").status_code == 200, "/readyz 200")
        assert http.get("/metrics").status_code == 401
        for _ in range(3):
            assert http.post("/v1/session", json={"token": "dlt_guess"}).status_code == 401
    with client(url, alice) as http:
        assert http.get("/metrics").status_code == 403  # an answerer's token is not enough
    with client(url, prom) as http:
        assert http.get("/v1/requests").status_code == 403  # a metrics token reads no question
        before = samples(http.get("/metrics").text)
    assert before[("deltad_ready", ())] == 1.0
    ws = root / "ws1"
    paused_workspace(ws)
    answer(ws, "yes")
    d.wait_resumed(ws)
    d.wait_event("resume_exited", workspace=str(ws))

    def counted() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
        with client(url, prom) as http:
            got = samples(http.get("/metrics").text)
        ended = [v for (n, _), v in got.items() if n == "deltad_resumes_total"]
        return got if sum(ended) >= 1 else None

    got = wait_for(counted, "the resume counted")
    assert got[("deltad_answers_total", (("channel", "file"),))] == 1.0
    [(labels, value)] = [(lb, v) for (n, lb), v in got.items() if n == "deltad_resumes_total"]
    assert dict(labels)["result"] == "succeeded" and value == 1.0
    assert got[("deltad_answer_to_resume_seconds_count", ())] == 1.0
    assert (
        got[
            (
                "deltad_http_requests_total",
                (("code", "401"), ("method", "GET"), ("route", "/metrics")),
            )
        ]
        == 1.0
    )
    assert not any("workspace" in dict(lb) or str(ws) in str(lb) for (_, lb) in got)
    # The log: one line per request, naming route and token, never a token; one failed-auth
    # line for the three bad logins from this client.
    lines = d.events("http_request")
    assert {"/livez", "/readyz", "/metrics", "/v1/session", "/v1/requests"} <= {
        e["route"] for e in lines
    }
    assert any(
        e["route"] == "/metrics" and e["token"] == "prom" and e["code"] == 200 for e in lines
    )
    failed = d.events("http_auth_failed")
    assert [(e["client"], e["route"]) for e in failed][:1] == [("127.0.0.1", "/metrics")]
    assert len([e for e in failed if e["client"] == "127.0.0.1"]) == 1
    text = d.log_path.read_text()
    assert prom not in text and alice not in text and "dlt_guess" not in text
