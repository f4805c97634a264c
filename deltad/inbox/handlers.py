"""The API's handlers: one function per operation of the table (deltad/inbox/ops.py), from
(context, who asks, the operation's validated input) to its response model (schemas.py),
raising ApiError. No HTTP here (the routes in deltad/http/app.py are thin, and run in another
process), so the rules — scope, role, what a question looks like, what an answer does — are one
readable page, and the same for the signed links as for tokens.

Where to look comes from the daemon's index (no handler waits on a reconcile), and lists are
paged from it in memory; what is there is read from the disk every time (for a list, only a
page's items), and every answer goes through `deltad.inbox.submit`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import structlog

from deltad import inbox
from deltad.inbox import auditnotes, links, ops, paging, quorum, respondents, schemas, scopes
from deltad.inbox.context import Context as Context  # `as`: named from here too
from deltad.inbox.context import Shown, visible
from deltad.inbox.feed import Listed
from deltad.inbox.history import history as read_history
from deltad.inbox.history import journal_tail
from deltad.inbox.ops import ApiError as ApiError  # `as`: named from here too
from deltad.inbox.schemas import Question, document
from deltad.inbox.tokens import Identity
from deltad.protocol import JournalEvent, Mailbox, ProtocolError, Workspace, iso, kinds, viewing
from deltad.protocol.events import Thought
from deltad.protocol.kinds import kind_of
from deltad.protocol.layout import question_files
from deltad.protocol.printable import json_safe, show_path, unshow

log = structlog.get_logger("deltad.api")

Channel = Literal["http", "link", "mcp"]  # the inbox's surfaces an answer is recorded with

READ_THROUGH_LIMIT = 256  # workspaces whose request.json a miss may read


def qualifier(ctx: Context, who: Identity, workspace: str | None) -> Path | None:
    """The workspace a caller named (`?workspace=PATH`, exact): it must be a watched one the
    caller may see. One answer for both misses, so a token cannot probe which paths outside
    its scope are workspaces."""
    if workspace is None:
        return None
    path = scopes.normal(_unshown(workspace))
    if path is None or ctx.feed.index.get(Path(path)) is None or not visible(who, Path(path)):
        raise ApiError(404, "unknown_workspace", f"{workspace} is not a watched workspace")
    return Path(path)


def holder(mine: list[Path], gone: dict[Path, bool], request_id: str) -> Path | ApiError:
    """Which workspace a caller means by `request_id`, from where it is open that the caller
    may see (`mine`) and where it was and is gone (those the caller may see, with whether it
    expired). Never a guess: several visible holders are a 409. Where it is open only outside
    the caller's scope is the same 404 as nowhere: a token cannot learn what other tenants are
    asked by trying ids."""
    if len(mine) == 1:
        return mine[0]
    if mine:
        names = [show_path(w) for w in mine]
        return ApiError(
            409,
            "ambiguous_request",
            f"question {request_id} is open in {len(names)} workspaces "
            f"({', '.join(names)}); name one with ?workspace=PATH",
            names,
        )
    if gone and all(gone.values()):
        return ApiError(410, "expired", f"question {request_id} expired")
    if gone:
        return ApiError(409, "already_answered", f"question {request_id} was answered")
    return ApiError(404, "unknown_request", f"no pending question {request_id}")


def _workspace_of(
    ctx: Context, who: Identity, request_id: str, workspace: str | None = None
) -> Path:
    want = qualifier(ctx, who, workspace)
    seen = [w for w in ctx.feed.index.find(request_id) if want is None or w == want]
    mine = [w for w in seen if visible(who, w)]
    gone = {
        w: expired
        for w, expired in ctx.feed.index.closed(request_id).items()
        if visible(who, w) and (want is None or w == want)
    }
    if len(mine) > 1:  # the disk has the last word: drop copies that have moved on since
        gone |= {w: False for w in mine if not asks(w, request_id)}
        mine = [w for w in mine if w not in gone]
    if not mine:
        mine = read_through(ctx, who, request_id, want)
    found = holder(mine, gone, request_id)
    if isinstance(found, ApiError):
        raise found
    return found


def read_through(ctx: Context, who: Identity, request_id: str, want: Path | None) -> list[Path]:
    """On a miss, the disk: a question is open the moment `delta run` exits 101, before the
    daemon's loop has seen the change. Reads the request.json of at most READ_THROUGH_LIMIT
    workspaces the caller may see, those not known to be waiting first."""
    if want is not None:
        views = [v for v in [ctx.feed.index.get(want)] if v is not None]
    else:
        views = ctx.feed.index.views()
    views.sort(key=lambda v: v.state == "waiting")
    # Scope checked lazily: a miss costs at most READ_THROUGH_LIMIT reads, not a walk of
    # every workspace's real path.
    candidates = (
        v.workspace for v in views if v.request_id != request_id and visible(who, v.workspace)
    )
    return [ws for ws in islice(candidates, READ_THROUGH_LIMIT) if asks(ws, request_id)]


def asks(ws: Path, request_id: str) -> bool:
    """Whether `ws`'s mailbox holds question `request_id` now."""
    try:
        req = Mailbox(Workspace(ws)).read_request()
    except (ProtocolError, OSError):
        return False
    return req is not None and req.request_id == request_id


