"""Delegation's rules, from tables: who may answer after a hand-over, who may hand over, to
whom; and the record bound to its question."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltad.inbox import delegation, handover
from deltad.inbox.handover import Delegation
from deltad.inbox.respondents import Answerer, may_answer
from deltad.protocol import Workspace

TO_BOB = Delegation(by="alice", to="bob", note="", at="2026-11-26T00:00:00Z")
KNOWN = {"alice", "bob", "carol", "group:ops"}


@pytest.mark.parametrize(
    ("respondents", "handed", "who_may"),
    [
        ([], [], []),  # anyone, before and after
        ([], [TO_BOB], []),
        (["alice"], [], ["alice"]),
        (["alice"], [TO_BOB], ["alice", "bob"]),  # added, not replaced
        (["alice", "bob"], [TO_BOB], ["alice", "bob"]),
    ],
)
def test_the_delegates_join_the_respondents(
    respondents: list[str], handed: list[Delegation], who_may: list[str]
) -> None:
    assert handover.answerers(respondents, handed) == who_may


ALICE, BOB, CAROL = Answerer("alice"), Answerer("bob"), Answerer("carol", ("ops",))
ADMIN = Answerer("root", admin=True)


@pytest.mark.parametrize(
    ("respondents", "handed", "who", "to", "code"),
    [
        (["alice"], [], ALICE, "bob", None),
        (["alice"], [], BOB, "carol", "not_a_respondent"),  # bob may not answer: nor hand on
        (["alice"], [TO_BOB], BOB, "carol", None),  # now he may
        (["group:ops"], [], CAROL, "alice", None),
        (["alice"], [], ADMIN, "group:ops", None),
        (["alice"], [], None, "bob", "not_a_respondent"),  # a signed link names nobody
        (["alice"], [], ALICE, "mallory", "unknown_delegate"),
        (["alice"], [], ALICE, "group:nobody", "unknown_delegate"),
        (["alice"], [], ALICE, "alice", "unknown_delegate"),
        ([], [], BOB, "carol", None),  # anyone may answer, so anyone may hand on
        (["alice"], [TO_BOB] * 20, ALICE, "carol", "unknown_delegate"),  # the cap
    ],
)
def test_who_may_hand_a_question_over_and_to_whom(
    respondents: list[str],
    handed: list[Delegation],
    who: Answerer | None,
    to: str,
    code: str | None,
) -> None:
    why = delegation.refusal(respondents, handed, who, to, KNOWN, "")
    assert (why.code if why else None) == code


ALICE_OIDC = Answerer("oidc:alice@example.com", ("ops",), also=("oidc:alice",))


@pytest.mark.parametrize(
    ("to", "people", "code"),
    [
        ("oidc:bob@example.com", True, None),  # a person: taken as named, as a respondent is
        ("oidc:bob", True, None),
        ("oidc:bob@example.com", False, "unknown_delegate"),  # OIDC is not configured
        ("oidc:", True, "unknown_delegate"),  # not a name deltad keeps
        ("oidc:bob example", True, "unknown_delegate"),
        ("oidc:-bob", True, "unknown_delegate"),
        ("oidc:" + "b" * 60, True, "unknown_delegate"),  # over the wire's 64
        ("group:sre", True, None),  # the provider's groups cannot be listed
        ("group:sre", False, "unknown_delegate"),
        ("group:bad name", True, "unknown_delegate"),
        ("group:ops", False, None),  # the token table's, as before
        ("mallory", True, "unknown_delegate"),  # a token must still exist
        ("bob", True, None),
    ],
)
def test_who_a_question_may_be_handed_to_with_and_without_oidc(
    to: str, people: bool, code: str | None
) -> None:
    why = delegation.refusal(["alice"], [], ALICE, to, KNOWN, "", people)
    assert (why.code if why else None) == code
    assert why is None or "\n" not in str(why)


def test_a_person_may_hand_over_but_not_to_themselves_by_either_name() -> None:
    asked = ["group:ops"]
    assert delegation.refusal(asked, [], ALICE_OIDC, "oidc:bob", KNOWN, "", True) is None
    for me in ("oidc:alice@example.com", "oidc:alice"):
        why = delegation.refusal(asked, [], ALICE_OIDC, me, KNOWN, "", True)
        assert why is not None and why.code == "unknown_delegate", me
    # Once handed to, the person may answer (by their name or the sub they also answer to).
    handed = [Delegation(by="alice", to="oidc:bob", note="", at="2026-11-26T00:00:00Z")]
    allowed = handover.answerers(["alice"], handed)
    assert may_answer(allowed, Answerer("oidc:bob@example.com", also=("oidc:bob",)))
    assert not may_answer(allowed, Answerer("oidc:carol@example.com", also=("oidc:carol",)))


def test_the_record_belongs_to_its_question(tmp_path: Path) -> None:
    ws = Workspace.at(tmp_path)
    ws.interaction_dir.mkdir(parents=True)
    rec = handover.Record(request_id="q1", delegations=[TO_BOB])
    handover.path_of(ws).write_text(rec.model_dump_json())
    assert handover.read(ws, "q1") == [TO_BOB]
    assert handover.read(ws, "q2") == []  # a later question ignores it
    handover.path_of(ws).write_text("{not json")
    assert handover.read(ws, "q1") == []  # damaged: widens nothing, blocks nothing
