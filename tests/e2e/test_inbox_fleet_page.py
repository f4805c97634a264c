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
from selenium.webdriver.support.ui import Select

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
    d = Daemon(
        tmp_path,
        [root],
        http={"listen": "127.0.0.1:0"},
        follow_up_limits={"min_interval_seconds": 1},  # reminders a second apart, for the test
    ).start()
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
        # The unselected one was escalated, then reminded (docs/inbox.md), live on its card;
        # no channel is configured, so the card says nobody was told.
        until(
            browser,
            "the reminder and the escalation on the card",
            lambda b: (
                "A reminder came due, last" in (late := _card(b, fleet[2]).text)
                and "Escalated to carol" in late
            ),
        )
        late = _card(browser, fleet[2]).text
        assert "Reminded" not in late and late.count("nobody was told: no channel") == 2, late
        assert "SLA: an answer is expected by " in late and "(nothing ends then)" in late
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


def _shown(driver: WebDriver) -> set[str]:
    """The prompts of the cards shown (read at once: a refresh replaces cards)."""
    script = "return [...document.querySelectorAll('.item .prompt')].map((p) => p.textContent)"
    return set(driver.execute_script(script))


def test_the_page_filters_by_age_and_deadline_and_selects_every_alike_question(
    tmp_path: Path,
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    """Age and deadline filters (the API's older_than= and due_within=); "select all alike"
    (same kind, options and prompt) answers them in one go; a card has one "due" (the
    deadline, saying what happens then in plain words), its SLA named as such, and after an
    escalation it says who may answer now."""
    from datetime import timedelta

    from deltad.protocol import utcnow

    root = tmp_path / "root"
    rotate = [root / f"rotate-{i}" for i in range(4)]
    for ws in rotate:  # alike: one kind, one prompt
        paused_workspace(ws, "Rotate the log files?", input_type="yes_no")
    paused_workspace(root / "other", "Delete the cache?", input_type="yes_no")  # not alike
    hour_ago = utcnow() - timedelta(hours=2)
    paused_workspace(root / "old", "Rename the bucket?", timestamp=hour_ago)
    soon = utcnow() + timedelta(minutes=5)
    follow = {"escalate_after_seconds": 1, "escalate_to": ["bob"], "sla_seconds": 3600}
    paused_workspace(
        root / "due",
        "Approve the cost report?",
        input_type="yes_no",
        respondents=["alice"],
        expires_at=soon,
        follow_up=follow,
    )
    d = Daemon(
        tmp_path,
        [root],
        http={"listen": "127.0.0.1:0"},
        follow_up_limits={"min_interval_seconds": 1},  # reminders a second apart, for the test
    ).start()
    try:
        url = http_url(d)
        browser.set_window_size(1280, 900)
        browser.get(url)
        log_in(browser, make_token(d.state_dir, "alice"))
        until(browser, "seven cards", lambda b: len(b.find_elements(By.CSS_SELECTOR, ".item")) == 7)

        # One "due" on the card, the deadline's, saying what happens then; the SLA by name;
        # after the escalation, who may answer now.
        due = root / "due"
        card = _card(browser, due)
        until(
            browser, "the escalation", lambda b: "Escalated to bob" in _card(b, root / "due").text
        )
        text = _card(browser, due).text
        assert text.count("due in") == 1 and "Due (SLA)" not in text, text
        assert "then the agent is told that nobody answered" in text and "TIMEOUT" not in text
        assert "SLA: an answer is expected by" in text
        assert card.find_element(By.CSS_SELECTOR, ".respondents").text == (
            "For alice, and bob since the escalation"
        )
        shot(browser, "card-followup")

        # The filters: waiting over 1 h; a deadline within 10 min; then neither.
        Select(browser.find_element(By.ID, "f-age")).select_by_value("1h")
        until(browser, "only the old one", lambda b: _shown(b) == {"Rename the bucket?"})
        Select(browser.find_element(By.ID, "f-age")).select_by_value("")
        Select(browser.find_element(By.ID, "f-due")).select_by_value("10m")
        until(browser, "only the one due", lambda b: _shown(b) == {"Approve the cost report?"})
        assert serious_violations(browser) == [], "filtered"
        Select(browser.find_element(By.ID, "f-due")).select_by_value("")
        until(browser, "all seven", lambda b: len(b.find_elements(By.CSS_SELECTOR, ".item")) == 7)

        # Select one "Rotate" question, then all alike: the three others, not "Delete".
        _card(browser, rotate[0]).find_element(By.CSS_SELECTOR, "input.pick").click()
        alike = browser.find_element(By.ID, "bulk-alike")
        browser.set_window_size(375, 812)
        assert serious_violations(browser) == [], "one selected, at phone width"
        browser.execute_script("window.scrollTo(0, 0)")
        shot(browser, "bulk-one-375")
        browser.set_window_size(1280, 900)
        assert alike.is_displayed() and "all 3 more alike" in alike.text, alike.text
        alike.click()
        assert "4 selected" in browser.find_element(By.ID, "bulk-count").text
        assert not alike.is_displayed()
        other = _card(browser, root / "other").find_element(By.CSS_SELECTOR, "input.pick")
        assert not other.is_selected()
        assert serious_violations(browser) == [], "selected alike"
        shot(browser, "bulk-alike")
        _card(browser, rotate[2]).find_element(By.CSS_SELECTOR, 'button[data-key="y"]').click()
        until(
            browser,
            "the summary of the answer to all four",
            lambda b: b.find_element(By.ID, "bulk-count").text == "4 answered, 0 not.",
        )
        for ws in rotate:
            [resumed] = d.wait_resumed(ws)
            assert '"answer": "yes"' in resumed["answer"]
        assert d.resumed(root / "other") == []
    finally:
        d.stop()
        d.kill_children()