# -- questions ------------------------------------------------------------------------------------
def request_document(p: inbox.Pending, ws: Workspace, base_url: str) -> dict[str, Any]:
    r = p.request
    doc: dict[str, Any] = {
        "request_id": r.request_id,
        "workspace": show_path(p.workspace),
        "run_id": r.run_id,
        "action_id": r.action_id,
        "node_id": r.node_id,  # a pipeline gate or node asking
        "respondents": r.respondents,
        "delegations": p.delegations,  # who it was handed to (they may answer too)
        "approvals": p.approvals,  # four eyes: {required, given: [...]}, or null
        "follow_up": p.follow_up,  # reminders, escalation, SLA due (protocol/followup.py)
        "context": r.context.model_dump(mode="json") if r.context else None,
        "prompt": r.prompt,
        "input_type": str(r.input_type),
        "expects": kind_of(r.input_type).expects,
        "calls": [c.model_dump(mode="json") for c in r.calls],
        "default": r.default,
        "expires_at": iso(r.expires_at) if r.expires_at else None,
        # what the deadline answers, as `delta status` says it ("the default, 'beta'")
        "after_deadline": kind_of(r.input_type).after_deadline(r) if r.expires_at else None,
        "bounds": kind_of(r.input_type).bounds(r),  # "a number from 1 to 20", from the kind
        "sensitive": r.is_secret,
        "allow_empty": r.allow_empty,
        **kinds.question_fields(r),  # options, minimum, maximum, ...: each kind's own
        "form": kinds.form(r).model_dump(mode="json"),  # the page's answer form, from the kind
        "timestamp": iso(r.timestamp),
        "agent": p.agent,
        "task": p.task,
        "answer_waiting": p.answer_waiting,
        "last_refusal": p.last_refusal,
        "url": f"{base_url}/#request={r.request_id}",
    }
    if r.calls:
        why = _add_schemas(ws, r.run_id, doc["calls"])
        if why is not None:
            doc["agent_error"] = why  # the calls are shown without their schemas
    return doc


def _add_schemas(ws: Workspace, run_id: str, calls: list[dict[str, Any]]) -> str | None:
    """Each gated call's parameter schema, so the page checks an edit before sending it;
    or one line saying why the agent was not read."""
    try:
        agent, why = inbox.agent_and_problem(ws, inbox.load_run(ws, run_id).agent_ref)
    except (ProtocolError, OSError) as e:
        return f"the run cannot be read: {e}"
    if agent is None:
        return why
    for c in calls:
        tool = agent.tools.get(c["tool_name"])
        if tool is not None:
            c["schema"] = tool.schema()["function"]["parameters"]
    return None


