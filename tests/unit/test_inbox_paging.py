"""The inbox's lists a page at a time: cursors, limits and filters from tables, pages of an
index changing between them, and the API's pages in-process (real workspace files)."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from deltad.http.app import create_app
from deltad.inbox import handlers, paging
from deltad.inbox.config import HttpConfig
from deltad.inbox.feed import Feed, Index, Listed, ListedQuestion, ListedRun, View
from deltad.inbox.handlers import Context
from deltad.inbox.tokens import TokenStore
from deltad.protocol import InteractionRequest, Mailbox, Workspace
from deltad.testing.stub import paused_workspace


def b64(doc: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


# -- cursors and limits ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "key"),
    [
        ("requests", (1.5, "/ws/a", "q1")),
        ("requests", (1732412345.123456, "/ws/\udcff\n", "q-\u00e9")),  # names are bytes
        ("runs", ("20261124_020000_abcdef", "/ws/a")),
    ],
)
def test_a_cursor_carries_its_key_back(kind: paging.Kind, key: tuple[Any, ...]) -> None:
    cursor = paging.encode(kind, key)
    assert cursor.isascii() and "=" not in cursor and "/" not in cursor and "+" not in cursor
    assert paging.decode(kind, cursor) == key


@pytest.mark.parametrize(
    ("kind", "cursor"),
    [
        ("requests", ""),
        ("requests", "!!!"),
        ("requests", b64("not a list")),
        ("requests", b64(["runs", "r1", "/ws/a"])),  # another list's cursor
        ("runs", b64(["requests", 1.0, "/ws/a", "q1"])),
        ("requests", b64(["requests", 1.0, "/ws/a"])),  # a part missing
        ("requests", b64(["requests", 1.0, "/ws/a", "q1", "x"])),
        ("requests", b64(["requests", "1.0", "/ws/a", "q1"])),  # wrong types
        ("requests", b64(["requests", True, "/ws/a", "q1"])),
        ("requests", b64(["requests", 1.0, 7, "q1"])),
        ("requests", base64.urlsafe_b64encode(b'["requests",NaN,"/ws/a","q1"]').decode()),
        ("runs", b64(["runs", "r1", None])),
    ],
)
def test_a_cursor_this_server_did_not_give_is_refused(kind: paging.Kind, cursor: str) -> None:
    with pytest.raises(paging.BadPage):
        paging.decode(kind, cursor)


@pytest.mark.parametrize(
    ("limit", "ok"), [(0, False), (-1, False), (1, True), (1000, True), (1001, False)]
)
def test_a_limit_is_between_1_and_1000(limit: int, ok: bool) -> None:
    if ok:
        assert paging.limit_of(limit) == limit
    else:
        with pytest.raises(paging.BadPage, match="between 1 and 1000"):
            paging.limit_of(limit)


# -- pages of a changing index ---------------------------------------------------------------------
def ask(index: Index, n: int, created: float) -> None:
    """Workspace /ws/N waits on question qN asked at `created`."""
    index.put(
        View(Path(f"/ws/{n}"), "waiting", f"r{n}", "WAITING_FOR_INPUT", f"q{n}", None, created)
    )


def pages(index: Index, limit: int, between: list[tuple[str, int, float]]) -> list[list[str]]:
    """Every page of the index's questions; `between` is applied after the first page."""
    out: list[list[str]] = []
    after = None
    while True:
        docs, after = paging.collect(
            index.questions(after), lambda e: True, lambda e: e.request_id, limit
        )
        out.append([str(d) for d in docs])
        if len(out) == 1:
            for op, n, created in between:
                if op == "add":
                    ask(index, n, created)
                else:
                    index.remove(Path(f"/ws/{n}"))
        if after is None:
            return out


@pytest.mark.parametrize(
    ("between", "expected"),
    [
        ([], [["q6", "q5", "q4"], ["q3", "q2", "q1"], ["q0"]]),
        ([("add", 9, 9.0)], [["q6", "q5", "q4"], ["q3", "q2", "q1"], ["q0"]]),  # newer: later
        ([("add", 7, 3.5)], [["q6", "q5", "q4"], ["q7", "q3", "q2"], ["q1", "q0"]]),
        ([("drop", 5, 0.0)], [["q6", "q5", "q4"], ["q3", "q2", "q1"], ["q0"]]),  # seen: no shift
        ([("drop", 3, 0.0)], [["q6", "q5", "q4"], ["q2", "q1", "q0"]]),  # unseen: not shown
        ([("add", 4, 10.0)], [["q6", "q5", "q4"], ["q3", "q2", "q1"], ["q0"]]),  # asked again
        ([("add", 2, 10.0)], [["q6", "q5", "q4"], ["q3", "q1", "q0"]]),  # moved above the cursor
        ([("drop", 4, 0.0), ("drop", 3, 0.0)], [["q6", "q5", "q4"], ["q2", "q1", "q0"]]),
    ],
)
def test_a_cursor_is_stable_under_inserts_and_removals(
    between: list[tuple[str, int, float]], expected: list[list[str]]
) -> None:
    index = Index()
    for n in range(7):
        ask(index, n, float(n))
    assert pages(index, 3, between) == expected


