"""`?mine=true`'s decision (respondents.is_mine): whether a question names the caller by any
of its names or groups, among its respondents, delegates or escalated-to people."""

from __future__ import annotations

import pytest

from deltad.inbox.paging import Filters
from deltad.inbox.respondents import Answerer, is_mine

ALICE = Answerer("alice", groups=("ops",))
PERSON = Answerer("oidc:ann@example.org", groups=("sre",), also=("oidc:1234",))
ADMIN = Answerer("root", admin=True)


@pytest.mark.parametrize(
    ("respondents", "delegated", "escalated", "who", "mine"),
    [
        (["alice"], [], [], ALICE, True),  # by name
        (["group:ops"], [], [], ALICE, True),  # by group
        (["bob"], ["alice"], [], ALICE, True),  # handed to
        (["bob"], ["group:ops"], [], ALICE, True),  # handed to its group
        (["bob"], [], ["alice"], ALICE, True),  # escalated to
        (["bob"], [], ["group:ops"], ALICE, True),  # escalated to its group
        ([], [], [], ALICE, False),  # anyone may answer: nobody's in particular
        ([], [], [], ADMIN, False),
        (["bob", "group:dev"], [], [], ALICE, False),  # another person, another group
        (["bob"], ["carol"], ["group:dev"], ALICE, False),
        (["bob"], [], [], ADMIN, False),  # an admin may answer, but is not named
        (["alice"], [], [], None, False),  # a signed link names nobody
        (["oidc:ann@example.org"], [], [], PERSON, True),  # a person by email
        (["oidc:1234"], [], [], PERSON, True),  # by subject
        (["group:sre"], [], [], PERSON, True),  # by the provider's group
        (["ann@example.org", "sre"], [], [], PERSON, False),  # bare names are not hers
        (["oidc:ann@example.org"], [], [], ALICE, False),
    ],
)
def test_is_mine(
    respondents: list[str],
    delegated: list[str],
    escalated: list[str],
    who: Answerer | None,
    mine: bool,
) -> None:
    assert is_mine(respondents, delegated, escalated, who) is mine


def test_the_filter_asks_mine_last_and_only_when_asked() -> None:
    asked: list[object] = []

    def mine(e: object) -> bool:
        asked.append(e)
        return False

    class Entry:
        workspace, real, owner, created, deadline = None, "/nowhere", 7, 0.0, None
        run_id = input_type = status = None

    out_of_scope = Filters(("/srv/**",), mine=mine)
    assert not out_of_scope.keep(Entry())  # type: ignore[arg-type]
    assert asked == []  # what the scope drops is never read from the disk
