"""The HTTP contract, checked against the live API: a real `deltad serve --listen` with
questions of every input type waiting, and schemathesis generating requests from its own
/openapi.json (examples, coverage, fuzzing and the stateful phase that follows the document's
links from the list to a question, its answer and its run), every check on. The event stream
is checked apart: its declared content type against what it serves."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deltad.inbox import links
from deltad.protocol.models import InputType, Option
from deltad.testing.stub import paused_workspace
from tests.support.daemon import Daemon, records, wait_for
from tests.support.inbox import client, http_url, make_token

SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
GENERATOR = str(Path(sys.executable).parent / "openapi-python-client")
CONFIG = Path(__file__).with_name("schemathesis.toml")
# Bounded for CI on 2 busy cores: a fixed seed, a few examples per operation, a time cap.
FUZZ_ARGS = ["--seed", "1717", "--max-examples", "15", "--max-time", "120", "--workers", "1"]

# What each input type's question carries besides its prompt.
EXTRA: dict[InputType, dict[str, Any]] = {
    InputType.CHOICE: {"options": [Option(key="a", label="Apple"), Option(key="p", label="Pear")]},
    InputType.NUMBER: {"minimum": 1, "maximum": 9},
    InputType.APPROVAL: {
        "calls": [{"action_id": "call_1", "tool_name": "deploy", "arguments": {"env": "prod"}}]
    },
}


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[Daemon, str, str]]:
    """A daemon serving HTTP with one question of every input type waiting."""
    root = tmp_path / "root"
    for t in InputType:
        paused_workspace(root / f"ws-{t}", f"a {t} question?", input_type=t, **EXTRA.get(t, {}))
    paused_workspace(root / "ws-link", "a question behind a signed link?")
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        url = http_url(d)
        token = make_token(d.state_dir, "fuzzer")
        with client(url, token) as http:
            wait_for(
                lambda: len(http.get("/v1/requests").json()["requests"]) == len(InputType) + 1,
                "every question listed",
            )
        yield d, url, token
    finally:
        d.stop()
        d.kill_children()


@pytest.mark.timeout(420)
def test_schemathesis_finds_the_live_api_as_its_document_says(
    live: tuple[Daemon, str, str], tmp_path: Path
) -> None:
    d, url, token = live
    ws = str(tmp_path / "root" / "ws-link")
    [request_id] = [q["request_id"] for q in _questions(url, token) if q["workspace"] == ws]
    key = links.load_key(d.state_dir)
    link = links.sign(key, request_id, ws, 3600)
    argv = [
        SCHEMATHESIS,
        "--config-file",
        str(CONFIG),
        "run",
        f"{url}/openapi.json",
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--exclude-path",
        "/v1/events",  # endless: checked below
        "--request-timeout",
        "30",
        *FUZZ_ARGS,
    ]
    env = {**os.environ, "DELTAD_CONTRACT_LINK": link}
    out = subprocess.run(  # in tmp_path: schemathesis keeps its cache in the working directory
        argv, capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    # It reached the success paths: some answers were taken and their runs resumed.
    assert records(d.record), "no answer was accepted"


def _questions(url: str, token: str) -> list[dict[str, Any]]:
    with client(url, token) as http:
        docs: list[dict[str, Any]] = http.get("/v1/requests").json()["requests"]
        return docs


def test_the_event_stream_serves_what_it_declares(live: tuple[Daemon, str, str]) -> None:
    _, url, token = live
    with client(url, token) as http:
        declared = http.get("/openapi.json").json()["paths"]["/v1/events"]["get"]["responses"]
        with http.stream("GET", "/v1/events") as r:
            assert r.status_code == 200
            served = r.headers["content-type"].split(";")[0]
            assert list(declared["200"]["content"]) == [served] == ["text/event-stream"]
            first = next(r.iter_lines())
            assert first.startswith(":")  # the stream's opening comment
        for status in ("401", "422"):
            assert list(declared[status]["content"]) == ["application/problem+json"]
    r = httpx.get(f"{url}/v1/events", timeout=30)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.headers["content-type"] == "application/problem+json"  # RFC 9457
    assert set(r.json()) == {"type", "title", "status", "detail", "error", "code"}


def test_a_client_generated_from_the_document_is_typed_and_its_errors_too(
    live: tuple[Daemon, str, str], tmp_path: Path
) -> None:
    _, url, token = live
    gen = tmp_path / "gen"
    gen.mkdir()
    argv = [GENERATOR, "generate", "--url", f"{url}/openapi.json", "--meta", "none"]
    out = subprocess.run(
        [*argv, "--output-path", str(gen / "inbox_client")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=gen,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    sys.path.insert(0, str(gen))
    try:
        _use_the_generated_client(url, token)
    finally:
        sys.path.remove(str(gen))
        for name in [m for m in sys.modules if m.split(".")[0] == "inbox_client"]:
            del sys.modules[name]


def _use_the_generated_client(url: str, token: str) -> None:
    def part(name: str) -> Any:
        return importlib.import_module(f"inbox_client.{name}")

    models = part("models")
    list_requests = part("api.requests.list_requests")
    get_request = part("api.requests.get_request")
    answer_request = part("api.requests.answer_request")
    c = part("client").AuthenticatedClient(base_url=url, token=token)
    page = list_requests.sync(client=c)
    assert isinstance(page, models.QuestionPage)
    [q] = [q for q in page.requests if q.input_type == models.InputType.CHOICE]
    assert [(o.key, o.label) for o in q.options] == [("a", "Apple"), ("p", "Pear")]
    body = models.AnswerIn(answer="p")
    receipt = answer_request.sync(q.request_id, client=c, body=body, workspace=q.workspace)
    assert isinstance(receipt, models.AnswerReceipt), receipt
    assert (receipt.request_id, receipt.answered_by) == (q.request_id, "fuzzer")
    again = answer_request.sync_detailed(q.request_id, client=c, body=body, workspace=q.workspace)
    assert again.status_code == 409 and isinstance(again.parsed, models.ErrorOut)
    assert again.parsed.code in ("answer_waiting", "already_answered")
    missing = get_request.sync("no-such-question", client=c)
    assert isinstance(missing, models.ErrorOut) and missing.code == "unknown_request"