def test_the_index_lists_only_waiting_questions_and_every_latest_run() -> None:
    index = Index()
    ask(index, 1, 1.0)
    ask(index, 2, 2.0)
    index.put(View(Path("/ws/3"), "running", "r3", "RUNNING"))
    index.put(View(Path("/ws/4"), "idle"))
    assert [e.request_id for e in index.questions()] == ["q2", "q1"]
    assert [e.run_id for e in index.runs()] == ["r3", "r2", "r1"]
    index.put(View(Path("/ws/2"), "answered", "r2", "WAITING_FOR_INPUT", "q2", None, 2.0))
    assert [e.request_id for e in index.questions()] == ["q1"]
    assert index.run_holders("r2") == [Path("/ws/2")]
    index.remove(Path("/ws/2"))
    assert [e.run_id for e in index.runs()] == ["r3", "r1"] and index.run_holders("r2") == []


@pytest.mark.parametrize(
    ("readable", "limit", "docs", "next_after"),
    [
        ("yyyyy", 2, ["0", "1"], "1"),
        ("yyyyy", 5, ["0", "1", "2", "3", "4"], None),
        ("nynyy", 2, ["1", "3"], "3"),
        ("nnnnnnn", 2, [], "3"),  # at most 2 × limit read: a short page, with a cursor
        ("nnnn", 2, [], None),
        ("", 2, [], None),
    ],
)
def test_a_page_skips_what_is_gone_and_reads_a_bounded_number(
    readable: str, limit: int, docs: list[str], next_after: str | None
) -> None:
    entries = [
        ListedRun(View(Path(f"/ws/{i}"), "done", str(i), owner=0)) for i in range(len(readable))
    ]

    def read(e: Listed) -> str | None:
        i = int(e.key[0])
        return str(i) if readable[i] == "y" else None

    got, after = paging.collect(entries, lambda e: True, read, limit)
    assert got == docs and after == (
        None if next_after is None else (next_after, f"/ws/{next_after}")
    )


# -- filters ---------------------------------------------------------------------------------------
ENTRY = ListedQuestion(
    View(
        Path("/srv/ws/alice/p"),
        "waiting",
        "r1",
        "WAITING_FOR_INPUT",
        "q1",
        "choice",
        1.0,
        owner=1000,
    )
)
MOVED = ListedQuestion(  # a symlink: its real path is elsewhere
    View(
        Path("/srv/ws/alice/l"),
        *("waiting", "r2", "RUNNING", "q2", "text", 1.0),
        real="/srv/ws/bob/p",
        owner=1000,
    )
)


@pytest.mark.parametrize(
    ("entry", "filters", "kept"),
    [
        (ENTRY, paging.Filters(("/**",)), True),
        (ENTRY, paging.Filters(("/srv/ws/alice",)), True),
        (ENTRY, paging.Filters(("/srv/ws/bob",)), False),
        (MOVED, paging.Filters(("/srv/ws/alice",)), False),  # a symlink out of the scope
        (MOVED, paging.Filters(("/srv/ws/alice", "/srv/ws/bob")), True),
        (ENTRY, paging.Filters(("/**",), workspace="/srv/ws/*/p"), True),
        (ENTRY, paging.Filters(("/**",), workspace="/srv/ws/bob"), False),
        (ENTRY, paging.Filters(("/**",), owner=1000), True),
        (ENTRY, paging.Filters(("/**",), owner=0), False),
        (ENTRY, paging.Filters(("/**",), run_id="r1"), True),
        (ENTRY, paging.Filters(("/**",), run_id="r2"), False),
        (ENTRY, paging.Filters(("/**",), input_type="choice"), True),
        (ENTRY, paging.Filters(("/**",), input_type="text"), False),
        (MOVED, paging.Filters(("/**",), status="RUNNING"), True),
        (MOVED, paging.Filters(("/**",), status="COMPLETED"), False),
        (
            ENTRY,
            paging.Filters(("/**",), workspace="/srv/**", owner=1000, input_type="choice"),
            True,
        ),
    ],
)
def test_filters(entry: Listed, filters: paging.Filters, kept: bool) -> None:
    assert filters.keep(entry) is kept


