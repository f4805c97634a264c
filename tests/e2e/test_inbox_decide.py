"""The page a person decides from, in a real headless Chromium against a real `deltad serve`
(desktop and 375 px wide, axe-core clean): each card shows what `delta status` shows (a
choice's default, a number's bounds, a date's window, the deadline in UTC and what happens at
it, a secret's handling); its context is folded to one line until opened, tool output keeps its
newlines, no empty rows; an approval's edit is a form made from the tool's schema; the history
says what really happened (an edit's changes, a timeout's default); a run view shows the run's
messages, tool calls with their output and its questions."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from deltad.testing import FakeLLM
from deltad.testing.fakellm import tool_call
from deltad.testing.stub import paused_workspace
from tests.support.daemon import Daemon, metadata_status, wait_for
from tests.support.inbox import http_url, make_token

from ..conftest import llm_env, write_agent
from .test_inbox_api import REAL_CLIENT, _delta
from .test_inbox_browser import WAIT, _until, browser  # noqa: F401 - the fixture is used
from .test_inbox_page import free_port, log_in, no_horizontal_scroll, serious_violations, until

DEPLOY_SCHEMA = {
    "type": "object",
    "properties": {
        "env": {"type": "string", "enum": ["staging", "production"]},
        "replicas": {"type": "integer", "description": "How many."},
        "dry_run": {"type": "boolean"},
    },
    "required": ["env"],
}


DEPLOY_TOOL = """
  - name: deploy
    description: Deploy.
    exec: "echo deploying ${env} x${replicas}"
    parameters:
      - {name: env, description: where}
      - {name: replicas, type: integer, description: How many.}
