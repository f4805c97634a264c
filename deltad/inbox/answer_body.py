"""What an answer says and why one is refused, apart from the answering path itself: the
answer body (`AnswerIn`: what `response.json` holds, minus `request_id`) and the refusals
(`SubmitError` and its kinds, each with its code and HTTP status). It imports nothing of the
answering code, so the unprivileged inbox process checks an answer's shape with the same model
the core checks it with (deltad/inbox/schemas.py's `AnswerBody`, the Maildir's replies), and
loads nothing that reads a workspace."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from deltad.protocol import kinds
from deltad.protocol.replies import CallDecision


class SubmitError(Exception):
    """Why an answer was not written; `code` and `http` say which kind, for every channel."""

    code: ClassVar[str] = "error"
    http: ClassVar[int] = 400


class NotPending(SubmitError):
    code, http = "unknown_request", 404


class AlreadyAnswered(SubmitError):
    code, http = "already_answered", 409


class AnswerWaiting(SubmitError):
    code, http = "answer_waiting", 409


class Expired(SubmitError):
    code, http = "expired", 410


class TooLarge(SubmitError):
    """The answer file would be over the size the resume reads."""

    code, http = "too_large", 413


class Misfit(SubmitError):
    """The answer does not fit the question: the same message `delta run` would give."""

    code, http = "misfit", 422


class Unsigned(SubmitError):
    """A gated question (protocol/seal.py) answered where no seal can be made: `delta respond`
    as the owner. Only the root core signs."""

    code, http = "needs_signed_answer", 403


class _AnswerBase(BaseModel):
    """What `response.json` holds, minus `request_id` (the question it answers is named apart):
    the fields below plus each kind's own (`kinds.answer_fields`), so a kind answered with a
    field of its own is read here, in the API document and by `delta respond` alike."""

    model_config = ConfigDict(extra="forbid")
    comment: str | None = Field(default=None, description="A note kept with the answer.")

    @classmethod
    def parse(cls, obj: object) -> Self:
        """From a JSON-like document; Misfit (one line) when it is not an answer."""
        try:
            return cls.model_validate(obj)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            raise Misfit(f"{where}: {first['msg']}") from None


if TYPE_CHECKING:

    class AnswerIn(_AnswerBase):  # what mypy sees: the built-in kinds' fields
        answer: str | None = None
        decisions: list[CallDecision] | None = None

else:
    AnswerIn = create_model(
        "AnswerIn",
        __base__=_AnswerBase,
        __doc__="An answer: `answer` (text, a key, yes/no, ...) or `decisions` (one per "
        "gated call).",
        **kinds.answer_fields(),
    )