def pending_question(ws: Path) -> inbox.Pending | None:
    """The open question in `ws` as a person sees it; None for a damaged workspace."""
    try:
        return inbox.pending(ws)
    except (ProtocolError, OSError):
        return None  # a damaged workspace shows nothing; the daemon reports it


def list_requests(
    ctx: Context, who: Identity, q: ops.ListRequests, now: float | None = None
) -> schemas.Spliced:
    """`{"requests": [question, ...], "next": cursor | null}` (`schemas.QuestionPage`, joined
    from the items' kept JSON): the open questions this token may see, newest first (by the
    question's `timestamp`, then workspace, then request id), each as `GET /v1/requests/{id}`
    shows it. Filters: `workspace` (glob), `input_type`,
    `owner` (user name or uid of the workspace's owner), `run_id`, `older_than` (asked at
    least that long ago), `due_within` (a deadline at most that far ahead, or passed), `mine`
    (the question names the caller: `_names_caller`); `sort`:
    newest (default), oldest, deadline (soonest first; none last). `limit` 1..1000 (default
    100); `cursor` is a previous page's `next`. A page may hold fewer than `limit` (questions
    answered meanwhile are skipped): follow `next` until it is null. 422 for a bad glob,
    limit, cursor, owner, sort or duration."""
    at = time.time() if now is None else now
    try:
        order = paging.sort_of(q.sort)
        n, after = paging.limit_of(q.limit), paging.decode(paging.SORTS[order], q.cursor)
        old, due = (
            paging.duration("older_than", q.older_than),
            paging.duration("due_within", q.due_within),
        )
        wanted = paging.Filters(
            tuple(who.scopes),
            ops.checked_glob(q.workspace),
            paging.owner_uid(q.owner),
            q.run_id,
            q.input_type and str(q.input_type),
            asked_before=None if old is None else at - old,
            due_by=None if due is None else at + due,
            mine=_names_caller(ctx, who) if q.mine else None,
        )
    except paging.BadPage as e:
        raise ApiError(422, "bad_page", str(e)) from None

    def read(e: Listed) -> bytes | None:
        shown = listed_shown(ctx, e)
        return None if shown is None else shown.page_json()

    docs, next_ = paging.question_page(ctx.feed.index, wanted, order, after, read, n)
    return schemas.question_page_json(docs, next_)


def _names_caller(ctx: Context, who: Identity) -> Callable[[Listed], bool]:
    """`?mine=true`: whether a listed question names `who` (respondents.is_mine), read from
    the question's document (the page's cache: a question kept is then read from memory).
    A token whose role cannot answer has nothing that is its to answer."""
    me = inbox.Answerer(who.name, who.groups, who.role == "admin", who.also)

    def names(e: Listed) -> bool:
        shown = listed_shown(ctx, e) if who.can_answer() else None
        doc = None if shown is None else shown.page_item()
        if doc is None:
            return False
        escalated = doc.follow_up.escalated if doc.follow_up is not None else None
        return respondents.is_mine(
            doc.respondents,
            [d.to for d in doc.delegations],
            escalated.to if escalated is not None else [],
            me,
        )

    return names


