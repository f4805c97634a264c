"""Tests only: an endpoint that runs Python inside the inbox process, to play an attacker who
has taken it over (tests/e2e/test_privsep.py). Installed only when the inbox process starts
with DELTAD_INBOX_TEST_HOOK=1 in its environment, which only the core's own environment can
give it (no configuration key reaches it); the inbox logs `inbox_test_hook_enabled` then.
The systemd units never set it."""

from __future__ import annotations

import traceback
from typing import Any

from fastapi import Body, FastAPI


def install(app: FastAPI, remote: Any) -> None:
    @app.post("/__test__/exec", include_in_schema=False)
    def run(code: str = Body(..., embed=True)) -> dict[str, Any]:
        scope: dict[str, Any] = {"remote": remote, "result": None}
        try:
            exec(code, scope)
        except BaseException:
            return {"error": traceback.format_exc(limit=3)}
        return {"result": scope.get("result")}

    # Before the routes already there: the static mount would take the path otherwise.
    app.router.routes.insert(0, app.router.routes.pop())
