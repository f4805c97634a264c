"""One question's life as one trace, end to end: a real `deltad serve --listen` with `traces:`
exporting over OTLP/HTTP to a stand-in collector on 127.0.0.1 (tests/support/otlp.py, which
decodes the protobuf export with the protocol's own messages). A real `delta run` asks, the
answer comes over the HTTP API, the daemon resumes the run with TRACEPARENT, and the question
that resumed run asks joins the same trace under the resume."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.testing import FakeLLM
from deltad.testing.stub import paused_workspace
from tests.support.daemon import Daemon, metadata_status, wait_for
from tests.support.inbox import client, http_url, make_token
from tests.support.otlp import Collector, Span, collector
from tests.support.slackapi import SlackApi

from ..conftest import Delta, llm_env, write_agent

HEADER_SECRET = "otlp-api-key-of-the-test-7f3a"
CALLER = "00-5bd66ef5095369c7b0d1f8f4bd33716a-c532cb4098ac3dd2-01"  # the answering client's
SLACK_TOKEN = "xoxb-test-token-of-the-traces-test"
ANSWERS = ("ship-it-0xA1", "v1.4-0xB2")  # distinctive: no span may carry them


@pytest.fixture
def otlp() -> Iterator[Collector]:
    with collector() as c:
        yield c


@pytest.fixture
def slack() -> Iterator[SlackApi]:
    with SlackApi(token=SLACK_TOKEN) as api:
        yield api


def _slack_channel(tmp: Path, api: SlackApi) -> dict[str, object]:
    """A channel to deliver through (the stand-in of Slack's Web API on 127.0.0.1)."""
    secrets = tmp / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "token").write_text(SLACK_TOKEN + "\n")
    (secrets / "signing").write_text("signing-secret-of-the-test\n")
    for f in secrets.iterdir():
        f.chmod(0o600)
    return {
        "token": {"secret_file": str(secrets / "token")},
        "signing_secret": {"secret_file": str(secrets / "signing")},
        "channel": "C0DELTAD",
        "users": {"U0ALICE": "alice"},
        "api_url": api.url,
    }


