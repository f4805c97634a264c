"""The list pages' document cache (deltad/inbox/context.py `Documents`): a question's document
kept compressed, given back as it was, bounded by bytes, the least recent let go first."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from deltad import inbox
from deltad.inbox.context import Documents, Shown
from deltad.inbox.handlers import request_document
from deltad.inbox.schemas import Question, QuestionPage, document, document_json, question_page_json
from deltad.protocol import Workspace, utcnow
from deltad.protocol.layout import question_files
from deltad.testing.stub import paused_workspace


def _doc(ws: Path, prompt: str = "Ship it?") -> Question:
    paused_workspace(ws, prompt)
    p = inbox.pending(ws)
    assert p is not None
    return Question.model_validate(request_document(p, Workspace(ws), "http://127.0.0.1:1"))


def test_a_kept_document_is_given_back_as_it_was(tmp_path: Path) -> None:
    plain = _doc(tmp_path / "ws")
    # A field the document names by its alias (a call's `schema`) and one never set survive.
    call = {"action_id": "act_1", "tool_name": "scale", "schema": {"type": "object"}}
    doc = Question.model_validate({**document(plain), "calls": [call]})
    shown = Shown.of((1, 2, 3), doc, None, False)
    kept = shown.page_item()
    assert kept is not None and document(kept) == document(doc)
    assert document(kept)["calls"][0]["schema"] == {"type": "object"}
    assert len(shown.packed) < len(doc.model_dump_json())  # kept compressed
    assert Shown.of((1,), doc, None, True).page_item() is None  # an answer waits
    past = utcnow() - timedelta(seconds=1)
    assert Shown.of((1,), doc, past, False).page_item() is None  # expired


def test_the_cache_is_bounded_by_bytes_and_lets_the_least_recent_go(tmp_path: Path) -> None:
    doc = _doc(tmp_path / "ws")
    one = Shown.of((1,), doc, None, False)
    docs = Documents(budget=3 * one.size)
    for i in range(3):
        docs.put((tmp_path / f"w{i}", "r"), one)
    assert docs.get((tmp_path / "w0", "r"), (1,)) is one  # w0 now the most recent
    docs.put((tmp_path / "w3", "r"), one)  # over the budget: w1, the least recent, goes
    assert docs.get((tmp_path / "w1", "r"), (1,)) is None
    assert all(docs.get((tmp_path / f"w{i}", "r"), (1,)) is one for i in (0, 2, 3))
    docs.put((tmp_path / "w3", "r"), one)  # put again: counted once
    assert docs.held == 3 * one.size and len(docs.shown) == 3
    assert docs.get((tmp_path / "w3", "r"), (2,)) is None  # its files changed: a miss


def test_a_page_joined_from_kept_json_is_the_page_the_model_would_dump(tmp_path: Path) -> None:
    docs = [_doc(tmp_path / f"ws{i}", f'Ship {i}? ✓ "q"') for i in range(3)]
    kept = [Shown.of((1,), d, None, False).page_json() for d in docs]
    assert all(raw is not None for raw in kept)
    for cursor in (None, "eyJ0IjoxfQ"):
        joined = question_page_json([raw for raw in kept if raw is not None], cursor)
        page = QuestionPage(requests=docs, next=cursor)
        assert joined.json == document_json(page)
    assert question_page_json([], None).json == document_json(QuestionPage(requests=[], next=None))


def test_the_files_a_document_is_stamped_by_are_the_workspaces_own(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    run_id = "20261129_120000_abcdef"
    assert question_files(ws.root, run_id) == (
        str(ws.request_file),
        str(ws.interaction_dir),
        str(ws.run(run_id).metadata),
    )
    assert question_files(ws.root, "../../etc") is None  # not a run id: nothing is stamped
