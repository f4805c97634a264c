"""The waiting questions as MCP Tasks (the 2026-07-28 Tasks extension, SEP-2663), end to end:
a real `deltad serve --listen`, real `delta` runs against the fake model, and the official `mcp`
SDK's client declaring `io.modelcontextprotocol/tasks`; the extension's methods are sent with
the client's generic request API (the SDK has no typed methods for them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status
from tests.support.inbox import make_token

from ..conftest import llm_env, wait_for
from . import test_mcp
from .test_mcp import DEADLINE, _ask

served = test_mcp.served  # the same fixture: a daemon serving HTTP on one root
TASKS = "io.modelcontextprotocol/tasks"
RAW = TypeAdapter(dict[str, Any])


class TaskParams(types.RequestParams):
    task_id: str
    input_responses: dict[str, Any] | None = None


class TaskRequest(types.Request[TaskParams, str]):
    """tasks/get, tasks/update, tasks/cancel (Mcp-Name: the task id, as SEP-2663 asks)."""

    name_param = "taskId"


@asynccontextmanager
async def session(
    url: str, token: str, tasks: bool = True, modern: bool = True
) -> AsyncIterator[ClientSession]:
    """A session as `token` (2026-07-28 unless not `modern`), declaring the Tasks extension
    (`tasks`)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=DEADLINE) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write, extensions={TASKS: {}} if tasks else None) as s,
    ):
        await (s.discover() if modern else s.initialize())
        yield s


async def task(s: ClientSession, method: str, tid: str, **more: Any) -> dict[str, Any]:
    params = TaskParams(task_id=tid, **more)
    got: dict[str, Any] = await s.send_request(TaskRequest(method=method, params=params), RAW)
    got.pop("_meta", None)  # the server's name and version, on every 2026-07-28 result
    return got


async def created(s: ClientSession, rid: str) -> dict[str, Any]:
    """answer_question without an answer: the question's task (resultType "task")."""
    call = types.CallToolRequest(
        params=types.CallToolRequestParams(name="answer_question", arguments={"request_id": rid})
    )
    got: dict[str, Any] = await s.send_request(call, RAW)
    got.pop("_meta", None)
    return got


