"""The inbox's lists a page at a time against a real `deltad serve --listen`: 250 stub-paused
workspaces, listed by cursor over real HTTP, filtered, and an answered question dropping out."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx

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
