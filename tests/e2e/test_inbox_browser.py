"""The web inbox in a real headless Chromium (Debian's chromium and chromium-driver, driven by
Selenium): log in, see a question appear live, answer a choice by its key, answer an approval
with an edit, see the run complete. `.ci/run` installs the browser; here it is required, not
skipped, when CI=true."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltad.testing import FakeLLM
from tests.support.daemon import Daemon, metadata_status
from tests.support.inbox import http_url, make_token

from ..conftest import llm_env, write_agent

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
if not (CHROMIUM and DRIVER) and os.environ.get("CI") != "true":
    pytest.skip("needs Debian's chromium and chromium-driver", allow_module_level=True)

from selenium import webdriver  # noqa: E402 - only once the browser is known to be there
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

DELTA = str(Path(sys.executable).parent / "delta")
GATED = """
  - name: deploy
    description: Deploy to an environment.
    parameters:
      - name: env
        type: string
    exec: "echo deploying ${env}"
"""
POLICY = "approval:\n  require: [deploy]\n"
WAIT = 30


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(DRIVER or "/usr/bin/chromedriver"))
    try:
        yield driver
    finally:
        driver.quit()


def _until(driver: WebDriver, what: str, css: str) -> None:
    WebDriverWait(driver, WAIT).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, css), f"waiting for {what} ({css})"
    )


def test_the_web_inbox_answers_a_choice_by_key_and_an_approval_with_an_edit(
    tmp_path: Path, fake: FakeLLM, browser: WebDriver
) -> None:
    fake.call(
        "ask_human",
        {"prompt": "Which colour?", "input_type": "choice", "options": ["Red", "Blue"]},
        id="ask1",
    )
    fake.call("deploy", {"env": "production"}, id="dep1").reply("deployed")
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(
        tmp_path,
        [root],
        resume_command=["delta", "run", "--work-dir", "{workspace}"],
        http={"listen": "127.0.0.1:0"},
    ).start(env=llm_env(fake))
    try:
        url = http_url(d)
        token = make_token(d.state_dir, "alice")
        browser.get(url)
        _until(browser, "the login form", "#token")
        browser.find_element(By.ID, "token").send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
        _until(browser, "the live stream", "#live")
        WebDriverWait(browser, WAIT).until(
            lambda b: b.find_element(By.ID, "live").text == "live", "the event stream"
        )

        ws = root / "ws1"
        ws.mkdir()
        agent = write_agent(tmp_path, GATED, POLICY)
        paused = subprocess.run(
            [DELTA, "run", "--agent", str(agent), "--task", "ship", "--work-dir", str(ws)],
            env=llm_env(fake),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert paused.returncode == 101, paused.stderr
        _until(browser, "the question, live", '.item[data-input-type="choice"]')
        item = browser.find_element(By.CSS_SELECTOR, ".item")
        assert "Which colour?" in item.text and "ship" in item.text
        browser.find_element(By.TAG_NAME, "body").send_keys("b")  # the key answers it

        _until(browser, "the approval, live", '.item[data-input-type="approval"]')
        item = browser.find_element(By.CSS_SELECTOR, '.item[data-input-type="approval"]')
        assert "deploy" in item.text and "production" in item.text
        item.find_element(By.CSS_SELECTOR, "button.edit").click()
        # the edit is a form from the tool's schema; its JSON view takes what a form cannot
        item.find_element(By.CSS_SELECTOR, "button.json-toggle").click()
        editor = item.find_element(By.CSS_SELECTOR, "textarea.raw")
        editor.clear()
        editor.send_keys('{"env": 5}')  # wrong type: the page refuses before sending
        item.find_element(By.CSS_SELECTOR, "button.send-edit").click()
        WebDriverWait(browser, WAIT).until(
            lambda b: "env must be a string" in item.text, "the schema check"
        )
        editor.clear()
        editor.send_keys('{"env": "staging"}')
        item.find_element(By.CSS_SELECTOR, "button.send-edit").click()
        _until(browser, "the run completing", '#activity li[data-to="COMPLETED"]')
        assert metadata_status(ws) == "COMPLETED"
        # The history comes from the journals: a reload (or a restart) keeps it, with who.
        browser.refresh()
        _until(browser, "the history after a reload", "#activity li.answered")
        WebDriverWait(browser, WAIT).until(
            lambda b: (
                len(b.find_elements(By.CSS_SELECTOR, "#activity li.answered")) == 2
                and b.find_elements(By.CSS_SELECTOR, '#activity li.ended[data-to="COMPLETED"]')
            ),
            "both answers and the run's end in the history",
        )
        history = browser.find_element(By.ID, "activity").text
        assert "alice answered" in history and "edit" in history
        assert browser.find_elements(By.CSS_SELECTOR, "#activity time")
        assert "deploying staging" in fake.tool_results()["dep1"]
        assert "Blue" in json.dumps(fake.requests[1]["messages"])
        # The cookie is scoped to the API's directory (no Path: a proxy prefix is kept).
        every = browser.execute_cdp_cmd("Network.getAllCookies", {})["cookies"]
        cookies = {c["name"]: c for c in every}
        assert cookies["deltad_session"]["httpOnly"] is True
        assert cookies["deltad_session"]["sameSite"] == "Strict"
        assert cookies["deltad_session"]["path"] == "/v1"
        storage = browser.execute_script(
            "return JSON.stringify(localStorage) + JSON.stringify(sessionStorage)"
        )
        assert token not in storage and token not in browser.page_source
    finally:
        d.stop()
        d.kill_children()


def test_the_web_inbox_shows_a_questions_context_and_who_may_answer(
    tmp_path: Path, fake: FakeLLM, browser: WebDriver
) -> None:
    fake.reply(
        "Checked the diff: <b>2 files</b>.",
        {"id": "e1", "type": "function", "function": {"name": "echo", "arguments": '{"t": "ok"}'}},
    )
    fake.call("ask_human", {"prompt": "Merge?", "respondents": ["alice"]}, id="ask1")
    root = tmp_path / "root"
    root.mkdir()
    d = Daemon(
        tmp_path,
        [root],
        resume_command=["delta", "run", "--work-dir", "{workspace}"],
        http={"listen": "127.0.0.1:0"},
    ).start(env=llm_env(fake))
    try:
        url = http_url(d)
        token = make_token(d.state_dir, "alice")
        ws = root / "ws1"
        ws.mkdir()
        agent = write_agent(tmp_path, '[{name: echo, exec: "echo said ${t}"}]')
        paused = subprocess.run(
            [DELTA, "run", "--agent", str(agent), "--task", "merge it", "--work-dir", str(ws)],
            env=llm_env(fake),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert paused.returncode == 101, paused.stderr
        browser.get(url)
        _until(browser, "the login form", "#token")
        browser.find_element(By.ID, "token").send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "#login-form button").click()
        _until(browser, "the question", ".item details.context")
        item = browser.find_element(By.CSS_SELECTOR, ".item")
        assert "For alice" in item.find_element(By.CSS_SELECTOR, ".respondents").text
        context = item.find_element(By.CSS_SELECTOR, "details.context")
        assert context.get_attribute("open") is None  # folded to one line until opened
        summary = (By.CSS_SELECTOR, ".item details.context > summary")
        WebDriverWait(browser, WAIT).until(EC.element_to_be_clickable(summary)).click()
        WebDriverWait(browser, WAIT).until(
            lambda b: "said ok" in context.text, "the tool call's result"
        )
        assert "Checked the diff: <b>2 files</b>." in context.text  # shown as text, not HTML
        assert not context.find_elements(By.TAG_NAME, "b")
        assert 'echo {"t":"ok"} → SUCCESS' in context.text
    finally:
        d.stop()
        d.kill_children()
