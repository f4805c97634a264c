"""Age and attention, in a real headless Chromium against a real `deltad serve`: the page marks
the question about to time out and counts it in its heading, its sort control orders the list
(newest, waiting longest, due soonest) through the API's `sort=`, and stays axe-core clean;
the API's `due_within=`/`older_than=` over HTTP; the "Mine only" toggle lists only the
questions that name the one logged in (by name or group), by keyboard, axe-core clean."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from deltad.protocol import utcnow
from deltad.testing.stub import paused_workspace
from tests.support.daemon import DELTAD, Daemon, wait_for
from tests.support.inbox import client, http_url, make_token

from .test_inbox_browser import browser  # noqa: F401 - the fixture is used
from .test_inbox_page import free_port, log_in, no_horizontal_scroll, serious_violations, until


def prompts(driver: WebDriver) -> list[str]:
    # Read in one script: a card the list takes away between two WebDriver calls is stale.
    script = "return [...document.querySelectorAll('.item .prompt')].map((p) => p.innerText)"
    return [str(t).strip() for t in driver.execute_script(script)]


def test_the_page_shows_what_is_about_to_time_out_and_sorts_by_age_and_deadline(
    tmp_path: Path,
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    now = utcnow()
    # Asked in this order (oldest first); due: never, in 2 h, in 5 min.
    paused_workspace(root / "a", "No deadline?")
    paused_workspace(root / "b", "Due later?", expires_at=now + timedelta(hours=2))
    paused_workspace(root / "c", "Due soon?", expires_at=now + timedelta(minutes=5))
    d = Daemon(tmp_path, [root], http={"listen": f"127.0.0.1:{free_port()}"}).start()
    try:
        token = make_token(d.state_dir, "alice")
        with client(http_url(d), token) as http:
            listed = wait_for(
                lambda: len(http.get("/v1/requests").json()["requests"]) == 3, "three questions"
            )
            assert listed

            def listing(**params: str) -> list[str]:
                r = http.get("/v1/requests", params=params)
                assert r.status_code == 200, r.text
                return [q["prompt"] for q in r.json()["requests"]]

            assert listing(sort="deadline") == ["Due soon?", "Due later?", "No deadline?"]
            assert listing(sort="oldest") == ["No deadline?", "Due later?", "Due soon?"]
            assert listing(due_within="10m") == ["Due soon?"]
            assert listing(due_within="3h", sort="deadline") == ["Due soon?", "Due later?"]
            assert listing(older_than="1h") == []
            r = http.get("/v1/requests", params={"due_within": "soon"})
            assert r.status_code == 422 and "due_within: a duration" in r.text, r.text
            r = http.get("/v1/requests", params={"sort": "age"})
            assert r.status_code == 422, r.text
            page = http.get("/v1/requests", params={"sort": "deadline", "limit": 1}).json()
            r = http.get("/v1/requests", params={"cursor": page["next"]})  # another sort's
            assert r.status_code == 422 and "the sort it came from" in r.text, r.text
            nxt = http.get(
                "/v1/requests", params={"sort": "deadline", "limit": 1, "cursor": page["next"]}
            )
            assert [q["prompt"] for q in nxt.json()["requests"]] == ["Due later?"]

        browser.set_window_size(1280, 900)
        browser.get(http_url(d))
        log_in(browser, token)
        until(browser, "three cards", lambda b: len(prompts(b)) == 3)
        assert prompts(browser) == ["Due soon?", "Due later?", "No deadline?"]  # newest first
        soon = browser.find_element(By.CSS_SELECTOR, ".item:has(.due-soon) .prompt")
        assert soon.text == "Due soon?"
        marks = {
            e.find_element(By.CSS_SELECTOR, ".prompt").text: e.find_element(By.CSS_SELECTOR, ".due")
            for e in browser.find_elements(By.CSS_SELECTOR, ".item:has(.due)")
        }
        assert set(marks) == {"Due soon?", "Due later?"}
        assert marks["Due soon?"].text in ("due in 5 min", "due in 4 min")
        assert "due-soon" in str(marks["Due soon?"].get_attribute("class"))
        assert marks["Due later?"].text == "due in 2 h"
        assert "due-soon" not in str(marks["Due later?"].get_attribute("class"))
        count = browser.find_element(By.ID, "due-count")
        assert count.is_displayed() and count.text == "· 1 due within 10 min"
        assert serious_violations(browser) == [], "due marks, desktop"

        sort = Select(browser.find_element(By.ID, "f-sort"))
        sort.select_by_value("oldest")
        want = ["No deadline?", "Due later?", "Due soon?"]
        until(browser, "waiting longest first", lambda b: prompts(b) == want)
        sort.select_by_value("deadline")
        want = ["Due soon?", "Due later?", "No deadline?"]
        until(browser, "due soonest first", lambda b: prompts(b) == want)
        browser.set_window_size(375, 812)
        until(browser, "the phone layout", no_horizontal_scroll)
        assert serious_violations(browser) == [], "due marks and the sort control, 375 px"
    finally:
        d.stop()
        d.kill_children()


def test_the_mine_toggle_shows_only_the_questions_that_name_me(
    tmp_path: Path,
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    paused_workspace(root / "a", "For alice?", respondents=["alice"])
    paused_workspace(root / "b", "For ops?", respondents=["group:ops"])
    paused_workspace(root / "c", "For bob?", respondents=["bob"])
    paused_workspace(root / "d", "For anyone?")
    d = Daemon(tmp_path, [root], http={"listen": f"127.0.0.1:{free_port()}"}).start()
    try:
        argv = [DELTAD, "token", "add", "alice", "--group", "ops", "--state-dir", str(d.state_dir)]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
        token = out.stdout.strip().splitlines()[-1]
        browser.set_window_size(1280, 900)
        browser.get(http_url(d))
        log_in(browser, token)
        until(browser, "four cards", lambda b: len(prompts(b)) == 4)
        box = browser.find_element(By.ID, "f-mine")
        assert not box.is_selected()
        box.send_keys(Keys.SPACE)  # by keyboard: it is a labelled checkbox
        want = ["For ops?", "For alice?"]  # newest first
        until(browser, "only mine", lambda b: prompts(b) == want)
        assert box.is_selected()
        assert serious_violations(browser) == [], "the mine toggle, desktop"
        Select(browser.find_element(By.ID, "f-sort")).select_by_value("oldest")
        until(browser, "mine, oldest first", lambda b: prompts(b) == want[::-1])
        browser.set_window_size(375, 812)
        until(browser, "the phone layout", no_horizontal_scroll)
        assert serious_violations(browser) == [], "the mine toggle, 375 px"
        box.send_keys(Keys.SPACE)
        until(browser, "all four again", lambda b: len(prompts(b)) == 4)
    finally:
        d.stop()
        d.kill_children()
