"""Property-based fuzzing of everything `delta` and `deltad` parse from a workspace.

Each parser has three documented outcomes — taken, refused with a reason, or a one-line error —
and nothing else: no traceback, no hang, no other exception type.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from deltad.agent import load_agent
from deltad.errors import ConfigError
from deltad.protocol import CorruptFile, InputType, InteractionRequest, Workspace
from deltad.protocol.errors import ProtocolError
from deltad.protocol.journal import read_journal
from deltad.protocol.mailbox import parse_request
from deltad.protocol.metadata import load_metadata
from deltad.protocol.printable import show
from deltad.protocol.questions import AnswerRejected, build_options, interpret_json, interpret_text
from tests.fuzz import fuzz_settings

FUZZ = fuzz_settings(400)

# Any code point, lone surrogates included (JSON can carry "\ud800").
anytext = st.text(st.characters(codec=None, exclude_categories=()), max_size=30)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | anytext
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)
# Dates people write by hand, including ones that overflow or are naive.
dates = st.sampled_from(
    [
        "2026-01-01T00:00:00Z",
        "0001-01-01T00:00:00",
        "9999-12-31T23:59:59+14:00",
        "0001-01-01T00:00:00-12:00",
        "not a date",
        "2026-13-45T99:00:00Z",
        "",
    ]
) | st.datetimes().map(lambda d: d.isoformat())


def _request(kind: InputType, sensitive: bool = False) -> InteractionRequest:
    extra: dict[str, Any] = {}
    if kind == InputType.CHOICE:
        extra["options"] = build_options(["[A] Approve", "Reject", "Later"])
    if kind == InputType.APPROVAL:
        extra["calls"] = [
            {"action_id": "c1", "tool_name": "t"},
            {"action_id": "c2", "tool_name": "t"},
        ]
    return InteractionRequest(
        prompt="q", input_type=kind, run_id="r", action_id="a", sensitive=sensitive, **extra
    )


REQUESTS = [_request(k) for k in InputType] + [_request(InputType.CHOICE, sensitive=True)]


@FUZZ
@given(st.sampled_from(REQUESTS), st.text())
def test_text_answers_are_taken_or_refused(req: InteractionRequest, text: str) -> None:
    try:
        reply = interpret_text(req, text)
    except AnswerRejected as e:
        assert "\n" not in str(e)
        if req.is_secret:  # a refusal never quotes a secret: it reads the same for any answer
            try:
                interpret_text(req, "\x00unlike any answer\x00")
            except AnswerRejected as ref:
                assert str(e) == str(ref)
        return
    assert reply.outcome == "answered"


structured = st.fixed_dictionaries(
    {},
    optional={
        "request_id": st.sampled_from(["RID", "other"]) | st.text(max_size=5),
        "answer": st.text() | json_values,
        "decisions": st.lists(
            st.fixed_dictionaries(
                {
                    "action_id": st.sampled_from(["c1", "c2", "x"]),
                    "decision": st.sampled_from(["approve", "reject", "edit", "cancel", "maybe"]),
                },
                optional={"arguments": json_values, "reason": st.text() | json_values},
            ),
            max_size=3,
        )
        | json_values,
        "answered_by": st.text(max_size=5) | json_values,
        "extra": json_values,
    },
)


@FUZZ
@given(
    st.sampled_from(REQUESTS),
    structured.map(json.dumps) | json_values.map(json.dumps) | st.text(),
)
# Found by this test: a newline in `request_id` put a line of the file's choosing in the refusal.
# A refusal quotes the file as it is; what shows it escapes it (`printable.show`, and
# tests/e2e/test_names.py runs the forged id through delta run and delta status).
@example(REQUESTS[0], json.dumps({"request_id": "RID\nforged line", "answer": "x"}))
def test_structured_answers_are_taken_or_refused(req: InteractionRequest, raw: str) -> None:
    req = req.model_copy(update={"request_id": "RID"})
    try:
        interpret_json(req, raw)
    except AnswerRejected as e:
        assert str(e) and "\n" not in show(str(e))


@FUZZ
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "prompt": st.text() | json_values,
            "input_type": st.sampled_from([*(k.value for k in InputType), "nope"]),
            "run_id": st.text(max_size=8),
            "action_id": st.text(max_size=8),
            "request_id": st.text(max_size=8),
            "timestamp": dates,
            "expires_at": dates,
            "timeout_seconds": json_values,
            "options": json_values,
            "calls": json_values,
            "default": json_values,
            "sensitive": json_values,
        },
    )
    .map(json.dumps)
    .map(str.encode)
    | st.binary(max_size=200)
)
def test_request_files_parse_or_are_one_line(raw: bytes) -> None:
    try:
        req = parse_request(raw, Path("request.json"))
    except CorruptFile as e:
        assert "\n" not in str(e)
        return
    req.expired()  # comparing dates never raises
    req.model_dump_json()


event_types = st.sampled_from(
    [
        "RUN_START",
        "THOUGHT",
        "ACTION_REQUEST",
        "ACTION_RESULT",
        "SYSTEM_MESSAGE",
        "HUMAN_INTERACTION",
        "RUN_END",
        "FUTURE_TYPE",
    ]
)
payloads = (
    st.fixed_dictionaries(
        {},
        optional={
            k: json_values
            for k in (
                "action_id",
                "status",
                "observation_content",
                "content",
                "tool_calls",
                "phase",
                "request",
                "reply",
                "request_id",
                "run_id",
                "task",
                "agent_ref",
                "tool_name",
                "reason",
                "level",
            )
        },
    )
    | json_values
)
journal_lines = st.fixed_dictionaries(
    {
        "seq": st.integers(-2, 10**12) | json_values,
        "timestamp": dates,
        "type": event_types,
        "payload": payloads,
    },
).map(json.dumps) | st.text(max_size=40)


@FUZZ
@given(st.lists(journal_lines, max_size=6), st.binary(max_size=30))
def test_journals_read_or_are_one_line(lines: list[str], tail: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ws" / ".delta" / "runs" / "x" / "execution" / "journal.jsonl"
        path.parent.mkdir(parents=True)
        path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n" + tail)
        try:
            read_journal(path)
        except CorruptFile as e:
            assert "\n" not in str(e)


metadata_docs = st.fixed_dictionaries(
    {},
    optional={
        "run_id": st.text(max_size=10),
        "status": st.sampled_from(["RUNNING", "FAILED", "x"]),
        "task": st.text() | json_values,
        "agent_ref": st.text(),
        "start_time": dates,
        "updated_at": dates,
        "end_time": dates,
        "owner": st.fixed_dictionaries(
            {"pid": st.integers(-(2**40), 2**40) | json_values, "hostname": st.text(max_size=5)}
        )
        | json_values,
        "iterations_completed": json_values,
    },
).map(json.dumps).map(str.encode) | st.binary(max_size=100)


@FUZZ
@given(metadata_docs)
def test_metadata_loads_or_is_one_line(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ws" / ".delta" / "runs" / "x" / "execution" / "metadata.json"
        path.parent.mkdir(parents=True)
        path.write_bytes(raw)
        try:
            load_metadata(path)
        except CorruptFile as e:
            assert "\n" not in str(e)


@FUZZ
@given(st.binary(max_size=60) | st.sampled_from([b"20261122_101010_abcdef\n", b"../../etc"]))
def test_latest_is_a_run_id_or_one_line(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace.at(Path(tmp))
        ws.runs_dir.mkdir(parents=True)
        ws.latest_file.write_bytes(raw)
        try:
            ws.latest_run_id()
        except ProtocolError as e:
            assert "\n" not in str(e)


yaml_docs = (
    json_values.map(json.dumps)
    | st.text(max_size=200)
    | st.fixed_dictionaries(
        {
            "name": st.text(max_size=8) | json_values,
            "llm": st.fixed_dictionaries(
                {"model": st.text(max_size=5) | json_values}, optional={"max_tokens": json_values}
            )
            | json_values,
        },
        optional={
            "tools": st.lists(
                st.fixed_dictionaries(
                    {"name": st.sampled_from(["t", "ask_human", "bad name"])},
                    optional={
                        "exec": st.sampled_from(["ls ${dir}", "echo ${a", "a | b", ""]) | st.text(),
                        "shell": st.sampled_from(["echo '${x}'", "echo ${x}", "`id`"]) | st.text(),
                        "command": json_values,
                        "parameters": json_values,
                    },
                ),
                max_size=3,
            )
            | json_values,
            "approval": json_values,
            "max_iterations": json_values,
        },
    ).map(json.dumps)
)


@FUZZ
@given(yaml_docs)
def test_agent_configs_load_or_are_one_line(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        (home / "config.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
        (home / "system_prompt.md").write_text("You help.\n")
        try:
            load_agent(home)
        except ConfigError as e:
            assert "\n" not in str(e)


config_docs = (
    st.fixed_dictionaries(
        {},
        optional={
            "roots": json_values | st.lists(st.text(max_size=10) | json_values, max_size=3),
            "max_parallel_resumes": json_values,
            "max_parallel_resumes_per_owner": json_values,
            "resume_command": json_values,
            "state_dir": json_values,
            "log_level": json_values,
            "trusted_owners": json_values,
            "shared_group": json_values,
            "resume_env": json_values,
            "owner_credentials": json_values,
            "backoff_initial_seconds": json_values,
            "unknown_key": json_values,
        },
    ).map(json.dumps)
    | st.text(max_size=120)
    | json_values.map(json.dumps)
)


@FUZZ
@given(config_docs | st.binary(max_size=80).map(lambda b: b.decode("latin-1")))
def test_daemon_configs_load_or_list_their_problems(text: str) -> None:
    from deltad.core.config import ConfigError, load_config

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "deltad.yaml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            load_config(path, ("/tmp",))
        except ConfigError as e:
            assert e.problems and all("\n" not in p for p in e.problems)


# -- the journal's snapshot: a cache the next process believes only when it fits exactly -------
def _snapshotted_journal() -> tuple[bytes, dict[str, Any]]:
    """A small journal with a context cut and a pipeline step, and its snapshot."""
    from deltad.engine.budget import Cut
    from deltad.protocol import EventType, Journal
    from deltad.protocol.snapshot import path_of

    with tempfile.TemporaryDirectory() as tmp:
        j = Journal(Path(tmp) / "journal.jsonl")
        j.append(EventType.RUN_START, {"task": "t"})
        j.append(EventType.NODE_START, {"node": "a", "kind": "codergen", "prompt": "p"})
        for i in range(4):
            call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            j.append(EventType.THOUGHT, {"content": f"s{i}", "tool_calls": [call]})
            j.append(
                EventType.ACTION_RESULT,
                {"action_id": f"c{i}", "status": "SUCCESS", "observation_content": "ok"},
            )
        j.append(EventType.SYSTEM_MESSAGE, Cut(5, 2, {"f": 2}, "n").payload(10, 5))
        j.snapshot()
        return j.path.read_bytes(), json.loads(path_of(j.path).read_bytes())


SNAPSHOTTED = _snapshotted_journal()
snapshot_fields = st.sampled_from(
    ["version", "journal_bytes", "last_seq", "tail_offset", "kept_offsets", "history"]
)
history_fields = st.sampled_from(list(SNAPSHOTTED[1]["history"]))


@FUZZ
@given(snapshot_fields | history_fields, json_values | st.integers(-5, 2000))
def test_a_snapshot_is_used_exactly_or_not_at_all(field: str, value: Any) -> None:
    """Any one field of a snapshot changed (its digest still right): the journal opens; where
    its events begin and end is checked against the journal's own lines; what a snapshot that
    is not used would have said is what a full read knows. (A snapshot with valid but false
    history is believed: it is written by the run's owner, who can as well edit the journal.)"""
    from deltad.protocol import Journal
    from deltad.protocol.snapshot import path_of

    data, snapshot = SNAPSHOTTED
    if field in snapshot:
        changed = {**snapshot, field: value}
    else:
        changed = {**snapshot, "history": {**snapshot["history"], field: value}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "journal.jsonl"
        path.write_bytes(data)
        whole = Journal(path)
        path_of(path).write_text(json.dumps(changed))
        again = Journal(path)
        if field not in ("kept_offsets", "history") and field in snapshot:
            assert again.events == whole.events and again.next_seq == whole.next_seq
        if again.restored_bytes == 0 or changed == snapshot:
            assert again.history.state() == whole.history.state()


mail_headers = st.lists(
    st.sampled_from(
        ["From", "To", "Delivered-To", "Cc", "Subject", "Content-Type", "Auto-Submitted",
         "Content-Transfer-Encoding", "MIME-Version"]
    ).flatmap(lambda h: st.text(max_size=40).map(lambda v: f"{h}: {v}")),
    max_size=6,
)  # fmt: skip
mail_bytes = st.tuples(mail_headers, st.text(max_size=200)).map(
    lambda hb: ("\r\n".join(hb[0]) + "\r\n\r\n" + hb[1]).encode("utf-8", "surrogateescape")
) | st.binary(max_size=300)


@FUZZ
@given(st.sampled_from(REQUESTS), mail_bytes)
@example(REQUESTS[0], b"Content-Type: text/plain; charset=no-such\r\n\r\nyes")
@example(REQUESTS[0], b"Content-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\n\r\n")
# Found by this test: the standard library's address header parser raises AttributeError on
# `To: .:` (Python 3.11); such a mail is refused as unreadable.
@example(REQUESTS[0], b"To: .:\r\n\r\nyes")
def test_reply_mail_is_read_or_refused(req: InteractionRequest, raw: bytes) -> None:
    """The email channel's reading of a reply (deltad/outbound/mail.py): a reply, then an
    answer or the kind's own refusal, never another exception."""
    from deltad.outbound import mail

    try:
        reply = mail.parse(raw)
    except mail.Unreadable as e:
        assert str(e) and "\n" not in str(e)
        return
    assert all(isinstance(a, str) for a in reply.recipients)
    if reply.text is None or req.is_secret:
        return
    try:
        mail.answer_of(req, reply.text)
    except AnswerRejected as e:
        assert str(e)