@pytest.mark.parametrize(("owner", "uid"), [(None, None), ("0", 0), ("root", 0), ("1234", 1234)])
def test_an_owner_is_a_uid_or_a_user_name(owner: str | None, uid: int | None) -> None:
    assert paging.owner_uid(owner) == uid


@pytest.mark.parametrize("owner", ["no-such-user-here", "\u00d6\u00e4J\x00", "\u00b2", "9" * 5000])
def test_an_unknown_owner_name_is_refused(owner: str) -> None:
    # A NUL byte (schemathesis found it: a 500), a digit int() refuses, a number past any uid.
    with pytest.raises(paging.BadPage, match="no user"):
        paging.owner_uid(owner)


# -- the API's pages in-process --------------------------------------------------------------------
@pytest.fixture
def api(tmp_path: Path) -> tuple[TestClient, Feed, dict[str, str], Path]:
    feed = Feed()
    store = TokenStore(tmp_path / "state")
    ctx = Context(feed, store, HttpConfig(), os.urandom(32), base_url="http://127.0.0.1:1")
    auth = {"Authorization": f"Bearer {store.add('ops', [], 'answerer')}"}
    return TestClient(create_app(ctx)), feed, auth, tmp_path / "root"


def question(feed: Feed, ws: Path, **fields: object) -> tuple[str, str]:
    """A real paused workspace asking a question the index knows: (request id, run id)."""
    run_id = paused_workspace(ws)
    (ws / ".delta" / "interaction" / "request.json").unlink()
    req = InteractionRequest(run_id=run_id, action_id="act_1", **fields)  # type: ignore[arg-type]
    Mailbox(Workspace.at(ws)).post(req)
    created = req.timestamp.timestamp()
    view = View(ws, "waiting", run_id, "WAITING_FOR_INPUT", req.request_id, req.input_type, created)
    feed.index.put(view)
    return req.request_id, run_id


def every_page(
    http: TestClient, path: str, auth: dict[str, str], **params: Any
) -> list[dict[str, Any]]:
    listed = path.rsplit("/", 1)[1]
    docs: list[dict[str, Any]] = []
    while True:
        r = http.get(path, params=params, headers=auth)
        assert r.status_code == 200, r.text
        docs += r.json()[listed]
        if r.json()["next"] is None:
            return docs
        params["cursor"] = r.json()["next"]


def test_the_api_pages_questions_and_runs_each_once_with_filters(
    api: tuple[TestClient, Feed, dict[str, str], Path],
) -> None:
    http, feed, auth, root = api
    asked = [question(feed, root / f"w{i}", prompt=f"{i}?") for i in range(5)]
    name, _ = question(feed, root / "named", prompt="How many?", input_type="number")
    first = http.get("/v1/requests", params={"limit": 2}, headers=auth).json()
    assert len(first["requests"]) == 2 and first["next"]
    listed = every_page(http, "/v1/requests", auth, limit=2)
    assert sorted(q["request_id"] for q in listed) == sorted([rid for rid, _ in asked] + [name])
    assert [q["timestamp"] for q in listed] == sorted(
        (q["timestamp"] for q in listed), reverse=True
    )
    texts = every_page(http, "/v1/requests", auth, input_type="number")
    assert [q["request_id"] for q in texts] == [name]
    assert [
        q["request_id"] for q in every_page(http, "/v1/requests", auth, run_id=asked[3][1])
    ] == [asked[3][0]]
    assert len(every_page(http, "/v1/requests", auth, owner="root", limit=4)) == 6
    assert every_page(http, "/v1/requests", auth, owner="4242") == []
    assert [
        q["prompt"] for q in every_page(http, "/v1/requests", auth, workspace=str(root / "w1"))
    ] == ["1?"]
    # An answered question (its answer waiting for the resume) drops out of the list.
    r = http.post(f"/v1/requests/{asked[0][0]}/answer", json={"answer": "yes"}, headers=auth)
    assert r.status_code == 202
    assert asked[0][0] not in {q["request_id"] for q in every_page(http, "/v1/requests", auth)}
    # A question whose file vanished is skipped, never a 500.
    (root / "w2" / ".delta" / "interaction" / "request.json").unlink()
    assert len(every_page(http, "/v1/requests", auth, limit=1)) == 4
    runs = every_page(http, "/v1/runs", auth, limit=4)
    assert sorted(r["run_id"] for r in runs) == sorted(
        feed.index.get(root / n).run_id for n in [f"w{i}" for i in range(5)] + ["named"]
    )  # type: ignore[union-attr]
    assert [r["run_id"] for r in runs] == sorted((r["run_id"] for r in runs), reverse=True)
    assert every_page(http, "/v1/runs", auth, status="COMPLETED") == []
    assert len(every_page(http, "/v1/runs", auth, status="WAITING_FOR_INPUT", owner="0")) == 6


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/v1/requests", {"limit": 0}),
        ("/v1/requests", {"limit": 1001}),
        ("/v1/requests", {"cursor": "zzz"}),
        ("/v1/requests", {"cursor": paging.encode("runs", ("r", "/ws"))}),
        ("/v1/requests", {"owner": "no-such-user-here"}),
        ("/v1/runs", {"limit": 5000}),
        ("/v1/runs", {"cursor": paging.encode("requests", (1.0, "/ws", "q"))}),
    ],
)
def test_a_bad_page_is_422_in_one_line(
    api: tuple[TestClient, Feed, dict[str, str], Path], path: str, params: dict[str, Any]
) -> None:
    http, _, auth, _ = api
    r = http.get(path, params=params, headers=auth)
    assert r.status_code == 422 and r.json()["code"] == "bad_page"
    assert "\n" not in r.json()["error"]


