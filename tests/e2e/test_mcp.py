"""The inbox as an MCP server, end to end: a real `deltad serve --listen`, real `delta` runs
against the fake model, tokens made with `deltad token`, and the official `mcp` SDK's client
(streamable HTTP + ClientSession) listing, reading and answering the questions; the daemon
resumes the run as it resumes any other writer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ResourcesListChanged, listen
from mcp.shared.exceptions import MCPError

from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status
from tests.support.inbox import http_url, make_token

from ..conftest import Delta, llm_env, wait_for, write_agent

REAL_CLIENT = ["delta", "run", "--work-dir", "{workspace}"]
DEADLINE = 60.0  # seconds: generous, for a loaded machine


@pytest.fixture
def served(tmp_path: Path, fake: FakeLLM) -> Iterator[tuple[Daemon, str, Path]]:
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(tmp_path, [root], resume_command=REAL_CLIENT, http={"listen": "127.0.0.1:0"})
    d.start(env=llm_env(fake))
    try:
        yield d, http_url(d), root
    finally:
        d.stop()
        d.kill_children()


def _ask(tmp: Path, fake: FakeLLM, ws: Path, reply: bool = True, **question: Any) -> Delta:
    """A run in `ws` asks `question` (`reply`: and ends with "done" once answered; without,
    the next run started takes the next scripted step)."""
    ws.mkdir(parents=True)
    d = Delta(ws, fake, write_agent(tmp))
    fake.call("ask_human", question, id="q")
    if reply:
        fake.reply("done")
    assert d.start().code == 101
    return d


@asynccontextmanager
async def session(
    url: str, token: str | None, modern: bool, told: anyio.Event | None = None
) -> AsyncIterator[ClientSession]:
    """A session as `token`; `told` is set when the server says its resource list changed."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def heard(message: Any) -> None:
        if told is not None and isinstance(message, types.ResourceListChangedNotification):
            told.set()

    async with (
        httpx2.AsyncClient(headers=headers, timeout=DEADLINE) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write, message_handler=heard) as s,
    ):
        await (s.discover() if modern else s.initialize())
        yield s


def mcp(
    url: str,
    token: str,
    fn: Callable[[ClientSession], Any],
    modern: bool = False,
    told: Callable[[], anyio.Event] | None = None,
) -> Any:
    async def main() -> Any:
        async with session(url, token, modern, told() if told is not None else None) as s:
            return await fn(s)

    return anyio.run(main)


async def _call(s: ClientSession, name: str, **args: Any) -> types.CallToolResult:
    return await s.call_tool(name, args)


