"""`GET /v1/requests?mine=true` through a real `deltad serve`: two tokens in different groups
each see only the questions that name them (by name, by group, handed over), not those open to
anyone nor another's; a reader named as a respondent has nothing to answer; pages of `mine`
hold every one of its questions exactly once in every sort; a person signed in through OIDC
(a provider's JWT) is known by either name and the provider's groups."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from deltad.testing.stub import paused_workspace
from tests.support.daemon import DELTAD, Daemon, wait_for
from tests.support.inbox import client, http_url, make_token
from tests.support.oidcprovider import Provider

from .test_inbox_page import free_port
from .test_oidc_sign_in import _daemon, provider  # noqa: F401 - the fixture is used


def _token(d: Daemon, name: str, group: str) -> str:
    argv = [DELTAD, "token", "add", name, "--group", group, "--state-dir", str(d.state_dir)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_mine_lists_only_the_questions_that_name_the_caller(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    paused_workspace(root / "a", "For alice?", respondents=["alice"])
    paused_workspace(root / "b", "For ops?", respondents=["group:ops"])
    paused_workspace(root / "c", "For dev?", respondents=["group:dev"])
    paused_workspace(root / "d", "For anyone?")
    paused_workspace(root / "e", "For carol?", respondents=["carol", "dave"])
    d = Daemon(tmp_path, [root], http={"listen": f"127.0.0.1:{free_port()}"}).start()
    try:
        alice = _token(d, "alice", "ops")
        bob = _token(d, "bob", "dev")
        carol = _token(d, "carol", "qa")
        dave = make_token(d.state_dir, "dave", role="reader")
        url = http_url(d)

        def mine(token: str, **params: str | int) -> list[str]:
            with client(url, token) as http:
                r = http.get("/v1/requests", params={"mine": "true", **params})
                assert r.status_code == 200, r.text
                return sorted(q["prompt"] for q in r.json()["requests"])

        with client(url, alice) as http:
            wait_for(lambda: len(http.get("/v1/requests").json()["requests"]) == 5, "all five")
        assert mine(alice) == ["For alice?", "For ops?"]
        assert mine(bob) == ["For dev?"]
        assert mine(carol) == ["For carol?"]
        assert mine(dave) == []  # named, but a reader answers nothing
        with client(url, bob) as http:  # without the filter: everything in scope, as before
            assert len(http.get("/v1/requests", params={"mine": "false"}).json()["requests"]) == 5

        with client(url, carol) as http:  # carol hands hers to bob: now his too
            [q] = http.get("/v1/requests", params={"mine": "true"}).json()["requests"]
            r = http.post(f"/v1/requests/{q['request_id']}/delegate", json={"to": "bob"})
            assert r.status_code == 200, r.text
        assert mine(bob) == ["For carol?", "For dev?"]
        assert mine(carol) == ["For carol?"]  # a hand-over is not a lock-out
        assert mine(alice) == ["For alice?", "For ops?"]

        # Paged a question at a time, in every sort: each of bob's exactly once, no other.
        for sort in ("newest", "oldest", "deadline"):
            seen: list[str] = []
            cursor: str | None = None
            with client(url, bob) as http:
                while True:
                    params: dict[str, str | int] = {"mine": "true", "limit": 1, "sort": sort}
                    if cursor:
                        params["cursor"] = cursor
                    page = http.get("/v1/requests", params=params).json()
                    seen += [q["prompt"] for q in page["requests"]]
                    cursor = page["next"]
                    if cursor is None:
                        break
            assert sorted(seen) == ["For carol?", "For dev?"], sort
        with client(url, bob) as http:
            r = http.get("/v1/requests", params={"mine": "perhaps"})
            assert r.status_code == 422, r.text
    finally:
        d.stop()
        d.kill_children()


def test_mine_knows_a_person_signed_in_through_oidc_by_both_names_and_groups(
    tmp_path: Path,
    provider: Provider,  # noqa: F811 - the fixture
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    paused_workspace(root / "ops", "For ops?", respondents=["group:ops"])
    paused_workspace(root / "al", "For alice?", respondents=["oidc:alice@example.com"])
    paused_workspace(root / "bo", "For bob?", respondents=["oidc:bob"])  # by his `sub`
    paused_workspace(root / "any", "For anyone?")
    d = _daemon(tmp_path, provider)
    try:
        url = http_url(d)

        def api(sub: str) -> httpx.Client:
            token = provider.id_token(sub)
            return httpx.Client(
                base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"}
            )

        def mine(sub: str) -> list[str]:
            with api(sub) as c:
                r = c.get("/v1/requests", params={"mine": "true"})
                assert r.status_code == 200, r.text
                return sorted(q["prompt"] for q in r.json()["requests"])

        with api("alice") as a:
            wait_for(lambda: len(a.get("/v1/requests").json()["requests"]) == 4, "all four")
        assert mine("alice") == ["For alice?", "For ops?"]
        assert mine("bob") == ["For bob?"]  # in dev, not ops
        with api("alice") as a:
            [q] = [q for q in a.get("/v1/requests").json()["requests"] if q["prompt"] == "For ops?"]
            r = a.post(
                f"/v1/requests/{q['request_id']}/delegate", json={"to": "oidc:bob@example.com"}
            )
            assert r.status_code == 200, r.text
        assert mine("bob") == ["For bob?", "For ops?"]
    finally:
        d.stop()