def test_a_question_is_a_task_answered_with_tasks_update_and_the_run_resumes(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    daemon, url, root = served
    alice = make_token(daemon.state_dir, "alice", str(root / "*"))
    d = _ask(
        tmp_path,
        fake,
        root / "ws",
        prompt="Which release channel?",
        input_type="choice",
        options=["[s] stable", "[b] beta"],
    )
    rid = d.request()["request_id"]

    async def main() -> tuple[str, dict[str, Any]]:
        async with session(url, alice) as s:
            found = await s.discover()
            assert TASKS in (found.capabilities.extensions or {}), found.capabilities
            listed = await s.call_tool("list_questions", {})
            assert listed.structured_content is not None
            [q] = listed.structured_content["questions"]
            tid = q["task_id"]
            made = await created(s, rid)
            assert made["resultType"] == "task" and made["taskId"] == tid, made
            assert made["status"] == "input_required"
            got = await task(s, "tasks/get", tid)
            assert (got["taskId"], got["status"]) == (tid, "input_required"), got
            assert got["resultType"] == "complete" and got["pollIntervalMs"] > 0
            form = got["inputRequests"]["answer"]
            assert form["method"] == "elicitation/create"
            assert form["params"]["mode"] == "form"
            assert "Which release channel?" in form["params"]["message"]
            schema = form["params"]["requestedSchema"]
            assert [o["title"] for o in schema["properties"]["answer"]["oneOf"]] == [
                "stable",
                "beta",
            ]
            # A declined form, and a key never asked: ignored (SEP-2663), nothing answered.
            declined = {"answer": {"action": "decline"}, "other": {"action": "accept"}}
            assert await task(s, "tasks/update", tid, input_responses=declined) == {
                "resultType": "complete"
            }
            assert (await task(s, "tasks/get", tid))["status"] == "input_required"
            filled = {"answer": {"action": "accept", "content": {"answer": "B"}}}
            ack = await task(s, "tasks/update", tid, input_responses=filled)
            assert ack == {"resultType": "complete"}, ack
            # A retried update (the ack was lost) gets the first one's result, not a refusal.
            assert await task(s, "tasks/update", tid, input_responses=filled) == ack
            return tid, await task(s, "tasks/get", tid)

    tid, after = anyio.run(main)
    assert after["status"] in ("working", "completed"), after  # the run may have taken it
    wait_for(lambda: metadata_status(d.ws) == "COMPLETED", "the run to finish")
    assert "beta" in fake.tool_results()["q"]
    assert len(daemon.events("resume_spawned", workspace=str(d.ws))) == 1
    answered = daemon.events("mcp_answered", request_id=rid)  # the update and its retry
    assert {(e["token"], e["through"]) for e in answered} == {("alice", "task")}, answered

    async def finished(s: ClientSession) -> dict[str, Any]:
        return await task(s, "tasks/get", tid)

    async def done() -> dict[str, Any]:
        async with session(url, alice) as s:
            return await finished(s)

    end = anyio.run(done)
    assert (end["taskId"], end["status"]) == (tid, "completed"), end
    assert end["result"]["isError"] is False and "inputRequests" not in end


def test_other_tenants_forged_ids_refusals_cancel_restarts_and_no_tasks_list(
    served: tuple[Daemon, str, Path], tmp_path: Path, fake: FakeLLM
) -> None:
    daemon, url, root = served
    alice = make_token(daemon.state_dir, "alice", str(root / "*"))
    eve = make_token(daemon.state_dir, "eve", str(root / "other"))
    rita = make_token(daemon.state_dir, "rita", str(root / "*"), role="reader")
    d = _ask(tmp_path, fake, root / "ws", False, prompt="Ship it?", input_type="text")
    rid = d.request()["request_id"]
    s2 = _ask(tmp_path, fake, root / "ws2", False, prompt="Password?", input_type="password")
    secret_rid = s2.request()["request_id"]

    async def as_alice() -> tuple[str, dict[str, Any]]:
        async with session(url, alice) as s:
            got = await s.call_tool("get_question", {"request_id": rid})
            assert got.structured_content is not None
            tid = str(got.structured_content["task_id"])
            # Cancel: acknowledged, and the question stays open (it is the agent's).
            assert await task(s, "tasks/cancel", tid) == {"resultType": "complete"}
            still = await task(s, "tasks/get", tid)
            forged = tid[:-2] + ("AA" if not tid.endswith("AA") else "BB")
            for method in ("tasks/get", "tasks/update", "tasks/cancel"):
                with pytest.raises(MCPError) as e:
                    await task(s, method, forged, input_responses={})
                assert (e.value.error.code, e.value.error.message) == (
                    -32602,
                    "Failed to retrieve task: Task not found",
                )
            with pytest.raises(MCPError) as e:
                await task(s, "tasks/list", tid)
            assert e.value.error.code == -32601
            # A secret is asked as a link to the page (url mode); a filled form is ignored.
            secret = await s.call_tool("get_question", {"request_id": secret_rid})
            assert secret.structured_content is not None
            stid = str(secret.structured_content["task_id"])
            asked = (await task(s, "tasks/get", stid))["inputRequests"]["answer"]["params"]
            assert (asked["mode"], asked["url"]) == ("url", f"{url}/#request={secret_rid}")
            leaked = {"answer": {"action": "accept", "content": {"answer": "hunter2"}}}
            await task(s, "tasks/update", stid, input_responses=leaked)
            assert (await task(s, "tasks/get", stid))["status"] == "input_required"
        async with session(url, alice, tasks=False) as s:
            with pytest.raises(MCPError) as e:
                await task(s, "tasks/get", tid)
            assert e.value.error.code == -32021  # the extension was not declared
        async with session(url, alice, modern=False) as s:
            with pytest.raises(MCPError) as e:
                await task(s, "tasks/get", tid)
            assert e.value.error.code == -32601  # no such method before 2026-07-28
        async with session(url, rita) as s:
            filled = {"answer": {"action": "accept", "content": {"answer": "yes"}}}
            with pytest.raises(MCPError) as e:
                await task(s, "tasks/update", tid, input_responses=filled)
            assert e.value.error.code == -32602 and e.value.error.data == {"code": "forbidden"}
        return tid, still

    tid, still = anyio.run(as_alice)
    assert still["status"] == "input_required", still

    async def as_eve() -> None:
        async with session(url, eve) as s:
            filled = {"answer": {"action": "accept", "content": {"answer": "yes"}}}
            for method in ("tasks/get", "tasks/update", "tasks/cancel"):
                with pytest.raises(MCPError) as e:
                    await task(s, method, tid, input_responses=filled)
                assert e.value.error.message == "Failed to retrieve task: Task not found"

    anyio.run(as_eve)
    assert metadata_status(d.ws) == "WAITING_FOR_INPUT"
    assert not (d.ws / ".delta" / "interaction" / "response.json").exists()
    assert len(daemon.events("mcp_task_cancel_ignored", request_id=rid)) == 1
    assert "hunter2" not in daemon.log_path.read_text()
    assert not (s2.ws / ".delta" / "interaction" / "response.json").exists()

    # The same id after the daemon (and its inbox) restarted: the key is the state's.
    daemon.stop()
    daemon.start(env=llm_env(fake))
    now = str(daemon.wait_event("http_listening", count=2)[-1]["url"])  # the log is appended

    async def again() -> dict[str, Any]:
        async with session(now, alice) as s:
            return await task(s, "tasks/get", tid)

    assert anyio.run(again)["status"] == "input_required"
