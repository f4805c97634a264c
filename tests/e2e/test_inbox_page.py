"""The web page in a real headless Chromium against a real `deltad serve`: it goes on after a
daemon restart and asks to log in again after a revoke; questions grouped by workspace and run
are answered from the keyboard; a finished run's outcome (final message, duration, who answered
what) is in the history after a reload and a restart; it reads at phone width; it works under a
reverse proxy's path prefix; axe-core finds no serious or critical violation in any state.
Screenshots are written to `$DELTAD_SCREENSHOTS` when set (`docs/img` for the docs)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from deltad.inbox import links
from deltad.protocol import InputType, Mailbox, Workspace
from deltad.testing import FakeLLM
from deltad.testing.stub import paused_workspace
from tests.support.daemon import DELTAD, Daemon, metadata_status, wait_for
from tests.support.inbox import http_url, make_token

from ..conftest import llm_env, write_agent
from .test_inbox_api import REAL_CLIENT, _delta
from .test_inbox_browser import WAIT, _until, browser  # noqa: F401 - the fixture is used

SHOTS = os.environ.get("DELTAD_SCREENSHOTS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(driver: WebDriver, what: str, cond: Callable[[WebDriver], Any]) -> Any:
    try:
        return WebDriverWait(driver, WAIT).until(cond, f"waiting for {what}")
    except TimeoutException:
        text = driver.find_element(By.TAG_NAME, "body").text
        raise AssertionError(f"waiting for {what}; the page says:\n{text}") from None


def log_in(driver: WebDriver, token: str) -> None:
    _until(driver, "the login form", "#token")
    until(driver, "the login form shown", lambda b: b.find_element(By.ID, "token").is_displayed())
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login-form button").click()
    until(driver, "the live stream", lambda b: b.find_element(By.ID, "live").text == "live")


def selected_id(driver: WebDriver) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, ".item.selected").get_attribute("data-key"))


def shot(driver: WebDriver, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        width = driver.get_window_size()["width"]
        driver.set_window_size(width, max(int(height) + 140, 500))
        driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))


# -- axe-core ---------------------------------------------------------------------------------
# axe-core 4.x from the npm registry, pinned in tests/e2e/axe/package-lock.json (`.ci/run`:
# `npm ci --prefix tests/e2e/axe`). Outside CI without it, the 3.1 build that
# axe-selenium-python ships (the dev extra) stands in.
AXE_4 = Path(__file__).parent / "axe" / "node_modules" / "axe-core" / "axe.min.js"


def axe_source() -> str:
    if AXE_4.is_file():
        return AXE_4.read_text()
    assert not os.environ.get("CI"), f"no {AXE_4}: run npm ci --prefix tests/e2e/axe"
    import axe_selenium_python

    return (
        Path(axe_selenium_python.__file__).parent / "node_modules" / "axe-core" / "axe.min.js"
    ).read_text()


def axe_version(driver: WebDriver) -> str:
    driver.execute_script(axe_source())
    return str(driver.execute_script("return axe.version"))


def serious_violations(driver: WebDriver) -> list[str]:
    driver.execute_script(axe_source())
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']})"
        ".then(done, (e) => done({error: String(e)}));"
    )
    assert "error" not in result, result
    return [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:3]}"
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def aside_scrolls(driver: WebDriver) -> bool:
    return bool(
        driver.execute_script(
            "const a = document.querySelector('aside'); return a.scrollHeight > a.clientHeight"
        )
    )


def no_horizontal_scroll(driver: WebDriver) -> bool:
    return bool(
        driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    )


# -- questions ----------------------------------------------------------------------------------
def ask_some(root: Path) -> dict[str, Path]:
    """One of each kind people answer most: a choice, an approval, a free text."""
    ws = {name: root / name for name in ("billing-api", "infra", "docs-site")}
    paused_workspace(
        ws["billing-api"],
        "Which database should the migration target?",
        task="migrate invoices to the new schema",
        input_type="choice",
        options=[{"key": "p", "label": "Postgres 16"}, {"key": "s", "label": "SQLite"}],
    )
    paused_workspace(
        ws["infra"],
        "Approve these calls?",
        task="roll out the new ingress",
        input_type="approval",
        calls=[
            {
                "action_id": "act_1",
                "tool_name": "deploy",
                "arguments": {"env": "production", "replicas": 3},
                "resolved_command": "kubectl apply -f ingress.yaml",
            }
        ],
    )
    paused_workspace(
        ws["docs-site"], "What should the release be called?", task="write the release notes"
    )
    return ws


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Daemon, str, Path]]:
    root = tmp_path / "root"
    root.mkdir()
    # A fixed port: a restarted daemon is at the same address, as for a person's open page.
    d = Daemon(tmp_path, [root], http={"listen": f"127.0.0.1:{free_port()}"}).start()
    try:
        yield d, http_url(d), root
    finally:
        d.stop()
        d.kill_children()


def test_the_page_goes_on_after_a_restart_and_asks_to_log_in_after_a_revoke(
    served: tuple[Daemon, str, Path],
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    d, url, root = served
    make_token(d.state_dir, "alice")
    alice = make_token(d.state_dir, "ada")
    browser.get(url)
    log_in(browser, alice)

    assert d.stop() == 0  # with the page's event stream open
    assert not [
        line
        for line in d.log_path.read_text(errors="replace").splitlines()
        if "Traceback" in line
        or not line.startswith("{")
        or json.loads(line).get("level") in ("error", "critical")
    ]
    until(
        browser,
        "the page to see the daemon gone",
        lambda b: b.find_element(By.ID, "live").text != "live",
    )
    d.start(wait=False)
    d.wait_event("daemon_ready", count=2)
    until(browser, "the stream back", lambda b: b.find_element(By.ID, "live").text == "live")
    paused_workspace(root / "ws1", "Name the release?")
    _until(browser, "the question, live after the restart", '.item[data-input-type="text"]')
    field = browser.find_element(By.CSS_SELECTOR, ".item input.answer")
    field.send_keys("Aurora", Keys.ENTER)  # the session (and its CSRF token) outlived the restart
    [resumed] = d.wait_resumed(root / "ws1")
    assert json.loads(resumed["answer"])["answer"] == "Aurora"
    assert not browser.find_elements(By.CSS_SELECTOR, "#login:not([hidden])")

    subprocess.run(
        [DELTAD, "token", "revoke", "ada", "--state-dir", str(d.state_dir)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    until(browser, "the login prompt", lambda b: b.find_element(By.ID, "login-why").is_displayed())
    assert "log in again" in browser.find_element(By.ID, "login-why").text.lower()
    assert not browser.find_element(By.ID, "inbox").is_displayed()
    log_in(browser, make_token(d.state_dir, "ada2"))
    paused_workspace(root / "ws2", "And the codename?")
    _until(browser, "the next question", '.item[data-input-type="text"]')
    browser.find_element(By.CSS_SELECTOR, ".item input.answer").send_keys("Borealis", Keys.ENTER)
    [resumed] = d.wait_resumed(root / "ws2")
    assert json.loads(resumed["answer"])["answered_by"] == "ada2"


def test_keyboard_phone_width_history_and_no_serious_accessibility_violations(
    served: tuple[Daemon, str, Path],
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    d, url, root = served
    token = make_token(d.state_dir, "alice")
    browser.set_window_size(1280, 900)
    browser.get(url)
    _until(browser, "the login form", "#token")
    assert serious_violations(browser) == [], "the login form"
    assert axe_version(browser).startswith("4.") or not AXE_4.is_file()  # the pinned one is used
    shot(browser, "login")
    log_in(browser, token)
    ws = ask_some(root)
    _until(browser, "three questions", ".item:nth-of-type(1)")
    until(browser, "three questions", lambda b: len(b.find_elements(By.CSS_SELECTOR, ".item")) == 3)
    groups = browser.find_elements(By.CSS_SELECTOR, ".group-title")
    assert len(groups) == 3 and any("billing-api" in g.text for g in groups)
    assert serious_violations(browser) == [], "the list"
    shot(browser, "inbox-desktop")
    browser.set_window_size(1280, 250)  # the history scrolls on its own: a keyboard must reach it
    until(browser, "the history scrolling", aside_scrolls)
    assert serious_violations(browser) == [], "the history scrolling"
    browser.set_window_size(375, 812)  # phone width, with all three waiting
    until(browser, "the phone layout", no_horizontal_scroll)
    assert serious_violations(browser) == [], "phone width"
    shot(browser, "inbox-phone")
    browser.set_window_size(1280, 900)

    order = [i.get_attribute("data-key") for i in browser.find_elements(By.CSS_SELECTOR, ".item")]
    for _ in order:
        browser.switch_to.active_element.send_keys("k")
    assert selected_id(browser) == order[0]  # at the top, k stays
    assert browser.switch_to.active_element.get_attribute("data-key") == order[0]  # focus follows
    browser.switch_to.active_element.send_keys("j")
    assert selected_id(browser) == order[1]
    browser.switch_to.active_element.send_keys(Keys.ARROW_DOWN)
    assert selected_id(browser) == order[2]
    browser.switch_to.active_element.send_keys(Keys.ARROW_UP)
    assert selected_id(browser) == order[1]
    browser.switch_to.active_element.send_keys("?")
    until(browser, "the help", lambda b: b.find_element(By.ID, "help").is_displayed())
    assert serious_violations(browser) == [], "the help"
    shot(browser, "help")
    browser.switch_to.active_element.send_keys(Keys.ESCAPE)
    until(browser, "the help closed", lambda b: not b.find_element(By.ID, "help").is_displayed())

    # Walk to the choice and answer it by its key.
    for _ in range(3):
        item = browser.find_element(By.CSS_SELECTOR, ".item.selected")
        if item.get_attribute("data-input-type") == "choice":
            break
        browser.switch_to.active_element.send_keys("j")
    assert (
        browser.find_element(By.CSS_SELECTOR, ".item.selected").get_attribute("data-input-type")
        == "choice"
    )
    browser.switch_to.active_element.send_keys("p")
    [resumed] = d.wait_resumed(ws["billing-api"])
    assert json.loads(resumed["answer"])["answer"] == "p"
    until(  # the answered one goes; the next is selected and focused, ready for keys
        browser,
        "the next question focused",
        lambda b: "selected" in (b.switch_to.active_element.get_attribute("class") or ""),
    )

    # The approval, with its editor open.
    until(
        browser, "two questions left", lambda b: len(b.find_elements(By.CSS_SELECTOR, ".item")) == 2
    )
    approval = browser.find_element(By.CSS_SELECTOR, '.item[data-input-type="approval"]')
    approval.click()
    approval.find_element(By.CSS_SELECTOR, "button.edit").click()
    _until(browser, "the editor", ".item textarea")
    assert serious_violations(browser) == [], "an approval being edited"
    shot(browser, "approval-edit")

    # The text question: `i` focuses its field, Enter sends.
    text = browser.find_element(By.CSS_SELECTOR, '.item[data-input-type="text"]')
    text.click()
    browser.switch_to.active_element.send_keys("i")
    active = browser.switch_to.active_element
    assert active.get_attribute("class") == "answer"
    active.send_keys("Aurora", Keys.ENTER)
    [resumed] = d.wait_resumed(ws["docs-site"])
    assert json.loads(resumed["answer"])["answer"] == "Aurora"

    # Phone width: one column, nothing wider than the screen.
    browser.set_window_size(375, 812)
    until(browser, "the phone layout", no_horizontal_scroll)
    assert serious_violations(browser) == [], "phone width, later"


def test_the_context_of_a_question_is_folded_and_opens(
    served: tuple[Daemon, str, Path],
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    """`context` and `respondents` are optional in a question: shown when there, by the page's
    own rendering (the API passes them through where a question has them)."""
    d, url, root = served
    browser.get(url)
    log_in(browser, make_token(d.state_dir, "alice"))
    paused_workspace(
        root / "billing-api",
        "Ship the migration now?",
        task="migrate invoices",
        input_type="yes_no",
    )
    _until(browser, "the question", ".item")
    browser.execute_script(
        "items = items.map((r) => ({...r, respondents: ['alice', 'ops-team'], context: {"
        "task: 'migrate invoices to the new schema',"
        "last_agent_message: 'The dry run passed: 41,203 rows would move, 0 conflicts.',"
        "recent_tool_calls: [{tool_name: 'run_sql',"
        " arguments: {query: 'SELECT count(*) FROM invoices'},"
        " status: 'SUCCESS', result: '41203'}]}})); cards.clear(); sections.clear(); render();"
    )
    item = browser.find_element(By.CSS_SELECTOR, ".item")
    details = item.find_element(By.CSS_SELECTOR, "details.context")
    assert details.get_attribute("open") is None  # one line until opened (a phone's screen)
    details.find_element(By.TAG_NAME, "summary").click()
    until(browser, "the context opened", lambda b: details.get_attribute("open") is not None)
    assert "41,203 rows" in details.text and "run_sql" in details.text
    assert "alice, ops-team" in item.text
    assert serious_violations(browser) == [], "a question with its context"
    shot(browser, "question-context")
    browser.set_window_size(375, 812)
    until(browser, "the phone layout", no_horizontal_scroll)
    shot(browser, "question-context-phone")


# -- a finished run's outcome ---------------------------------------------------------------------
# Markup and two lines: the page must show it as text, never as HTML.
FINAL = 'Hello Ada! <b>Welcome</b> & <img src=x onerror="window.pwned=1">\nSee you soon.'


def run_end(driver: WebDriver) -> Any:
    """The history's entry for the run's end, once it is there."""
    css = '#activity li.ended[data-to="COMPLETED"]'
    _until(driver, "the run's end in the history", css)
    return driver.find_element(By.CSS_SELECTOR, css)


def outcome_shown(driver: WebDriver) -> dict[str, Any]:
    """What the run's end shows, its outcome unfolded."""
    end = run_end(driver)
    details = end.find_element(By.CSS_SELECTOR, "details.outcome")
    if details.get_attribute("open") is None:
        details.find_element(By.TAG_NAME, "summary").click()
    until(driver, "the outcome unfolded", lambda b: details.get_attribute("open") is not None)
    message = details.find_element(By.CSS_SELECTOR, ".final-message")
    return {
        "what": end.find_element(By.CSS_SELECTOR, ".what").text,
        "message": message.get_attribute("textContent"),
        "markup": len(message.find_elements(By.CSS_SELECTOR, "*")),
        "answers": [a.text for a in details.find_elements(By.CSS_SELECTOR, ".answers li")],
        "pwned": driver.execute_script("return window.pwned === 1"),
    }


