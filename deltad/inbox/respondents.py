"""Who may answer a question over HTTP: its `respondents` (token names, people signed in
through OIDC as `oidc:<email>` or `oidc:<sub>`, and `group:NAME`s: a token's groups, or a
person's from the provider's groups claim).

A question that names none may be answered by anyone whose token's scope and role allow it.
One that names some may be answered only by a listed token, a token in a listed group, or an
admin token; a signed link names nobody, so it cannot answer such a question. The file mailbox
(`delta respond`, `echo > response.txt`) is not checked: whoever can write the workspace's
files is trusted there, as before. A delegation (delegation.py) adds its delegates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GROUP = "group:"


@dataclass(frozen=True)
class Answerer:
    """Who sends an answer over HTTP; None for a signed link."""

    name: str
    groups: tuple[str, ...] = ()
    admin: bool = False
    also: tuple[str, ...] = ()  # other names of the same caller (OIDC: `oidc:<sub>`)


def may_answer(respondents: Sequence[str], who: Answerer | None) -> bool:
    if not respondents:
        return True
    if who is None:
        return False
    if who.admin:
        return True
    return (
        who.name in respondents
        or any(n in respondents for n in who.also)
        or any(GROUP + g in respondents for g in who.groups)
    )


def refusal(respondents: Sequence[str], who: Answerer | None) -> str | None:
    """Why `who` may not answer a question for `respondents`, or None when they may."""
    if may_answer(respondents, who):
        return None
    names = ", ".join(respondents)
    if who is None:
        return f"only {names} may answer this question; a signed link names nobody: log in"
    return f"only {names} may answer this question, not {who.name}"


def names_me(asked: Sequence[str], who: Answerer | None) -> bool:
    """Whether `asked` (respondents, delegates, escalated-to people) names `who`: by any of
    its names or one of its groups. An empty list names nobody (anyone may answer such a
    question, but it is no one's in particular), and an admin is named only as anyone else."""
    if who is None:
        return False
    return (
        who.name in asked
        or any(n in asked for n in who.also)
        or any(GROUP + g in asked for g in who.groups)
    )


def is_mine(
    respondents: Sequence[str],
    delegated_to: Sequence[str],
    escalated_to: Sequence[str],
    who: Answerer | None,
) -> bool:
    """`?mine=true`: the question names `who` among its respondents, the people it was handed
    to or those it was escalated to (each of them may answer it)."""
    return names_me([*respondents, *delegated_to, *escalated_to], who)