def file_stamp(paths: tuple[str, ...]) -> tuple[int, ...] | None:
    """The files' identities (None if one is gone). Only ever compared with what a safe read
    saw: the same inode with the same mtime and size is the same content."""
    out: list[int] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            return None
        out += (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    return tuple(out)


def listed_shown(ctx: Context, e: Listed) -> Shown | None:
    """A list item: the question in `e`'s workspace as kept for pages (read now if its files
    changed since); None (skipped) if it is gone — the loop's next look fixes the index.
    Whether a page shows it (not answered, not expired) is the `Shown`'s to say."""
    request_id = str(e.request_id)
    deps = question_files(e.workspace, str(e.run_id))
    stamp = None if deps is None else file_stamp(deps)  # before the read: a change meanwhile
    if stamp is None:  # is a miss next time
        return None
    key = (e.workspace, request_id)
    hit = ctx.documents.get(key, stamp)
    if hit is not None:
        return hit
    p = pending_question(e.workspace)
    if p is None or p.request.request_id != request_id:
        return None
    doc = Question.model_validate(request_document(p, Workspace(e.workspace), ctx.base_url))
    hit = Shown.of(stamp, doc, p.request.expires_at, p.answer_waiting)
    ctx.documents.put(key, hit)
    return hit


def get_request(ctx: Context, who: Identity, q: ops.GetRequest) -> Question:
    ws = _workspace_of(ctx, who, q.request_id, q.workspace)
    return open_document(ctx, ws, q.request_id)


def open_document(ctx: Context, ws: Path, request_id: str) -> Question:
    """Question `request_id` in `ws` as the API shows it, if it is still open there."""
    p = pending_question(ws)
    if p is None or p.request.request_id != request_id:
        # The index knew it open a moment ago: a resume has taken the answer (or the expiry).
        raise gone(ctx, ws, request_id)
    if p.request.expired():
        raise ApiError(410, "expired", f"question {request_id} expired")
    return Question.model_validate(request_document(p, Workspace(ws), ctx.base_url))


def gone(ctx: Context, ws: Path, request_id: str) -> ApiError:
    """Why question `request_id` in `ws` is no longer open: 410 if the daemon saw it expire."""
    if ctx.feed.index.closed(request_id).get(ws):
        return ApiError(410, "expired", f"question {request_id} expired")
    return ApiError(409, "already_answered", f"question {request_id} was answered")


def digest_of(body: object) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def answer(ctx: Context, who: Identity, q: ops.Answer) -> schemas.AnswerReceipt:
    """202's document once the answer is in the mailbox; ApiError otherwise."""
    if not who.can_answer():
        raise ApiError(403, "forbidden", f"token {who.name} may read, not answer ({who.role})")
    request_id, key = q.request_id, q.idempotency_key
    body_digest = digest_of(q.body)
    repeat = _repeat(ctx, who, request_id, body_digest, key, q.workspace)
    if repeat is not None:
        return schemas.AnswerReceipt.model_validate(repeat)
    ws = _workspace_of(ctx, who, request_id, q.workspace)
    try:
        _respondent(
            ws, request_id, inbox.Answerer(who.name, who.groups, who.role == "admin", who.also)
        )
        if q.channel in NO_SECRETS:
            _not_a_secret(ctx, ws, request_id, q.channel)
    except ApiError as e:  # refused before the answering path (which records its own)
        _refused(ctx, ws, request_id, e, q.channel, who.name, who.voter)
        raise
    receipt = deliver(ctx, ws, request_id, q.body, who.name, q.channel, voter=who.voter)
    if key:
        ctx.idempotency.remember(who.name, key, request_id, body_digest, document(receipt))
    return receipt


# Channels a secret is never answered through (an MCP host may show, log or keep what it
# sends): the page's form or a signed link instead.
NO_SECRETS = {"mcp": "MCP"}  # channel -> how a refusal names it


def _not_a_secret(ctx: Context, ws: Path, request_id: str, channel: str) -> None:
    p = pending_question(ws)
    if p is not None and p.request.request_id == request_id and p.request.is_secret:
        raise ApiError(
            403,
            "secret",
            f"question {request_id} asks for a secret, which is never answered over "
            f"{NO_SECRETS[channel]}: "
            f"answer it on the inbox page ({ctx.base_url}/#request={request_id})",
        )


def _repeat(
    ctx: Context,
    who: Identity,
    request_id: str,
    body_digest: str,
    idempotency_key: str | None,
    workspace: str | None,
) -> dict[str, Any] | None:
    """The first response to this key on this question, when this is a retry."""
    if not idempotency_key:
        return None
    want = qualifier(ctx, who, workspace)
    return ctx.idempotency.seen(who.name, idempotency_key, request_id, want, body_digest)


def deliver(
    ctx: Context,
    ws: Path,
    request_id: str,
    body: object,
    answered_by: str,
    channel: Channel,
    voter: str | None = None,
) -> schemas.AnswerReceipt:
    """`submit`, with a question that closed meanwhile told apart: expired (410) or answered."""
    try:
        return submit(ws, request_id, body, answered_by, channel, audit=ctx.audit, voter=voter)
    except ApiError as e:
        if e.code != "already_answered":
            raise
        raise gone(ctx, ws, request_id) from None


def submit(
    ws: Path,
    request_id: str,
    body: object,
    answered_by: str,
    channel: Channel,
    *,
    audit: Path | None = None,
    voter: str | None = None,
) -> schemas.AnswerReceipt:
    """`voter`: the person a vote counts for (a token's `person`), default `answered_by`."""
    try:
        parsed = inbox.AnswerIn.parse(body)
        if parsed.answer is None and parsed.decisions is None:
            raise inbox.Misfit('give "answer" or "decisions"')
        voter = None if channel == "link" else voter or answered_by  # a link names nobody
        done = quorum.cast(
            ws,
            request_id,
            parsed,
            by=voter,
            channel=channel,
            shown_as=answered_by,
            audit=audit,
            origin={"token": answered_by},  # a vote's receipt (quorum.record)
        )
    except inbox.NotPending:
        # Only questions the daemon's index saw open get here: a resume has taken it since.
        raise ApiError(409, "already_answered", f"question {request_id} was answered") from None
    except inbox.AnswerWaiting:
        # `delta respond`'s line names the mailbox file and its --force: neither is the API's
        why = "an answer to this question is already waiting to be taken by the run"
        raise ApiError(409, "answer_waiting", why) from None
    except inbox.SubmitError as e:
        raise ApiError(e.http, e.code, str(e)) from None
    except (ProtocolError, OSError) as e:
        raise ApiError(
            409, "workspace_problem", f"the workspace cannot take an answer: {e}"
        ) from None
    four_eyes: dict[str, Any] = {}
    if done.approvals is not None:  # four eyes: a vote, and whether it completed the answer
        four_eyes = {"answered": done.outcome == "answered", "approvals": done.approvals}
    return schemas.AnswerReceipt(
        status="accepted",
        request_id=request_id,
        workspace=show_path(ws),
        run_id=done.request.run_id,
        answered_by=answered_by,
        channel=channel,
        **four_eyes,
    )


# -- runs -----------------------------------------------------------------------------------------
def list_runs(ctx: Context, who: Identity, q: ops.ListRuns) -> schemas.RunPage:
    """`{"runs": [run summary, ...], "next": cursor | null}`: each visible workspace's latest
    run, newest first (by run id, which starts with its start time, then workspace). Filters:
    `workspace` (glob), `status`, `owner` (user name or uid). `limit` and `cursor` as for
    `list_requests`; a run whose metadata cannot be read is skipped."""
    try:
        n, after = paging.limit_of(q.limit), paging.decode("runs", q.cursor)
        wanted = paging.Filters(
            tuple(who.scopes),
            ops.checked_glob(q.workspace),
            paging.owner_uid(q.owner),
            status=q.status and str(q.status),
        )
    except paging.BadPage as e:
        raise ApiError(422, "bad_page", str(e)) from None

    def read(e: Listed) -> schemas.RunSummary | None:
        try:
            return _run_summary(e.workspace, inbox.load_run(e.workspace, str(e.run_id)))
        except (ProtocolError, OSError):
            return None

    docs, last = paging.collect(ctx.feed.index.runs(after), wanted.keep, read, n)
    return schemas.RunPage(runs=docs, next=paging.encode("runs", last) if last else None)


def _run_summary(ws: Path, meta: Any) -> schemas.RunSummary:
    return schemas.RunSummary(
        workspace=show_path(ws),
        run_id=meta.run_id,
        status=meta.status,
        task=meta.task,
        agent=Path(meta.agent_ref).name,
        start_time=iso(meta.start_time),
        updated_at=iso(meta.updated_at),
        end_time=iso(meta.end_time) if meta.end_time else None,
        iterations_completed=meta.iterations_completed,
        error=meta.error,
        error_kind=meta.error_kind,
    )


def _unshown(name: str) -> str:
    """A workspace named as the API shows it (a raw name without escapes is the same)."""
    try:
        return unshow(name)
    except ValueError:
        return name


def get_run(ctx: Context, who: Identity, q: ops.GetRun) -> schemas.RunDetail:
    run_id = q.run_id
    ws = _run_workspace(ctx, who, run_id, q.workspace)
    try:
        meta = inbox.load_run(ws, run_id)
    except (ProtocolError, OSError):
        raise ApiError(404, "unknown_run", f"no run {run_id} in {ws}") from None
    events = journal_tail(Workspace(ws).run(run_id).journal)
    thoughts = [t for e in events if (t := viewing.payload_of(e, Thought)) is not None]
    last = thoughts[-1].content if thoughts else None
    return schemas.RunDetail(
        **dict(_run_summary(ws, meta)),
        last_message=last,
        outcome=inbox.run_outcome(Workspace(ws), meta),
        journal=[shown_event(e) for e in events],
    )


def _run_workspace(ctx: Context, who: Identity, run_id: str, workspace: str | None) -> Path:
    if workspace is None:
        # A run id is a name a workspace gives itself (copies share it): never a guess, and
        # never a hint at a workspace outside the caller's scope.
        mine = [w for w in ctx.feed.index.run_holders(run_id) if visible(who, w)]
        if not mine:
            raise ApiError(404, "unknown_run", f"no run {run_id} (give ?workspace=PATH)")
        if len(mine) > 1:
            names = [show_path(w) for w in mine]
            raise ApiError(
                409,
                "ambiguous_run",
                f"run {run_id} is in {len(names)} workspaces; name one with ?workspace=PATH",
                names,
            )
        ws = mine[0]
    else:
        found = qualifier(ctx, who, workspace)
        assert found is not None
        ws = found
    if "/" in run_id or run_id in (".", ".."):
        raise ApiError(404, "unknown_run", f"no run {run_id}")
    return ws


def shown_event(e: JournalEvent) -> dict[str, Any]:
    """An event as the run view shows it: as its journal line has it."""
    return {"seq": e.seq, "timestamp": iso(e.timestamp), "type": str(e.type), "payload": e.payload}


# -- signed links ---------------------------------------------------------------------------------
def link_for(ctx: Context, request_id: str, workspace: str) -> str:
    token = links.sign(ctx.link_key, request_id, workspace, ctx.config.link_ttl_seconds)
    return f"{ctx.base_url}/a/{token}"


def _link(ctx: Context, token: str) -> tuple[links.Link, Path]:
    """The link's question and the one workspace it was made for (never another holder of
    the same request id)."""
    try:
        link = links.verify(ctx.link_key, token)
    except links.BadLink as e:
        raise ApiError(e.http, e.code, str(e)) from None
    ws = Path(link.workspace)
    if ctx.feed.index.get(ws) is None:
        raise ApiError(409, "already_answered", "this question is no longer waiting")
    return link, ws


def check_link(ctx: Context, who: None, q: ops.CheckLink) -> dict[str, Any]:
    """Whether the signed link stands (checked before its body is read): `{}`, or ApiError."""
    try:
        links.verify(ctx.link_key, q.link)
    except links.BadLink as e:
        raise ApiError(e.http, e.code, str(e)) from None
    return {}


def link_request(ctx: Context, who: None, q: ops.LinkRequest) -> Question:
    link, ws = _link(ctx, q.link)
    p = pending_question(ws)
    if p is None or p.request.request_id != link.request_id:
        raise gone(ctx, ws, link.request_id)
    if p.answer_waiting:
        raise ApiError(409, "already_answered", "this question is no longer waiting")
    if p.request.expired():
        raise ApiError(410, "expired", f"question {link.request_id} expired")
    return Question.model_validate(request_document(p, Workspace(ws), ctx.base_url))


def link_answer(ctx: Context, who: None, q: ops.LinkAnswer) -> schemas.AnswerReceipt:
    link, ws = _link(ctx, q.link)
    try:
        _respondent(ws, link.request_id, None)  # a link names nobody
    except ApiError as e:
        _refused(ctx, ws, link.request_id, e, "link", "signed link", None)
        raise
    return deliver(ctx, ws, link.request_id, q.body, "signed link", "link")


def _refused(
    ctx: Context,
    ws: Path,
    request_id: str,
    e: ApiError,
    channel: str,
    by: str,
    voter: str | None,
) -> None:
    """An answer refused by the API's own checks, into the audit log as `quorum.cast` records
    the answering path's refusals (inbox/auditnotes.py: bounded)."""
    origin = None if channel == "link" else {"token": by}
    auditnotes.refused(
        ctx.audit, ws, request_id, e.code, str(e), channel=channel, by=by, voter=voter,
        origin=origin,
    )  # fmt: skip


def _respondent(ws: Path, request_id: str, who: inbox.Answerer | None) -> None:
    """403 unless the question's respondents (if it names any) include `who`."""
    try:
        why = inbox.refuse_respondent(Workspace(ws), request_id, who)
    except (ProtocolError, OSError):
        return  # the answering path reports a damaged workspace
    if why is not None:
        raise ApiError(403, "not_a_respondent", why)


# -- many answers at once, and hand-overs ---------------------------------------------------------
def answer_many(ctx: Context, who: Identity, q: ops.AnswerMany) -> schemas.AnswersOut:
    """One answer to many questions: each item (`request_id`, optional `workspace`) is answered
    on its own, exactly as `answer` answers one — its respondents checked, the answer checked
    against it, its own compare-and-set, its own Idempotency-Key record (the key with its
    request id) — and gets its own result: `accepted`, or `refused` with the code and the line
    a single answer would have got. Every question must be of the kind and options of the
    first one found (`different_kind` otherwise, `inbox.shape`): one answer means the same
    thing to each. A question named twice is refused the second time (`duplicate_item`)."""
    if not who.can_answer():
        raise ApiError(403, "forbidden", f"token {who.name} may read, not answer ({who.role})")
    if not 1 <= len(q.items) <= ops.BULK_MAX:
        raise ApiError(
            422, "bad_request", f"name 1 to {ops.BULK_MAX} questions, not {len(q.items)}"
        )
    shape: tuple[str, str] | None = None
    results: list[schemas.AnswerResult] = []
    digest = digest_of(q.body)
    named: set[tuple[str, object]] = set()
    for item in q.items:
        request_id, workspace = item.request_id, item.workspace
        try:
            if (request_id, workspace) in named:
                raise ApiError(422, "duplicate_item", f"question {request_id} is named twice")
            named.add((request_id, workspace))
            repeat = _repeat(ctx, who, request_id, digest, q.idempotency_key, workspace)
            if repeat is not None:  # a retry: its first response, before any other check
                results.append(schemas.AnswerResult.model_validate(repeat))
                continue
            ws = _workspace_of(ctx, who, request_id, workspace)
            p = pending_question(ws)
            if p is None or p.request.request_id != request_id:
                raise gone(ctx, ws, request_id)
            mine = (str(p.request.input_type), inbox.shape(p.request))
            shape = shape or mine
            if mine != shape:
                raise ApiError(
                    422,
                    "different_kind",
                    f"question {request_id} is {mine[0]} with other options than the first "
                    f"({shape[0]}): one answer cannot mean the same to both",
                )
            one = ops.Answer(
                request_id=request_id,
                body=q.body,
                idempotency_key=q.idempotency_key,
                workspace=show_path(ws),
            )
            results.append(schemas.AnswerResult.model_validate(document(answer(ctx, who, one))))
        except ApiError as e:
            results.append(
                schemas.AnswerResult(
                    status="refused",
                    request_id=request_id,
                    workspace=workspace,
                    code=e.code,
                    http=e.http,
                    error=json_safe(str(e)),
                )
            )
    accepted = sum(r.status == "accepted" for r in results)
    return schemas.AnswersOut(accepted=accepted, refused=len(results) - accepted, results=results)


def known_delegates(ctx: Context) -> set[str]:
    """Who a question may be handed to: the tokens that may answer, and their groups."""
    names: set[str] = set()
    for t in ctx.tokens.list():
        if t["role"] in ("answerer", "admin"):
            names |= {t["name"], *(inbox.GROUP + g for g in t.get("groups") or [])}
    return names


def delegate(ctx: Context, who: Identity, q: ops.Delegate) -> schemas.DelegateOut:
    """Hand question `request_id` to token, group or person `to` (delegation.py): beside the
    question, shown with it; the delegate may answer from then on."""
    if not who.can_answer():
        raise ApiError(403, "forbidden", f"token {who.name} may read, not answer ({who.role})")
    request_id, to = q.request_id, q.to
    ws = _workspace_of(ctx, who, request_id, q.workspace)
    me = inbox.Answerer(who.name, who.groups, who.role == "admin", who.also)
    try:
        req, handed = inbox.delegate(
            Workspace(ws),
            request_id,
            to,
            who=me,
            known=known_delegates(ctx),
            note=q.note,
            people=ctx.config.oidc is not None,
            audit=ctx.audit,
            origin={"token": who.name},
        )
    except inbox.NotPending:
        raise gone(ctx, ws, request_id) from None
    except inbox.SubmitError as e:
        raise ApiError(e.http, e.code, str(e)) from None
    except (ProtocolError, OSError) as e:
        raise ApiError(
            409, "workspace_problem", f"the workspace cannot take a hand-over: {e}"
        ) from None
    log.info(
        "question_delegated", workspace=show_path(ws), request_id=request_id, by=who.name, to=to
    )
    return schemas.DelegateOut(
        status="delegated",
        request_id=request_id,
        workspace=show_path(ws),
        run_id=req.run_id,
        respondents=req.respondents,
        delegations=[
            schemas.DelegationOut.model_validate(d) for d in inbox.shown_delegations(handed)
        ],
    )


# -- what the inbox asks besides the API's documents ----------------------------------------------
def history(ctx: Context, who: Identity, q: ops.History) -> schemas.History:
    """`GET /v1/history` (deltad/inbox/history.py)."""

    return read_history(ctx, who, q.limit)


def vitals(ctx: Context, who: None, q: ops.Vitals) -> dict[str, Any]:
    """The core's health and metrics as plain figures, for /livez, /readyz and /metrics."""
    h = ctx.vitals.health()
    return {"health": dataclasses.asdict(h), "metrics": ctx.vitals.core_metrics().decode()}


def channel_interaction(ctx: Context, who: None, q: ops.ChannelInteraction) -> dict[str, Any]:
    """A channel's own request, relayed (Slack's interactions, Teams' activities): the channel
    checks its signature and decides (`{"response": ...}`)."""
    take = ctx.interactions.get(q.channel)
    if take is None:
        raise ApiError(404, "not_found", f"the {q.channel} channel is not configured")
    if q.channel == "teams":
        return take(q.body, q.signature, q.keys)
    return take(q.body, q.timestamp, q.signature)