def test_a_page_reuses_a_document_while_its_files_are_the_same(
    api: tuple[TestClient, Feed, dict[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    http, feed, auth, root = api
    rid, run_id = question(feed, root / "a", prompt="First?")
    question(feed, root / "b", prompt="Other?")
    reads: list[Path] = []
    real_read = handlers.pending_question

    def counted(ws: Path) -> Any:
        reads.append(ws)
        return real_read(ws)

    monkeypatch.setattr(handlers, "pending_question", counted)
    prompts = lambda: sorted(q["prompt"] for q in every_page(http, "/v1/requests", auth))  # noqa: E731
    assert prompts() == ["First?", "Other?"] and len(reads) == 2
    assert prompts() == ["First?", "Other?"] and len(reads) == 2  # from memory: no read
    # The question replaced in place (a new file, the same id): read again.
    req = InteractionRequest(run_id=run_id, action_id="act_1", prompt="Second?", request_id=rid)
    Mailbox(Workspace.at(root / "a")).post(req)
    assert prompts() == ["Other?", "Second?"] and len(reads) == 3
    # An answer written (the mailbox directory changes): read again, and not listed.
    (root / "a" / ".delta" / "interaction" / "response.txt").write_text("yes")
    assert prompts() == ["Other?"] and len(reads) == 4


def test_a_workspace_linked_from_inside_a_scope_is_not_listed_to_it(
    api: tuple[TestClient, Feed, dict[str, str], Path],
) -> None:
    http, feed, _, root = api
    store: TokenStore = http.app.state.ctx.tokens  # type: ignore[attr-defined]
    rid, run_id = question(feed, root / "bob" / "secret", prompt="Bob's?")
    (root / "alice").mkdir()
    link = root / "alice" / "peek"
    link.symlink_to(root / "bob" / "secret")
    feed.index.put(View(link, "waiting", run_id, "WAITING_FOR_INPUT", rid, "text", 1.0))
    alice = {"Authorization": f"Bearer {store.add('alice', [str(root / 'alice')], 'reader')}"}
    assert every_page(http, "/v1/requests", alice) == []
    assert every_page(http, "/v1/runs", alice) == []
    both = {"Authorization": f"Bearer {store.add('both', [str(root)], 'reader')}"}
    assert len(every_page(http, "/v1/requests", both)) == 2


def test_a_workspace_only_found_is_filed_without_resolving_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Startup files 100,000 found workspaces before READY: none may cost an open and a
    readlink. What is listed (a run or a question) is filed with its real path and owner, for
    the scopes and the owner filter."""
    from deltad.inbox import feed

    resolved: list[Path] = []

    def where(ws: Path) -> tuple[str, int | None]:
        resolved.append(ws)
        return "/real" + str(ws), 7

    monkeypatch.setattr(feed, "_where", where)
    index, ws = Index(), tmp_path / "w"
    index.put(View(ws, "idle"))
    assert resolved == [] and index.get(ws) == View(ws, "idle")
    index.put(View(ws, "waiting", None, None, "q1", "text", 1.0))  # a question, its run unnamed
    index.put(View(ws, "running", "r1", "RUNNING"))
    assert resolved == [ws, ws]
    [run] = list(index.runs())
    assert (run.real, run.owner) == ("/real" + str(ws), 7)
