"""The inbox's lists a page at a time against a real `deltad serve --listen`: 250 stub-paused
workspaces, listed by cursor over real HTTP, filtered, and an answered question dropping out."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from deltad.testing.stub import paused_workspace
from tests.support.daemon import metadata_status, running, wait_for
from tests.support.inbox import client, http_url, make_token

COUNT = 250


def every_page(http: httpx.Client, path: str, **params: Any) -> list[list[dict[str, Any]]]:
    """Each page of a list, following `next` until it is null."""
    listed = path.rsplit("/", 1)[1]
    out: list[list[dict[str, Any]]] = []
    while True:
        r = http.get(path, params=params)
        assert r.status_code == 200, r.text
        out.append(r.json()[listed])
        if r.json()["next"] is None:
            return out
        params["cursor"] = r.json()["next"]


def flat_docs(pages: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [item for page in pages for item in page]


def flat(pages: list[list[dict[str, Any]]], field: str) -> list[str]:
    return [str(item[field]) for page in pages for item in page]


def request_id(ws: Path) -> str:
    return str(
        json.loads((ws / ".delta" / "interaction" / "request.json").read_text())["request_id"]
    )


def test_250_questions_come_in_3_pages_each_once_and_an_answered_one_drops_out(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    spaces = [root / ("a" if i < 150 else "b") / f"ws{i:03}" for i in range(COUNT)]
    for ws in random.Random(7).sample(spaces, len(spaces)):  # asked in another order than named
        paused_workspace(ws, prompt=f"{ws.name}?")
    asked = {request_id(ws): ws for ws in spaces}
    with running(tmp_path, [root], http={"listen": "127.0.0.1:0"}) as d:
        url = http_url(d)
        with client(url, make_token(d.state_dir, "ops")) as http:
            wait_for(
                lambda: (
                    len(flat(every_page(http, "/v1/requests", limit=1000), "request_id")) == COUNT
                ),
                "the index to hold every question",
            )
            pages = every_page(http, "/v1/requests", limit=100)
            assert [len(p) for p in pages] == [100, 100, 50]
            listed = flat(pages, "request_id")
            assert sorted(listed) == sorted(asked)  # every question exactly once
            stamps = flat(pages, "timestamp")
            assert stamps == sorted(stamps, reverse=True)  # newest first across pages

            in_b = flat(every_page(http, "/v1/requests", workspace=f"{root}/b/*"), "workspace")
            assert sorted(in_b) == sorted(str(ws) for ws in spaces[150:])
            one = spaces[7]
            run_id = (one / ".delta" / "runs" / "LATEST").read_text().strip()
            by_run = flat(every_page(http, "/v1/requests", run_id=run_id), "workspace")
            assert by_run == [str(one)]
            assert len(flat(every_page(http, "/v1/requests", owner="root"), "request_id")) == COUNT
            assert every_page(http, "/v1/requests", owner="4242") == [[]]
            assert every_page(http, "/v1/requests", input_type="choice") == [[]]

            runs = every_page(http, "/v1/runs", limit=100)
            assert [len(p) for p in runs] == [100, 100, 50]
            assert sorted(flat(runs, "workspace")) == sorted(str(ws) for ws in spaces)

            rid = request_id(one)
            r = http.post(f"/v1/requests/{rid}/answer", json={"answer": "yes"})
            assert r.status_code == 202, r.text
            d.wait_resumed(one)
            wait_for(lambda: metadata_status(one) == "COMPLETED", "the answered run to complete")
            left = wait_for(
                lambda: (
                    (ids := flat(every_page(http, "/v1/requests"), "request_id"))
                    and len(ids) == COUNT - 1
                    and ids
                ),
                "the answered question to drop out",
            )
            assert rid not in left and sorted(left) == sorted(set(asked) - {rid})
            done = wait_for(
                lambda: flat(every_page(http, "/v1/runs", status="COMPLETED"), "workspace"),
                "the completed run listed by status",
            )
            assert done == [str(one)]


def _kept(metrics: httpx.Client) -> tuple[float, float]:
    """deltad_inbox_documents_kept and _bytes, as /metrics says them."""
    got = {
        s.name: s.value
        for f in text_string_to_metric_families(metrics.get("/metrics").text)
        for s in f.samples
        if s.name.startswith("deltad_inbox_documents_")
    }
    return got["deltad_inbox_documents_kept"], got["deltad_inbox_documents_bytes"]


def test_the_documents_are_read_ahead_of_any_page_and_a_page_then_matches_the_disk(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    spaces = [root / f"ws{i:02}" for i in range(40)]
    for ws in spaces:
        paused_workspace(ws, prompt=f"{ws.name}?")
    with (
        running(tmp_path, [root], http={"listen": "127.0.0.1:0"}) as d,
        client(http_url(d), make_token(d.state_dir, "ops")) as http,
        client(http_url(d), make_token(d.state_dir, "prom", role="metrics")) as prom,
    ):
        # No page is asked: the core reads every open question's document on its own once
        # the index is complete (40 fit in the cache many times over).
        wait_for(lambda: _kept(prom)[0] == len(spaces), "every document read ahead")
        assert _kept(prom)[1] > 0
        # The page served from them is what the disk says, each item as GET shows it.
        pages = every_page(http, "/v1/requests", limit=15)
        assert [len(p) for p in pages] == [15, 15, 10]
        assert sorted(flat(pages, "request_id")) == sorted(request_id(ws) for ws in spaces)
        one = pages[1][3]
        alone = http.get(f"/v1/requests/{one['request_id']}").json()
        assert one == alone
        # A question whose file changed is read again, never served as kept: its next
        # page shows what the disk says now.
        ws = next(w for w in spaces if request_id(w) == one["request_id"])
        req = ws / ".delta" / "interaction" / "request.json"
        doc = json.loads(req.read_text())
        (ws / "new.json").write_text(json.dumps({**doc, "prompt": "changed?"}))
        (ws / "new.json").replace(req)
        again = {
            q["request_id"]: q["prompt"]
            for q in flat_docs(every_page(http, "/v1/requests", limit=100))
        }
        assert again[one["request_id"]] == "changed?"
        assert len(again) == len(spaces)


SECURITY = {
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'",
}


def test_every_answer_carries_the_security_headers_once(tmp_path: Path) -> None:
    """A page, its HEAD, a refusal, an unknown path, the web page, a static file and the event
    stream's opening: each with the headers, each header once."""
    paused_workspace(tmp_path / "root" / "ws")
    with running(tmp_path, [tmp_path / "root"], http={"listen": "127.0.0.1:0"}) as d:
        url = http_url(d)
        with client(url, make_token(d.state_dir, "ops")) as http, client(url) as anonymous:
            answers = [
                http.get("/v1/requests"),
                http.head("/v1/requests"),
                anonymous.get("/v1/requests"),
                http.get("/v1/no-such-thing"),
                anonymous.get("/"),
                anonymous.get("/static/inbox.js"),
            ]
            with http.stream("GET", "/v1/events") as stream:
                answers.append(stream)
            assert [r.status_code for r in answers] == [200, 200, 401, 404, 200, 200, 200]
            for r in answers:
                for name, value in SECURITY.items():
                    assert r.headers.get_list(name) == [value], (r.request.url, name)
