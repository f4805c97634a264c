"""Refusals as RFC 9457 problem documents (`application/problem+json`), made in one place for
the handlers, FastAPI's own errors and the limits checked before a body is read.

Each keeps this API's stable `code` (and `error`, the same line as `detail`, for clients that
read it) beside the RFC's members: `type` is `about:blank`, so `title` is the status's phrase and
`detail` says what was wrong with this request, in one line, with no command-line hints."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse

PROBLEM = "application/problem+json"


def document(status: int, code: str, detail: str, **extra: Any) -> dict[str, Any]:
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    doc = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    return doc | {"code": code, "error": detail} | {k: v for k, v in extra.items() if v is not None}


class ProblemResponse(JSONResponse):
    media_type = PROBLEM


def response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> ProblemResponse:
    return ProblemResponse(document(status, code, detail, **extra), status, headers=headers)


def encoded(status: int, code: str, detail: str) -> bytes:
    return json.dumps(document(status, code, detail)).encode()