def _request(ws: Path) -> dict[str, object] | None:
    try:
        doc = json.loads((ws / ".delta" / "interaction" / "request.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _some(spans: list[Span], name: str, request_id: str) -> list[Span]:
    return [s for s in spans if s.name == name and s.attributes["deltad.request_id"] == request_id]


def _one(spans: list[Span], name: str, request_id: str) -> Span:
    [s] = [s for s in spans if s.name == name and s.attributes["deltad.request_id"] == request_id]
    return s


def test_a_question_asked_answered_and_resumed_is_one_trace(
    tmp_path: Path, fake: FakeLLM, otlp: Collector, slack: SlackApi
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    headers = tmp_path / "otlp-headers"
    headers.write_text(f"# the collector's key\nAuthorization: Bearer {HEADER_SECRET}\n")
    headers.chmod(0o600)
    traces = {
        "otlp_endpoint": otlp.url,
        "service_name": "deltad-e2e",
        "headers_file": str(headers),
    }
    d = Daemon(
        tmp_path,
        [root],
        resume_command=["delta", "run", "--work-dir", "{workspace}"],
        http={"listen": "127.0.0.1:0"},
        traces=traces,
        channels={"slack": _slack_channel(tmp_path, slack)},
    ).start(env=llm_env(fake))
    try:
        url = http_url(d)
        alice = make_token(d.state_dir, "alice")
        fake.call("ask_human", {"prompt": "Merge?"}, id="ask1")
        fake.call("ask_human", {"prompt": "Tag?"}, id="ask2")
        fake.reply("merged and tagged")
        ws = root / "ws"
        ws.mkdir()
        r = Delta(ws, fake, write_agent(tmp_path)).start("merge the branch")
        assert r.code == 101, r.err
        first = _request(ws)
        assert first is not None and "traceparent" not in first  # a person's run: no carrier
        rid1 = str(first["request_id"])

        def answer(request_id: str, text: str, headers: dict[str, str]) -> None:
            with client(url, alice) as c:
                wait_for(lambda: c.get(f"/v1/requests/{request_id}").status_code == 200, "listed")
                path = f"/v1/requests/{request_id}/answer"
                ok = c.post(path, json={"answer": text}, headers=headers)
            assert ok.status_code == 202, ok.text

        # Exported while the daemon runs (its batch, beside the loop): the announcement.
        wait_for(lambda: _some(otlp.all(), "announce", rid1), "the announcement exported")
        wait_for(lambda: _some(otlp.all(), "deliver", rid1), "the channel's hand-off exported")
        answer(rid1, ANSWERS[0], {"traceparent": CALLER})  # carried over the wire to the core
        second = wait_for(
            lambda: (q := _request(ws)) is not None and q["prompt"] == "Tag?" and q,
            "the resumed run's question",
        )
        assert "traceparent" in second, second
        rid2 = str(second["request_id"])
        answer(rid2, ANSWERS[1], {"traceparent": "00-not-a-context"})  # no context: no link
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed")
        wait_for(lambda: len(otlp.by_name("resume")) == 2, "both resumes' spans exported")
    finally:
        d.stop()
        d.kill_children()

    spans = otlp.all()
    assert not otlp.failures
    assert all(h.get("authorization") == f"Bearer {HEADER_SECRET}" for h in otlp.headers)
    assert HEADER_SECRET not in d.log_path.read_text()
    assert {s.service for s in spans} == {"deltad-e2e"}
    # One trace: the first question's (derived), which the resumed run's question joined.
    assert len({s.trace_id for s in spans}) == 1, [(s.name, s.trace_id) for s in spans]

    ask1 = _one(spans, "ask_human", rid1)
    assert ask1.parent_id == ""  # the root: the person's run carried no context
    stages1 = [_one(spans, n, rid1) for n in ("announce", "deliver", "answer", "resume")]
    assert all(s.parent_id == ask1.span_id for s in stages1)
    announce1, deliver1, answer1, resume1 = stages1
    # The stages in order (the announcement and the hand-off are told on two threads at once).
    assert ask1.start <= min(announce1.start, deliver1.start)
    assert max(announce1.start, deliver1.end) <= answer1.start <= resume1.start
    assert deliver1.attributes["deltad.channel"] == "slack"  # one span per channel: one here
    assert resume1.attributes["deltad.reason"] == "answer"
    assert resume1.attributes["deltad.exit"] == "waiting"  # it paused on the next question
    assert resume1.end >= resume1.start
    assert answer1.links == [(CALLER[3:35], CALLER[36:52])]  # the HTTP request that answered

    # The resume's context went to `delta run` as TRACEPARENT, and into its question's file.
    carried = str(second["traceparent"])
    assert carried == f"00-{resume1.trace_id}-{resume1.span_id}-01"
    ask2 = _one(spans, "ask_human", rid2)
    assert ask2.parent_id == resume1.span_id
    # Answered before the loop looked at it, a question is never announced: not asserted.
    answer2, resume2 = [_one(spans, n, rid2) for n in ("answer", "resume")]
    assert answer2.parent_id == resume2.parent_id == ask2.span_id
    assert resume2.attributes["deltad.exit"] == "completed"
    assert resume1.start <= ask2.start <= answer2.start <= resume2.start
    assert answer1.attributes["deltad.channel"] == answer2.attributes["deltad.channel"] == "http"
    assert answer2.links == []

    # What each resumed run did with its answer: its journaled ACTION_RESULT, under the resume.
    for resume, action in ((resume1, "ask1"), (resume2, "ask2")):
        [result] = _some(spans, "action_result", str(resume.attributes["deltad.request_id"]))
        assert result.parent_id == resume.span_id
        assert result.attributes["deltad.action_id"] == action
        assert result.attributes["deltad.status"] == "SUCCESS"
        assert resume.start <= result.start <= resume.end

    for s in spans:
        assert s.attributes["deltad.workspace"] == str(ws)
        for v in s.attributes.values():
            assert all(a not in str(v) for a in ANSWERS), (s.name, v)


def test_without_traces_the_otel_environment_turns_nothing_on(
    tmp_path: Path, otlp: Collector
) -> None:
    """The standard variables name a collector, but `traces:` is absent: nothing is sent and no
    resume is handed a context."""
    root = tmp_path / "root"
    root.mkdir()
    base = otlp.url.removesuffix("/v1/traces")
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": base,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.url,
        "OTEL_TRACES_EXPORTER": "otlp",
        "TRACEPARENT": CALLER,  # the daemon's own environment is not a resume's
    }
    d = Daemon(tmp_path, [root], mode="probe").start(env=env)
    try:
        ws = root / "ws"
        paused_workspace(ws, "Go?")
        (ws / ".delta" / "interaction" / "response.txt").write_text("yes\n")
        # A probe writes two records, what it is and then what it ingested: the first is ours.
        probe = d.wait_resumed(ws)[0]
        d.wait_event("resume_exited", workspace=str(ws))
    finally:
        d.stop()
        d.kill_children()
    assert "TRACEPARENT" not in probe["facts"]["env"]
    assert [r for r in d.resumed(ws) if "facts" in r] == [probe]  # resumed once
    assert not d.events("traces_exporting")
    assert otlp.all() == [] and otlp.failures == []  # stopped: anything queued was sent by now