def test_a_finished_runs_outcome_is_on_the_page_after_a_reload_and_a_restart(
    tmp_path: Path,
    fake: FakeLLM,
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    root = tmp_path / "root"
    ws = root / "greeter"
    ws.mkdir(parents=True)
    d = Daemon(
        tmp_path,
        [root],
        resume_command=REAL_CLIENT,
        http={"listen": f"127.0.0.1:{free_port()}"},
    ).start(env=llm_env(fake))
    try:
        fake.call("ask_human", {"prompt": "What is your name?"}, id="ask1")
        fake.reply(FINAL)
        agent = write_agent(tmp_path)
        out = _delta(fake, "run", "--agent", str(agent), "--task", "greet", "--work-dir", str(ws))
        assert out.returncode == 101, out.stderr
        url = http_url(d)
        browser.set_window_size(1280, 900)
        browser.get(url)
        log_in(browser, make_token(d.state_dir, "ada"))
        _until(browser, "the question", '.item[data-input-type="text"] input.answer')
        field = browser.find_element(By.CSS_SELECTOR, ".item input.answer")
        field.send_keys("Ada", Keys.ENTER)
        wait_for(lambda: metadata_status(ws) == "COMPLETED", "the run completed", timeout=WAIT)

        for when in ("live", "after a reload", "after a restart"):
            if when == "after a reload":
                browser.refresh()
            elif when == "after a restart":
                assert d.stop() == 0
                d.start(env=llm_env(fake), wait=False)
                d.wait_event("daemon_ready", count=2)
                browser.refresh()
            shown = outcome_shown(browser)
            assert shown["message"] == FINAL, when  # as text: its markup is not made elements
            assert shown["markup"] == 0 and not shown["pwned"], when
            assert shown["what"].startswith("run completed in "), when
            assert shown["what"].endswith(" s"), when
            assert shown["answers"] == ["ada answered “Ada” (What is your name?)"], when
        assert serious_violations(browser) == [], "a finished run's outcome unfolded"
        shot(browser, "history-outcome")
    finally:
        d.stop()
        d.kill_children()


# -- a reverse proxy under a path prefix ----------------------------------------------------------
class PrefixProxy:
    """`/inbox/...` → the daemon's `/...`, streamed (the event stream too), as nginx's
    `location /inbox/ { proxy_pass http://127.0.0.1:8470/; proxy_buffering off; }` does."""

    def __init__(self, upstream: str, prefix: str = "/inbox/") -> None:
        self.seen: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                if not self.path.startswith(prefix):
                    self.send_error(404)
                    return
                outer.seen.append(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                }
                path = "/" + self.path[len(prefix) :]
                with (
                    httpx.Client(base_url=upstream, timeout=None) as c,
                    c.stream(self.command, path, headers=headers, content=body) as r,
                ):
                    self.send_response(r.status_code)
                    for k, v in r.headers.multi_items():
                        if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                            self.send_header(k, v)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    with contextlib.suppress(OSError):
                        for chunk in r.iter_raw():
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")

            do_GET = do_POST = do_DELETE = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{prefix}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_page_works_under_a_reverse_proxy_path_prefix(
    served: tuple[Daemon, str, Path],
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    d, url, root = served
    proxy = PrefixProxy(url)
    try:
        browser.get(proxy.url)
        log_in(browser, make_token(d.state_dir, "alice"))  # the stream, through the proxy
        paused_workspace(root / "ws1", "Name it?")
        _until(browser, "the question, live through the proxy", ".item")
        browser.find_element(By.CSS_SELECTOR, ".item input.answer").send_keys("Aurora", Keys.ENTER)
        [resumed] = d.wait_resumed(root / "ws1")
        assert json.loads(resumed["answer"])["answer"] == "Aurora"
        assert "/inbox/static/inbox.js" in proxy.seen and "/inbox/v1/events" in proxy.seen
        assert any(p.startswith("/inbox/v1/requests/") for p in proxy.seen)
        cookie = {
            c["name"]: c for c in browser.execute_cdp_cmd("Network.getAllCookies", {})["cookies"]
        }
        assert cookie["deltad_session"]["path"] == "/inbox/v1"
    finally:
        proxy.close()


def test_a_signed_link_page_works_under_the_path_prefix_too(
    served: tuple[Daemon, str, Path],
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    d, url, root = served
    paused_workspace(root / "ws1", "Which name?")
    rid = Mailbox(Workspace.at(root / "ws1")).read_request()
    assert rid is not None
    token = links.sign(links.load_key(d.state_dir), rid.request_id, str(root / "ws1"), 600)
    proxy = PrefixProxy(url)
    try:
        browser.get(f"{proxy.url}a/{token}")
        _until(browser, "the question behind the link", ".item input.answer")
        browser.find_element(By.CSS_SELECTOR, ".item input.answer").send_keys("Aurora", Keys.ENTER)
        [resumed] = d.wait_resumed(root / "ws1")
        assert json.loads(resumed["answer"])["channel"] == "link"
        assert "/inbox/static/inbox.css" in proxy.seen
        assert f"/inbox/v1/links/{token}/answer" in proxy.seen
    finally:
        proxy.close()


def test_the_page_follows_next_through_every_page_of_a_list(
    served: tuple[Daemon, str, Path],
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    """Both list shapes: without `next` (one page) and with a cursor or a link to follow."""
    _, url, _ = served
    browser.get(url)
    _until(browser, "the page", "#token")
    got = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const pages = {
          "v1/requests?workspace=w": {requests: [1, 2], next: "c1"},
          "v1/requests?workspace=w&cursor=c1": {requests: [3], next: "/v1/requests?cursor=c2"},
          "v1/requests?cursor=c2": {requests: [4], next: null},
          "v1/runs?": {runs: [9]},
        };
        const asked = [];
        window.fetch = async (u) => {
          const path = decodeURIComponent(u.slice(BASE.length));
          asked.push(path);
          return new Response(JSON.stringify(pages[path] || {error: path}),
                              {status: pages[path] ? 200 : 404});
        };
        Promise.all([listAll("v1/requests", "requests", {workspace: "w"}),
                     listAll("v1/runs", "runs", {})])
          .then(([requests, runs]) => done({requests, runs, asked}),
                (e) => done({error: String(e), asked}));
        """
    )
    assert got.get("requests") == [1, 2, 3, 4], got
    assert got["runs"] == [9]


def test_each_kind_s_controls_come_from_its_form_and_the_filter_lists_every_type(
    served: tuple[Daemon, str, Path],
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    """The page builds a question's controls from the API's `form`: a date picker within the
    date's bounds, yes/no buttons with their keys; the type filter lists the API's types."""
    d, url, root = served
    paused_workspace(root / "trip", "When do you leave?", input_type="date", earliest="2030-01-01")
    paused_workspace(root / "ship", "Ship it?", input_type="yes_no")
    browser.set_window_size(1280, 900)
    browser.get(url)
    log_in(browser, make_token(d.state_dir, "alice"))
    until(browser, "two questions", lambda b: len(b.find_elements(By.CSS_SELECTOR, ".item")) == 2)
    types = [t.value for t in InputType]
    until(
        browser,
        "the filter's types",
        lambda b: (
            [o.text for o in b.find_elements(By.CSS_SELECTOR, "#f-type option")] == ["all", *types]
        ),
    )
    day = browser.find_element(By.CSS_SELECTOR, '.item[data-input-type="date"] input.answer')
    assert (day.get_attribute("type"), day.get_attribute("min")) == ("date", "2030-01-01")
    ship = browser.find_element(By.CSS_SELECTOR, '.item[data-input-type="yes_no"]')
    answer_buttons = ship.find_elements(By.CSS_SELECTOR, ".actions button")
    keys = [b.get_attribute("data-key") for b in answer_buttons]
    assert keys == ["y", "n"]
    assert serious_violations(browser) == [], "a date and a yes/no question"
    ship.click()
    browser.switch_to.active_element.send_keys("y")
    [resumed] = d.wait_resumed(root / "ship")
    assert json.loads(resumed["answer"])["answer"] == "yes"


def _place(driver: WebDriver) -> dict[str, Any]:
    """Where the selected card is against the sticky bar and the viewport."""
    return dict(
        driver.execute_script(
            "const c = document.querySelector('.item.selected');"
            "const bar = document.querySelector('.bar').getBoundingClientRect();"
            "if (!c) return {id: null};"
            "const r = c.getBoundingClientRect();"
            "return {id: c.dataset.requestId, top: r.top, bar: bar.bottom, height: innerHeight,"
            " scrolled: scrollY};"
        )
    )


def _view_shot(driver: WebDriver, name: str) -> None:
    """The viewport as a person sees it (not the whole page, as `shot` takes)."""
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))


def test_a_deep_link_and_the_keyboard_land_below_the_bar_and_opening_the_page_is_no_failed_login(
    served: tuple[Daemon, str, Path],
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    """A notification's `#request=ID` and `k`/`↑` bring the question below the sticky bar (not
    under it) at phone and desk width; opening the page logs no failed login and counts no
    401; the run view shows a system message's text."""
    d, url, root = served
    ids = {}
    for i in range(8):  # newest first: 1.3.0 is in the middle, with room to scroll below it
        options = [{"key": "s", "label": "stable"}, {"key": "b", "label": "beta"}]
        paused_workspace(
            root / f"release-{i}",
            f"Which channel should 1.{i}.0 ship to?",
            input_type="choice",
            options=options,
        )
        ids[i] = json.loads((root / f"release-{i}/.delta/interaction/request.json").read_text())
    target = ids[3]["request_id"]
    browser.set_window_size(1280, 812)
    browser.get(url)
    log_in(browser, make_token(d.state_dir, "alice"))
    # The page's question before the login was no failed login, and no 401 was counted.
    probes = d.events("http_request", route="/v1/session", method="GET")
    assert probes and probes[0]["code"] == 200, probes
    assert d.events("http_auth_failed") == []

    for width in (375, 1280):
        browser.get("about:blank")
        browser.set_window_size(width, 812)
        browser.get(f"{url}/#request={target}")
        where = until(
            browser,
            f"the linked question selected and scrolled to at {width} px",
            lambda b: (p := _place(b))["id"] == target and p["scrolled"] > 0 and p,
        )
        assert where["bar"] <= where["top"] < where["height"], (width, where)
        _view_shot(browser, f"deeplink-{width}")
        # The keyboard: the question above, out of view, comes in below the bar too.
        browser.execute_script("window.scrollBy(0, 400)")  # the one above is out of view now
        browser.switch_to.active_element.send_keys("k")
        where = until(
            browser, "the question above", lambda b: (p := _place(b))["id"] != target and p
        )
        assert where["id"] == ids[4]["request_id"]
        assert where["bar"] <= where["top"] < where["height"], (width, where)
        browser.switch_to.active_element.send_keys(Keys.ARROW_UP)
        where = until(
            browser,
            "and the one above it",
            lambda b: _place(b)["id"] == ids[5]["request_id"] and _place(b),
        )
        assert where["bar"] <= where["top"] < where["height"], (width, where)
        _view_shot(browser, f"keyboard-up-{width}")
    assert d.events("http_auth_failed") == []


def test_the_run_view_shows_a_system_message(
    served: tuple[Daemon, str, Path],
    browser: WebDriver,  # noqa: F811 - the fixture
) -> None:
    d, url, root = served
    ws = root / "noted"
    run_id = paused_workspace(ws, "Go on?", input_type="yes_no")
    journal = ws / ".delta" / "runs" / run_id / "execution" / "journal.jsonl"
    note = {
        "seq": 2,
        "timestamp": "2030-01-01T00:00:00Z",
        "type": "SYSTEM_MESSAGE",
        "payload": {"level": "WARNING", "content": "the model endpoint was retried twice"},
    }
    with journal.open("a") as f:
        f.write(json.dumps(note) + "\n")
    browser.set_window_size(1280, 900)
    browser.get(url)
    log_in(browser, make_token(d.state_dir, "alice"))
    _until(browser, "the question", ".item .run-link")
    browser.find_element(By.CSS_SELECTOR, ".item .run-link").click()
    _until(browser, "the run view", "#run-body .transcript")
    step = until(
        browser,
        "the system message",
        lambda b: b.find_elements(By.CSS_SELECTOR, '#run-body [data-type="SYSTEM_MESSAGE"]'),
    )[0]
    assert "note (warning)" in step.text and "the model endpoint was retried twice" in step.text
    assert serious_violations(browser) == [], "the run view"