"""


def card(driver: WebDriver, kind: str) -> str:
    css = f'.item[data-input-type="{kind}"]'
    _until(driver, f"the {kind} question", css)
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def test_each_card_shows_what_delta_status_shows_and_folds_its_context(
    tmp_path: Path,
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    due = datetime(2031, 5, 4, 12, 30, tzinfo=UTC)
    paused_workspace(root / "a", "Which channel?", input_type="choice", default="beta",
                     options=[{"key": "s", "label": "stable"}, {"key": "b", "label": "beta"}],
                     expires_at=due)  # fmt: skip
    paused_workspace(root / "b", "How many replicas?", input_type="number", minimum=1,
                     maximum=20)  # fmt: skip
    paused_workspace(root / "c", "Release day?", input_type="date", earliest="2026-12-01",
                     latest="2027-01-31")  # fmt: skip
    paused_workspace(root / "d", "The deploy token", input_type="password")
    paused_workspace(
        root / "e",
        "Approve these calls?",
        input_type="approval",
        expires_at=due,
        calls=[{"action_id": "act_1", "tool_name": "deploy", "arguments": {"env": "staging"}}],
        context={
            "task": "roll out",
            "last_message": "The dry run passed.\nNothing conflicts.\nA third line.",
            "tool_calls": [
                {
                    "action_id": "t1",
                    "tool_name": "list_files",
                    "arguments": {"dir": "."},
                    "status": "SUCCESS",
                    "result": "total 12\nREADME.md\nsrc",
                }
            ],
            "tool_calls_omitted": 0,
        },
    )
    d = Daemon(tmp_path, [root], http={"listen": f"127.0.0.1:{free_port()}"}).start()
    try:
        browser.set_window_size(1280, 900)
        browser.get(http_url(d))
        log_in(browser, make_token(d.state_dir, "alice"))
        choice = card(browser, "choice")
        assert "default: beta" in choice and "answer by 2031-05-04 12:30:00 UTC" in choice
        assert "then the default, 'beta'" in choice
        marked = browser.find_element(By.CSS_SELECTOR, '.item[data-input-type="choice"] .default')
        assert "beta" in marked.text and "(default)" in marked.text
        assert "a number from 1 to 20" in card(browser, "number")
        assert "a date, YYYY-MM-DD from 2026-12-01 to 2027-01-31" in card(browser, "date")
        assert "secret: kept in a 0600 file" in card(browser, "password")
        approval = card(browser, "approval")
        assert "answer by 2031-05-04 12:30:00 UTC, then rejected" in approval
        # the context: one line until opened, the task not twice, no empty rows
        box = '.item[data-input-type="approval"] details.context'
        details = browser.find_element(By.CSS_SELECTOR, box)
        assert details.get_attribute("open") is None
        summary = details.find_element(By.TAG_NAME, "summary").text
        assert "The dry run passed. · Nothing conflicts." in summary and "1 tool call" in summary
        assert "A third line" not in summary
        details.find_element(By.TAG_NAME, "summary").click()
        until(browser, "the context opened", lambda b: details.get_attribute("open") is not None)
        output = details.find_element(By.CSS_SELECTOR, "pre.output").get_attribute("innerText")
        assert output == "total 12\nREADME.md\nsrc"  # its newlines kept
        headings = [h.text.lower() for h in details.find_elements(By.TAG_NAME, "h4")]
        assert headings == ["last message", "tool calls"], headings
        assert serious_violations(browser) == [], "cards with their facts, desktop"
        # the answer comes before the context: on a phone it is reached without scrolling past
        browser.set_window_size(375, 812)
        until(browser, "the phone layout", no_horizontal_scroll)
        order = browser.execute_script(
            "const c = document.querySelector(arguments[0]);"
            "return [c.querySelector('.actions').getBoundingClientRect().top,"
            " c.querySelector('details.context').getBoundingClientRect().top];",
            '.item[data-input-type="approval"]',
        )
        assert order[0] < order[1], order
        assert serious_violations(browser) == [], "cards with their facts, 375 px"
    finally:
        d.stop()
        d.kill_children()


def test_an_edit_form_from_the_schema_the_history_and_the_run_view(
    tmp_path: Path,
    fake: FakeLLM,
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    root = tmp_path / "root"
    ws, late = root / "infra", root / "late"
    ws.mkdir(parents=True)
    late.mkdir()
    tools = DEPLOY_TOOL
    agent = write_agent(tmp_path, tools, "approval:\n  require: [deploy]\n")
    d = Daemon(
        tmp_path, [root], resume_command=REAL_CLIENT, http={"listen": f"127.0.0.1:{free_port()}"}
    ).start(env=llm_env(fake))
    try:
        fake.reply(None, tool_call("deploy", {"env": "staging", "replicas": 3}, id="d1"))
        fake.reply("deployed")
        out = _delta(fake, "run", "--agent", str(agent), "--task", "ship", "--work-dir", str(ws))
        assert out.returncode == 101, out.stderr
        browser.set_window_size(1280, 900)
        browser.get(http_url(d))
        log_in(browser, make_token(d.state_dir, "ada"))
        _until(browser, "the approval", '.item[data-input-type="approval"]')
        item = browser.find_element(By.CSS_SELECTOR, '.item[data-input-type="approval"]')
        item.find_element(By.CSS_SELECTOR, 'button[data-key="e"]').click()
        _until(browser, "the edit form", 'fieldset.call-editor input[data-arg="replicas"]')
        replicas = item.find_element(By.CSS_SELECTOR, 'input[data-arg="replicas"]')
        assert replicas.get_attribute("type") == "number"
        assert (
            item.find_element(By.CSS_SELECTOR, 'input[data-arg="env"]').get_attribute("type")
            == "text"
        )
        assert serious_violations(browser) == [], "the edit form"
        replicas.clear()
        replicas.send_keys("5")
        item.find_element(By.CSS_SELECTOR, "button.send-edit").click()
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed", timeout=WAIT)
        css = "#activity li.answered .diff"
        _until(browser, "the edit in the history", css)
        # read afresh each time: the history is listed again as the run's events come in
        entry = "#activity li.answered"
        WebDriverWait(browser, WAIT, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda b: (
                "ada approved with edits deploy" in b.find_element(By.CSS_SELECTOR, entry).text
                and "replicas: 3 → 5" in b.find_element(By.CSS_SELECTOR, f"{entry} .diff").text
            ),
            "the edit's line and its changes",
        )
        # the run view: the run's messages, its tool call with the output, its question (the
        # history may be listed again meanwhile: the button is found afresh when it is clicked)
        link = (By.CSS_SELECTOR, "#activity li.answered button.run-link")
        WebDriverWait(browser, WAIT, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda b: b.find_element(*link).click() or True, "the run view's button clicked"
        )
        _until(browser, "the run view", "#run-body .transcript")
        view = browser.find_element(By.ID, "run-body")
        assert "COMPLETED" in view.text and "tool call: deploy" in view.text
        assert "asked (approval)" in view.text and "deploying staging x5" in view.text
        assert serious_violations(browser) == [], "the run view"
        browser.find_element(By.CSS_SELECTOR, "#run-view form button").click()

        # a timeout's default is the deadline's answer, not a person's
        ask = {"prompt": "Which region?", "input_type": "choice", "options": ["eu", "us"],
               "default": "us", "timeout_seconds": 1}  # fmt: skip
        fake.call("ask_human", ask, id="ask1")
        fake.reply("done in us")
        out = _delta(fake, "run", "--agent", str(agent), "--task", "pick", "--work-dir", str(late))
        assert out.returncode == 101, out.stderr
        wait_for(lambda: metadata_status(late) == "COMPLETED", "the timed-out run went on",
                 timeout=WAIT + 5)  # fmt: skip
        _until(browser, "the timeout in the history", "#activity li.answered.timeout")
        timed = browser.find_element(By.CSS_SELECTOR, "#activity li.answered.timeout").text
        assert "timed out → default “us”" in timed and "answered" not in timed.split("\n")[0]
    finally:
        d.stop()
        d.kill_children()
