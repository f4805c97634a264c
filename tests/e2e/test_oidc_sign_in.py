"""OIDC sign-in through a real `deltad serve` and a real OpenID provider on 127.0.0.1
(oidc-provider-mock: Authlib's authorization server): people sign in to the page in headless
Chromium by the code flow with PKCE and land signed in as themselves; a question for
`group:ops` is answered by a member of ops and the run resumes, a person outside it is refused;
a bearer JWT the provider issued works on the API and on the MCP endpoint (the official `mcp`
client), one signed by another key, for another audience or expired does not; a question is
handed to a person (`oidc:NAME`) by a person and answered by them; a callback whose `state` or
`iss` does not match, or whose ID token was tampered with, mints no session."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey
from mcp import ClientSession
from oidc_provider_mock import User

from deltad.protocol.models import Option
from deltad.testing.stub import paused_workspace
from tests.support.daemon import Daemon
from tests.support.inbox import http_url, make_token
from tests.support.oidcprovider import CLIENT_ID, Provider, flip, running

from .test_mcp import session

SECRET_ENV = "DELTAD_TEST_OIDC_SECRET"
OPTIONS = [Option(key="r", label="Red"), Option(key="b", label="Blue")]
WAIT = 30
USERS = [
    User(sub="alice", claims={"email": "alice@example.com", "groups": ["ops", "dev"]}),
    User(sub="bob", claims={"email": "bob@example.com", "groups": ["dev"]}),
]


@pytest.fixture
def provider() -> Iterator[Provider]:
    with running(USERS) as p:
        yield p


def _daemon(tmp_path: Path, provider: Provider) -> Daemon:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    oidc = {
        "issuer": provider.issuer,
        "client_id": CLIENT_ID,
        "client_secret": {"secret_env": SECRET_ENV},
        "provider_name": "Test IdP",
    }
    d = Daemon(tmp_path, [root], http={"listen": "127.0.0.1:0", "oidc": oidc})
    return d.start(env={SECRET_ENV: "s3cret-not-logged"})


def _rid(ws: Path) -> str:
    return str(json.loads((ws / ".delta/interaction/request.json").read_text())["request_id"])


def _sign_in(url: str, provider: Provider, sub: str) -> tuple[httpx.Client, httpx.Response]:
    """The code flow as a browser walks it, without a browser: the page's link, the provider's
    form (signed in as `sub`), the callback. Returns the client (its cookies) and the callback's
    answer."""
    c = httpx.Client(base_url=url, timeout=30)
    start = c.get("/v1/oidc/login")
    assert start.status_code == 302, start.text
    to = start.headers["location"]
    assert to.startswith(provider.issuer + "/oauth2/authorize?")
    query = parse_qs(urlsplit(to).query)
    assert query["code_challenge_method"] == ["S256"] and query["code_challenge"][0]
    assert query["state"][0] and query["nonce"][0]
    back = httpx.post(to, data={"sub": sub}, timeout=30)
    assert back.status_code == 302, back.text
    return c, c.get(back.headers["location"])


def test_a_bearer_jwt_from_the_provider_answers_for_its_group(
    tmp_path: Path, provider: Provider
) -> None:
    d = _daemon(tmp_path, provider)
    ws = tmp_path / "root" / "ops"
    paused_workspace(ws, "Colour?", input_type="choice", options=OPTIONS, respondents=["group:ops"])
    try:
        url = http_url(d)
        alice, bob = provider.id_token("alice"), provider.id_token("bob")

        def api(token: str) -> httpx.Client:
            return httpx.Client(
                base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"}
            )

        with api(bob) as b:
            me = b.get("/v1/session").json()
            assert (me["name"], me["role"]) == ("oidc:bob@example.com", "answerer")
            listed = b.get("/v1/requests").json()["requests"]
            assert [q["request_id"] for q in listed] == [_rid(ws)]
            r = b.post(f"/v1/requests/{_rid(ws)}/answer", json={"answer": "b"})
            assert r.status_code == 403 and "group:ops" in r.json()["error"], r.text
        # Refused: another key, another audience, expired, tampered, a deltad token's shape.
        other = RSAKey.generate_key(2048, parameters={"kid": provider.key.kid})
        now = provider.sign(sub="alice")  # the provider's key, as it would issue it
        forged = jwt.encode(
            {"alg": "RS256", "kid": provider.key.kid}, jwt.decode(now, provider.key).claims, other
        )
        for bad in (
            forged,
            provider.sign(sub="alice", aud="someone-else"),
            provider.sign(sub="alice", iat=1, exp=2),
            flip(alice),
            provider.sign(sub="alice", iss="http://127.0.0.1:1"),
        ):
            with api(bad) as x:
                r = x.get("/v1/requests")
                assert r.status_code == 401, (r.status_code, r.text)
        with api(now) as x:  # the same claims, signed by the provider: accepted
            assert x.get("/v1/requests").status_code == 200
        with api(alice) as a:
            r = a.post(f"/v1/requests/{_rid(ws)}/answer", json={"answer": "b"})
            assert r.status_code == 202, r.text
        [resumed] = d.wait_resumed(ws)
        # Who answered is the person: in the answer the run is handed and in the audit log,
        # beside bob's refusal.
        assert json.loads(resumed["answer"])["answered_by"] == "oidc:alice@example.com"
        audit = [json.loads(x) for x in (d.state_dir / "audit.jsonl").read_text().splitlines()]
        kinds = [(a["kind"], a["answered_by"]) for a in audit]
        assert kinds == [
            ("refused", "oidc:bob@example.com"),
            ("decision", "oidc:alice@example.com"),
        ]
        # Tokens still work beside it.
        token = make_token(d.state_dir, "robot")
        with api(token) as r_:
            assert r_.get("/v1/session").json()["name"] == "robot"
        # The client secret never reaches a log line.
        assert "s3cret-not-logged" not in d.log_path.read_text()
    finally:
        d.stop()


def _forged(provider: Provider, sub: str) -> str:
    """The claims the provider would sign for `sub`, signed by another key with its kid."""
    other = RSAKey.generate_key(2048, parameters={"kid": provider.key.kid})
    claims = jwt.decode(provider.sign(sub=sub), provider.key).claims
    return jwt.encode({"alg": "RS256", "kid": provider.key.kid}, claims, other)


def test_an_mcp_host_signed_in_as_a_person_answers_for_its_group(
    tmp_path: Path, provider: Provider
) -> None:
    d = _daemon(tmp_path, provider)
    ws = tmp_path / "root" / "ops"
    paused_workspace(ws, "Colour?", input_type="choice", options=OPTIONS, respondents=["group:ops"])
    try:
        url, rid = http_url(d), _rid(ws)
        alice, bob = provider.id_token("alice"), provider.id_token("bob")
        # Refused at the gate, before the SDK: another key, tampered, expired.
        for bad in (_forged(provider, "alice"), flip(alice), provider.sign(sub="a", exp=2)):
            r = httpx.post(
                f"{url}/mcp",
                headers={"Authorization": f"Bearer {bad}"},
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                timeout=30,
            )
            assert r.status_code == 401, (r.status_code, r.text)
            assert r.headers["content-type"] == "application/problem+json"
            assert "this JWT is not accepted" in r.json()["detail"], r.text

        async def as_person(token: str, fn: Any) -> Any:
            async with session(url, token, modern=False) as s:
                return await fn(s)

        async def bob_tries(s: ClientSession) -> None:
            listed = (await s.call_tool("list_questions", {})).structured_content
            assert listed is not None
            assert [q["request_id"] for q in listed["questions"]] == [rid]
            refused = await s.call_tool("answer_question", {"request_id": rid, "answer": "b"})
            assert refused.is_error and refused.structured_content is not None
            assert "group:ops" in refused.structured_content["error"], refused
            assert "oidc:bob@example.com" in refused.structured_content["error"], refused

        async def alice_answers(s: ClientSession) -> None:
            got = (await s.call_tool("get_question", {"request_id": rid})).structured_content
            assert got is not None and got["respondents"] == ["group:ops"], got
            done = await s.call_tool("answer_question", {"request_id": rid, "answer": "r"})
            assert not done.is_error, done

        anyio.run(as_person, bob, bob_tries)
        anyio.run(as_person, alice, alice_answers)
        [resumed] = d.wait_resumed(ws)
        answer = json.loads(resumed["answer"])
        assert (answer["answered_by"], answer["channel"]) == ("oidc:alice@example.com", "mcp")
        audit = [json.loads(x) for x in (d.state_dir / "audit.jsonl").read_text().splitlines()]
        assert [(a["kind"], a["answered_by"]) for a in audit] == [
            ("refused", "oidc:bob@example.com"),
            ("decision", "oidc:alice@example.com"),
        ]
    finally:
        d.stop()


def test_a_person_hands_a_question_to_a_person_who_answers(
    tmp_path: Path, provider: Provider
) -> None:
    d = _daemon(tmp_path, provider)
    ws = tmp_path / "root" / "ops"
    paused_workspace(ws, "Colour?", input_type="choice", options=OPTIONS, respondents=["group:ops"])
    try:
        url, rid = http_url(d), _rid(ws)
        alice, bob = provider.id_token("alice"), provider.id_token("bob")

        def api(token: str) -> httpx.Client:
            return httpx.Client(
                base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"}
            )

        with api(alice) as a, api(bob) as b:
            # Bob is not in ops: he may neither answer nor hand it over.
            assert b.post(f"/v1/requests/{rid}/answer", json={"answer": "b"}).status_code == 403
            r = b.post(f"/v1/requests/{rid}/delegate", json={"to": "oidc:bob@example.com"})
            assert r.status_code == 403 and r.json()["code"] == "not_a_respondent", r.text
            # Not a name deltad keeps; herself (by either of her names): refused in one line.
            for to in ("oidc:bob example", "oidc:", "oidc:alice@example.com", "oidc:alice"):
                r = a.post(f"/v1/requests/{rid}/delegate", json={"to": to})
                assert r.status_code == 422 and r.json()["code"] == "unknown_delegate", (to, r.text)
                assert "\n" not in r.json()["error"]
            handed = {"to": "oidc:bob@example.com", "note": "yours"}
            r = a.post(f"/v1/requests/{rid}/delegate", json=handed)
            assert r.status_code == 200, r.text
            [shown] = r.json()["delegations"]
            assert (shown["by"], shown["to"]) == ("oidc:alice@example.com", "oidc:bob@example.com")
            assert b.get(f"/v1/requests/{rid}").json()["delegations"] == [shown]
            r = b.post(f"/v1/requests/{rid}/answer", json={"answer": "b"})
            assert r.status_code == 202, r.text
        [resumed] = d.wait_resumed(ws)
        assert json.loads(resumed["answer"])["answered_by"] == "oidc:bob@example.com"
        [event] = d.events("question_delegated")
        assert (event["by"], event["to"]) == ("oidc:alice@example.com", "oidc:bob@example.com")
    finally:
        d.stop()


def test_a_callback_that_does_not_check_out_mints_no_session(
    tmp_path: Path, provider: Provider
) -> None:
    d = _daemon(tmp_path, provider)
    try:
        url = http_url(d)
        # The whole flow, as it should go: a session for the person, the page's calls work.
        c, done = _sign_in(url, provider, "alice")
        assert done.status_code == 303 and done.headers["location"] == "../../", done.text
        me = c.get("/v1/session").json()
        assert me["name"] == "oidc:alice@example.com" and me["csrf"]
        c.close()

        def callback(change: dict[str, Any], sub: str = "alice") -> httpx.Response:
            c = httpx.Client(base_url=url, timeout=30)
            to = c.get("/v1/oidc/login").headers["location"]
            back = httpx.post(to, data={"sub": sub}, timeout=30).headers["location"]
            params = {k: v[0] for k, v in parse_qs(urlsplit(back).query).items()}
            r = c.get("/v1/oidc/callback", params={**params, **change})
            assert "deltad_session" not in c.cookies or r.status_code == 303
            c.close()
            return r

        assert callback({"state": "not-the-one"}).status_code == 401
        r = callback({"iss": "http://127.0.0.1:1"})
        assert r.status_code == 401 and "RFC 9207" in r.json()["error"], r.text
        assert callback({"iss": provider.issuer}).status_code == 303  # the right one passes

        def resigned(**change: Any) -> Callable[[str], str]:
            """The ID token the provider sent, `change`d and signed again with its key."""
            return lambda t: provider.sign(**{**jwt.decode(t, provider.key).claims, **change})

        for rewrite in (
            flip,  # tampered
            resigned(nonce="another-sign-in"),
            resigned(aud="someone-else"),
            resigned(iat=1, exp=2),
        ):
            provider.rewrite.append(rewrite)
            r = callback({})
            assert r.status_code == 401, r.text
        # No pending sign-in in this browser: a code alone is no sign-in.
        with httpx.Client(base_url=url, timeout=30) as bare:
            r = bare.get("/v1/oidc/callback", params={"code": "x", "state": "y"})
            assert r.status_code == 401
        reasons = [e["reason"] for e in d.events("oidc_sign_in_refused")]
        assert len(reasons) == 7, reasons
        for why in ("state", "RFC 9207", "signature", "nonce", "aud", "exp", "no sign-in"):
            assert any(why in r for r in reasons), (why, reasons)
    finally:
        d.stop()


CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.skipif(
    not (CHROMIUM and DRIVER) and os.environ.get("CI") != "true",
    reason="needs Debian's chromium and chromium-driver",
)
def test_the_page_signs_in_through_the_provider_and_answers_for_the_group(
    tmp_path: Path, provider: Provider
) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service(DRIVER or "/usr/bin/chromedriver"))
    d = _daemon(tmp_path, provider)
    ws = tmp_path / "root" / "ops"
    paused_workspace(ws, "Colour?", input_type="choice", options=OPTIONS, respondents=["group:ops"])

    def until(what: str, css: str) -> None:
        WebDriverWait(browser, WAIT).until(
            lambda b: b.find_elements(By.CSS_SELECTOR, css), f"waiting for {what} ({css})"
        )

    try:
        url = http_url(d)
        browser.get(url)
        until("the sign-in link", "#sso:not([hidden]) #sso-link")
        link = browser.find_element(By.ID, "sso-link")
        assert link.text == "Sign in with Test IdP"
        link.click()
        until("the provider's form", 'button[name="sub"][value="alice"]')
        browser.find_element(By.CSS_SELECTOR, 'button[name="sub"][value="alice"]').click()
        until("the question, signed in", '.item[data-input-type="choice"]')
        assert browser.find_element(By.ID, "who").text == "oidc:alice@example.com · answerer"
        assert "For group:ops" in browser.find_element(By.CSS_SELECTOR, ".respondents").text
        browser.find_element(By.TAG_NAME, "body").send_keys("b")  # the key answers it
        d.wait_resumed(ws)
        cookies = {
            c["name"]: c for c in browser.execute_cdp_cmd("Network.getAllCookies", {})["cookies"]
        }
        session = cookies["deltad_session"]
        assert (session["httpOnly"], session["sameSite"], session["path"]) == (
            True,
            "Strict",
            "/v1",
        )
        # The session survives a restart of the daemon (the same signed cookie).
        d.stop()
        d = Daemon(tmp_path, [tmp_path / "root"], http=d.settings["http"]).start(
            env={SECRET_ENV: "s3cret-not-logged"}
        )
        url = http_url(d)
        browser.get(url)
        until("signed in again after the restart", "#logout:not([hidden])")
        assert browser.find_element(By.ID, "who").text.startswith("oidc:alice@example.com")
        # Logging out ends it; the page offers the provider again.
        browser.find_element(By.ID, "logout").click()
        until("the sign-in link after logging out", "#sso:not([hidden])")
    finally:
        browser.quit()
        d.stop()
