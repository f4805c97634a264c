"""The condition language (attractor spec §10): parsing and evaluation."""

from __future__ import annotations

from typing import Any

import pytest

from deltad.pipeline import ConditionError, parse_condition


def holds(text: str, outcome: str = "success", preferred: str = "", **context: Any) -> bool:
    return parse_condition(text).holds(outcome, preferred, context)


def test_equals_on_outcome() -> None:
    assert holds("outcome=success")
    assert not holds("outcome=success", outcome="fail")


def test_not_equals() -> None:
    assert holds("outcome!=success", outcome="fail")
    assert not holds("outcome!=success")


def test_and_needs_every_clause() -> None:
    ctx = {"tests_passed": "true"}
    assert holds("outcome=success && context.tests_passed=true", **ctx)
    assert not holds("outcome=success && context.tests_passed=true", outcome="fail", **ctx)
    assert not holds("outcome=success && context.tests_passed=true")


def test_preferred_label() -> None:
    assert holds("preferred_label=Fix", preferred="Fix")
    assert not holds("preferred_label=Fix", preferred="fix")  # exact and case-sensitive


def test_context_keys_resolve_with_or_without_the_prefix() -> None:
    assert holds("context.loop_state!=exhausted", **{"loop_state": "running"})
    assert holds("context.human.gate.selected=A", **{"human.gate.selected": "A"})
    assert holds("context.x=1", **{"context.x": "1", "x": "2"})  # the full name first


def test_a_missing_context_key_is_the_empty_string() -> None:
    assert not holds("context.missing=yes")
    assert holds("context.missing!=yes")
    assert holds('context.missing=""')


def test_values_compare_as_their_text() -> None:
    assert holds("context.flag=true", flag=True)
    assert holds("context.n=3", n=3)
    assert not holds("context.n=03", n=3)
    assert holds("context.none=''".replace("''", '""'), none=None)


def test_quoted_values_with_spaces_escapes_and_operators_inside() -> None:
    assert holds('context.msg="all good && fine"', msg="all good && fine")
    assert holds('context.msg="a=b != c"', msg="a=b != c")
    assert holds(r'context.msg="say \"hi\""', msg='say "hi"')


def test_whitespace_around_tokens_is_ignored() -> None:
    assert holds("  outcome =  success   &&context.a = b ", a="b")


def test_an_empty_condition_always_holds() -> None:
    assert parse_condition("").clauses == ()
    assert holds("   ", outcome="fail")


def test_bare_values_of_the_grammar() -> None:
    cond = parse_condition("context.a=-1 && context.b=v1.2:x-y && context.c=false")
    assert [c.value for c in cond.clauses] == ["-1", "v1.2:x-y", "false"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("outcome", "needs '=' or '!='"),
        ("outcome=", "needs a value after the operator"),
        ("outcome==success", "write '=' for equals"),
        ("Outcome=success", "unknown key 'Outcome'"),
        ("context=x", "unknown key 'context'"),
        ("context.=x", "unknown key 'context.'"),
        ("last_stage=x", "unknown key 'last_stage'"),
        ("outcome=SUCCESS", "outcome 'SUCCESS' is never set"),
        ("a=b || c=d", "'||' is not part of the language"),
        ("outcome=success && ", "empty clause"),
        ("context.x=a b", "put quotes around"),
        ('context.x="open', "never closed"),
        ('context.x="a"b"', "stray quote"),
        ("context.x=a>b", "put quotes around"),
    ],
)
def test_errors_say_what_to_write(text: str, says: str) -> None:
    with pytest.raises(ConditionError, match=None) as err:
        parse_condition(text)
    assert says in str(err.value)
    assert "\n" not in str(err.value)
