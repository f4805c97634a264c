"""What the routes ask that reads or writes a workspace: the seam between the HTTP inbox and
the core. `Local` runs the handlers in this process (the core, serving the inbox's calls; a
test's app without a core); the inbox process has `deltad.http.child.Remote`, which sends
each call to the core over the privilege-separation socket. Both raise `ApiError`."""

from __future__ import annotations

from typing import Any, Protocol

from deltad.inbox import handlers, history, links
from deltad.inbox.handlers import ApiError, Context
from deltad.inbox.tokens import Identity


class Calls(Protocol):
    def list_requests(
        self,
        who: Identity,
        workspace: str | None,
        input_type: str | None,
        *,
        owner: str | None,
        run_id: str | None,
        limit: int,
        cursor: str | None,
        sort: str = "newest",
        older_than: str | None = None,
        due_within: str | None = None,
    ) -> dict[str, Any]: ...

    def get_request(
        self, who: Identity, request_id: str, workspace: str | None
    ) -> dict[str, Any]: ...

    def answer(
        self,
        who: Identity,
        request_id: str,
        body: dict[str, Any],
        idempotency_key: str | None,
        workspace: str | None,
        channel: str = "http",
    ) -> dict[str, Any]:
        """`channel`: "http" (the API, the page) or "mcp" (which never answers a secret)."""

    def answer_many(
        self,
        who: Identity,
        items: list[dict[str, Any]],
        body: dict[str, Any],
        idempotency_key: str | None,
    ) -> dict[str, Any]:
        """One answer for many questions (`items`: `request_id`, optional `workspace`)."""

    def delegate(
        self, who: Identity, request_id: str, to: str, note: str, workspace: str | None
    ) -> dict[str, Any]: ...

    def list_runs(
        self,
        who: Identity,
        workspace: str | None,
        status: str | None,
        *,
        owner: str | None,
        limit: int,
        cursor: str | None,
    ) -> dict[str, Any]: ...

    def get_run(self, who: Identity, run_id: str, workspace: str | None) -> dict[str, Any]: ...

    def history(self, who: Identity, limit: int) -> dict[str, Any]: ...

    def check_link(self, token: str) -> None:
        """Raises ApiError unless the signed link stands (checked before its body is read)."""

    def link_request(self, token: str) -> dict[str, Any]: ...

    def link_answer(self, token: str, body: dict[str, Any]) -> dict[str, Any]: ...


class Local:
    """The handlers, in this process, with this process's context."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def list_requests(
        self,
        who: Identity,
        workspace: str | None,
        input_type: str | None,
        *,
        owner: str | None,
        run_id: str | None,
        limit: int,
        cursor: str | None,
        sort: str = "newest",
        older_than: str | None = None,
        due_within: str | None = None,
    ) -> dict[str, Any]:
        return handlers.list_requests(
            self.ctx,
            who,
            workspace,
            input_type,
            owner=owner,
            run_id=run_id,
            limit=limit,
            cursor=cursor,
            sort=sort,
            older_than=older_than,
            due_within=due_within,
        )

    def get_request(self, who: Identity, request_id: str, workspace: str | None) -> dict[str, Any]:
        return handlers.get_request(self.ctx, who, request_id, workspace)

    def answer(
        self,
        who: Identity,
        request_id: str,
        body: dict[str, Any],
        idempotency_key: str | None,
        workspace: str | None,
        channel: str = "http",
    ) -> dict[str, Any]:
        return handlers.answer(
            self.ctx, who, request_id, body, idempotency_key, workspace=workspace, channel=channel
        )

    def answer_many(
        self,
        who: Identity,
        items: list[dict[str, Any]],
        body: dict[str, Any],
        idempotency_key: str | None,
    ) -> dict[str, Any]:
        return handlers.answer_many(self.ctx, who, items, body, idempotency_key)

    def delegate(
        self, who: Identity, request_id: str, to: str, note: str, workspace: str | None
    ) -> dict[str, Any]:
        return handlers.delegate(self.ctx, who, request_id, to, note, workspace=workspace)

    def list_runs(
        self,
        who: Identity,
        workspace: str | None,
        status: str | None,
        *,
        owner: str | None,
        limit: int,
        cursor: str | None,
    ) -> dict[str, Any]:
        return handlers.list_runs(
            self.ctx, who, workspace, status, owner=owner, limit=limit, cursor=cursor
        )

    def get_run(self, who: Identity, run_id: str, workspace: str | None) -> dict[str, Any]:
        return handlers.get_run(self.ctx, who, run_id, workspace)

    def history(self, who: Identity, limit: int) -> dict[str, Any]:
        return history.history(self.ctx, who, limit)

    def check_link(self, token: str) -> None:
        try:
            links.verify(self.ctx.link_key, token)
        except links.BadLink as e:
            raise ApiError(e.http, e.code, str(e)) from None

    def link_request(self, token: str) -> dict[str, Any]:
        return handlers.link_request(self.ctx, token)

    def link_answer(self, token: str, body: dict[str, Any]) -> dict[str, Any]:
        return handlers.link_answer(self.ctx, token, body)
