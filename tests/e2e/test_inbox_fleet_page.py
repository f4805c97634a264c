"""The page at fleet scale, in a real headless Chromium against a real `deltad serve` (axe-core
clean): questions of one kind and options are selected on their cards and answered at once
(each resumed once, the others untouched; another kind cannot be selected with them), and a
question handed to another token shows the hand-over on its card, for everyone; a question's
reminders, escalation and SLA show on its card as the daemon's timers act; an approval
needing two shows the first vote ("1 of 2 approvals: alice") and stays until the second."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from deltad.protocol.models import GatedCall, Option
from deltad.testing.stub import paused_workspace
from tests.support.daemon import Daemon
from tests.support.inbox import client, http_url, make_token

from .test_inbox_browser import browser  # noqa: F401 - the fixture is used
from .test_inbox_page import log_in, serious_violations, shot, until

OPTIONS = [Option(key="a", label="Apple"), Option(key="p", label="Pear")]


def _card(driver: WebDriver, ws: Path) -> Any:
    return driver.find_element(By.CSS_SELECTOR, f'.item[data-key^="{_key(ws)}|"]')


def _key(ws: Path) -> str:
    return quote(str(ws), safe="-_.!~*'()")  # encodeURIComponent's


def test_the_page_answers_several_questions_at_once_and_shows_a_hand_over(
    tmp_path: Path,
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    root = tmp_path / "root"
    fleet = [root / f"fruit-{i}" for i in range(3)]
    for ws in fleet:
        paused_workspace(ws, f"Which fruit for {ws.name}?", input_type="choice", options=OPTIONS)
    # The last is reminded and escalated by the daemon's timers as soon as it is found.
    follow = {"remind_after_seconds": 1, "max_reminders": 1, "sla_seconds": 3600}
    follow |= {"escalate_after_seconds": 1, "escalate_to": ["carol"]}
    paused_workspace(
        fleet[2], "Which fruit, late?", input_type="choice", options=OPTIONS, follow_up=follow
    )
    merge = root / "merge"
    paused_workspace(merge, "Merge the branch?", input_type="yes_no", respondents=["alice"])
    pair = root / "pair"  # four eyes
    call = GatedCall(action_id="act_1", tool_name="deploy", arguments={}, resolved_command="x")
    paused_workspace(pair, "Deploy?", input_type="approval", calls=[call], approvals_required=2)
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0"}).start()
    try:
        url = http_url(d)
        alice = make_token(d.state_dir, "alice")
        bob = make_token(d.state_dir, "bob")
        browser.set_window_size(1280, 900)
        browser.get(url)
        log_in(browser, alice)
        until(browser, "five cards", lambda b: len(b.find_elements(By.CSS_SELECTOR, ".item")) == 5)

        # Select two of the three fruit questions: the other kind cannot join them.
        for ws in fleet[:2]:
            _card(browser, ws).find_element(By.CSS_SELECTOR, "input.pick").click()
        other = _card(browser, merge).find_element(By.CSS_SELECTOR, "input.pick")
        assert other.get_attribute("disabled") is not None
        assert "2 selected" in browser.find_element(By.ID, "bulk-count").text
        _card(browser, fleet[0]).find_element(By.CSS_SELECTOR, 'button[data-key="p"]').click()
        until(
            browser,
            "the summary of the answer to both",
            lambda b: b.find_element(By.ID, "bulk-count").text == "2 answered, 0 not.",
        )
        for ws in fleet[:2]:
            [resumed] = d.wait_resumed(ws)
            assert '"answer": "p"' in resumed["answer"]
        until(
            browser,
            "the answered cards gone",
            lambda b: len(b.find_elements(By.CSS_SELECTOR, ".item")) == 3,
        )
        assert d.resumed(fleet[2]) == []  # not selected: still waiting
        assert other.get_attribute("disabled") is None  # nothing selected now

        # Hand the merge question to bob, with a note: the card says so.
        card = _card(browser, merge)
        card.find_element(By.CSS_SELECTOR, ".handover summary").click()
        card.find_element(By.CSS_SELECTOR, 'input[name="to"]').send_keys("bob")
        card.find_element(By.CSS_SELECTOR, 'input[name="note"]').send_keys("on leave")
        card.find_element(By.CSS_SELECTOR, ".handover button").click()
        until(
            browser,
            "the hand-over on the card",
            lambda b: "Handed by alice to bob — “on leave”" in _card(b, merge).text,
        )
        # Four eyes: alice's approval is one vote of two; the card stays and says so.
        card = _card(browser, pair)
        assert "0 of 2 approvals" in card.text
        card.find_element(By.CSS_SELECTOR, 'button[data-key="a"]').click()
        until(
            browser,
            "the first vote on the card",
            lambda b: "1 of 2 approvals: alice" in _card(b, pair).text,
        )
        assert d.resumed(pair) == []
        # The unselected one was escalated, then reminded (docs/inbox.md), live on its card.
        until(
            browser,
            "the reminder and the escalation on the card",
            lambda b: (
                "Reminded once, last" in (late := _card(b, fleet[2]).text)
                and "Escalated to carol" in late
            ),
        )
        assert "Due (SLA) " in _card(browser, fleet[2]).text
        assert serious_violations(browser) == []
        shot(browser, "inbox-fleet")
        # Bob sees it too (a fresh page), and may now answer it.
        with client(url, bob) as b:
            [q] = [
                q for q in b.get("/v1/requests").json()["requests"] if q["workspace"] == str(merge)
            ]
            assert [h["to"] for h in q["delegations"]] == ["bob"]
            [p] = [
                q for q in b.get("/v1/requests").json()["requests"] if q["workspace"] == str(pair)
            ]
            r = b.post(
                f"/v1/requests/{p['request_id']}/answer",
                params={"workspace": str(pair)},
                json={"decisions": [{"action_id": "act_1", "decision": "approve"}]},
            )
            assert r.status_code == 202 and r.json()["answered"] is True, r.text
            [resumed] = d.wait_resumed(pair)
            assert '"answered_by": "alice, bob"' in resumed["answer"]
        browser.get(url)
        until(
            browser,
            "the hand-over after a reload",
            lambda b: (
                b.find_elements(By.CSS_SELECTOR, ".handed li")
                and "Handed by alice to bob" in _card(b, merge).text
            ),
        )
    finally:
        d.stop()
        d.kill_children()