def test_an_mcp_client_lists_reads_and_answers_and_the_run_resumes_once(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    daemon, url, root = served
    alice = make_token(daemon.state_dir, "alice", str(root / "*"))
    told: list[anyio.Event] = []

    def event() -> anyio.Event:
        told.append(anyio.Event())
        return told[0]

    async def answer(s: ClientSession) -> tuple[Delta, dict[str, Any]]:
        tools = {t.name for t in (await s.list_tools()).tools}
        assert tools == {"list_questions", "get_question", "answer_question"}
        # Asked while the client is connected: it is told on its stream (2025-11-25 era).
        d = await anyio.to_thread.run_sync(
            lambda: _ask(
                tmp_path,
                fake,
                root / "ws",
                prompt="Which release channel?",
                input_type="choice",
                options=["[s] stable", "[b] beta"],
            )
        )
        with anyio.fail_after(DEADLINE):
            await told[0].wait()
        listed = await _call(s, "list_questions")
        assert not listed.is_error and listed.structured_content is not None
        [q] = listed.structured_content["questions"]
        assert (q["prompt"], q["input_type"], q["workspace"]) == (
            "Which release channel?",
            "choice",
            str(d.ws),
        )
        assert "Which release channel?" in listed.content[0].text  # type: ignore[union-attr]
        got = await _call(s, "get_question", request_id=q["request_id"])
        assert got.structured_content is not None and not got.is_error
        assert [o["label"] for o in got.structured_content["options"]] == ["stable", "beta"]
        once = {"request_id": q["request_id"], "answer": "beta", "idempotency_key": "k1"}
        done = await _call(s, "answer_question", **once)
        assert not done.is_error, done.content
        assert done.structured_content is not None
        retried = await _call(s, "answer_question", **once)  # a host's retry: the same result
        assert not retried.is_error and retried.structured_content == done.structured_content
        again = await _call(s, "answer_question", request_id=q["request_id"], answer="stable")
        assert again.is_error  # the first answer won: the second changes nothing
        return d, done.structured_content

    d, done = mcp(url, alice, answer, told=event)
    assert (done["channel"], done["answered_by"]) == ("mcp", "alice")
    wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
    assert "beta" in fake.tool_results()["q"]
    assert len(daemon.events("resume_spawned", workspace=str(d.ws))) == 1
    prom = make_token(daemon.state_dir, "prom", role="metrics")
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {prom}"}).text
    assert 'deltad_answers_total{channel="mcp"} 1.0' in text
    shown = [x for x in text.splitlines() if x.startswith("deltad_mcp")]
    # The answer and its retry, then another answer refused.
    for outcome, n in (("ok", 2), ("refused", 1)):
        want = f'deltad_mcp_tool_calls_total{{outcome="{outcome}",tool="answer_question"}} {n}.0'
        assert want in shown, shown
    assert "deltad_mcp_listeners 0.0" in shown, shown  # no subscriptions/listen stream open
    status = d("status")
    assert status.code == 0 and "alice (mcp)" in status.out, status.out
    [got] = json.loads(d("status", "--json").out)["outcome"]["answers"]
    assert (got["channel"], got["answered_by"]) == ("mcp", "alice")
    [reply] = [
        e["payload"]["reply"]
        for e in d.events("HUMAN_INTERACTION")
        if e["payload"].get("phase") == "answered"
    ]
    assert (reply["channel"], reply["answered_by"], reply["key"]) == ("mcp", "alice", "B")


def test_out_of_scope_no_token_and_secrets_are_refused_and_change_nothing(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    daemon, url, root = served
    alice = make_token(daemon.state_dir, "alice", str(root / "*"))
    eve = make_token(daemon.state_dir, "eve", str(root / "other"))
    prom = make_token(daemon.state_dir, "prom", role="metrics")
    d = _ask(tmp_path, fake, root / "ws", False, prompt="Ship it?", input_type="text")
    rid = d.request()["request_id"]
    s2 = _ask(tmp_path, fake, root / "ws2", False, prompt="Password?", input_type="password")
    secret_rid = s2.request()["request_id"]
    # Without a token, with a bad one, with a metrics-only one: refused before the SDK.
    for token, code in ((None, 401), ("not-a-token", 401), (prom, 403)):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        r = httpx.post(f"{url}/mcp", headers=headers, json={"jsonrpc": "2.0", "id": 1})
        assert r.status_code == code, r.text
        assert r.headers["content-type"] == "application/problem+json"
    assert r.status_code == 403 and "may only read /metrics" in r.json()["detail"]
    r = httpx.post(f"{url}/mcp", json={})
    assert r.headers["www-authenticate"] == "Bearer"

    async def as_eve(s: ClientSession) -> None:
        listed = await _call(s, "list_questions")
        assert listed.structured_content == {"questions": [], "next_cursor": None}
        assert (await s.list_resources()).resources == []
        for name, args in (("get_question", {}), ("answer_question", {"answer": "yes"})):
            refused = await _call(s, name, request_id=rid, **args)
            assert refused.is_error and refused.structured_content is not None
            assert refused.structured_content["code"] == "unknown_request"
            assert "refused (unknown_request)" in refused.content[0].text  # type: ignore[union-attr]

    mcp(url, eve, as_eve)
    assert metadata_status(d.ws) == "WAITING_FOR_INPUT"
    assert not (d.ws / ".delta" / "interaction" / "response.json").exists()

    # A secret is never answered over MCP: a clear reason, the page's address, nothing written.

    async def secret(s: ClientSession) -> None:
        refused = await _call(s, "answer_question", request_id=secret_rid, answer="hunter2")
        assert refused.is_error and refused.structured_content is not None
        assert refused.structured_content["code"] == "secret"
        assert "never answered over MCP" in refused.structured_content["error"]
        assert f"{url}/#request={secret_rid}" in refused.structured_content["error"]

    mcp(url, alice, secret)
    assert metadata_status(s2.ws) == "WAITING_FOR_INPUT"
    assert not (s2.ws / ".delta" / "interaction" / "response.json").exists()
    assert "hunter2" not in daemon.log_path.read_text()


def test_a_new_question_is_notified_and_answered_through_an_elicitation_form(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    """On a 2026-07-28 connection: a listening client is told of the new question, reads it as
    a resource, and answers it through the multi round-trip flow (input_required with a form,
    then the same call again with the filled form and the sealed state)."""
    daemon, url, root = served
    alice = make_token(daemon.state_dir, "alice")
    ws = root / "ws"

    async def follow(s: ClientSession) -> types.CallToolResult:
        assert (await s.list_resources()).resources == []
        async with listen(s, resources_list_changed=True) as sub:
            # Asked while the client listens (the run is a process of its own).
            await anyio.to_thread.run_sync(
                lambda: _ask(tmp_path, fake, ws, prompt="Deploy?", input_type="text")
            )
            with anyio.fail_after(DEADLINE):
                event = await sub.__anext__()
            assert isinstance(event, ResourcesListChanged)
        [res] = (await s.list_resources()).resources
        read = await s.read_resource(res.uri)
        doc = json.loads(read.contents[0].text)  # type: ignore[union-attr]
        assert doc["prompt"] == "Deploy?" and doc["input_type"] == "text"
        args = {"request_id": doc["request_id"]}

        asked = await s.call_tool("answer_question", args, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult), asked
        assert asked.input_requests is not None and asked.request_state is not None
        form = asked.input_requests["answer"]
        assert isinstance(form, types.ElicitRequest)
        assert form.params.requested_schema["required"] == ["answer"]  # type: ignore[union-attr]
        filled: dict[str, Any] = {
            "answer": types.ElicitResult(action="accept", content={"answer": "to staging"})
        }
        state = asked.request_state
        forged = state[:-4] + ("AAAA" if not state.endswith("AAAA") else "BBBB")
        with pytest.raises(MCPError, match="Invalid or expired requestState"):
            await s.call_tool("answer_question", args, input_responses=filled, request_state=forged)
        return await s.call_tool(
            "answer_question", args, input_responses=filled, request_state=state
        )

    done = mcp(url, alice, follow, modern=True)
    assert not done.is_error and done.structured_content is not None, done
    assert (done.structured_content["channel"], done.structured_content["answered_by"]) == (
        "mcp",
        "alice",
    )
    wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run to finish")
    assert "to staging" in fake.tool_results()["q"]
    assert len(daemon.events("resume_spawned", workspace=str(ws))) == 1
