"""The model seam: one `ChatModel` interface; `OpenAIChatModel` speaks Chat Completions.

Endpoint and key come from DELTA_BASE_URL / DELTA_API_KEY, else the standard OPENAI_BASE_URL /
OPENAI_API_KEY, so OpenAI, vLLM, Ollama and llama.cpp servers all work.

Failures come in two kinds (docs/design.md, "Model failures"):
- transient (connection refused/reset, timeouts, 408/409/425/429, 5xx, a 200 whose body is not
  a chat completion): retried here with capped exponential backoff and Retry-After, each retry
  said in one line; what outlasts the retries or the total time cap is `ModelUnavailable`, and
  the run stays resumable;
- permanent (400, 401, 403, 404, 422...): `ModelRefused`, the run fails with the reason.
The SDK's own retries are off (they are silent); the SDK is kept for its endpoint conventions
and auth, and the request goes out through its low-level `post` as bytes serialised once
(`compact_json`, the same bytes the io record keeps), so a call costs one `json.dumps` and the
HTTP exchange, whatever the length of the conversation: no per-message work in the SDK.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import openai

from deltad.agent import LLMSettings, ProviderSettings
from deltad.errors import LLMError, UsageError
from deltad.pacing import Pacing
from deltad.protocol.fsio import compact_json

TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
MAX_RETRIES_LIMIT = 20
BACKOFF_INITIAL = 0.5
BACKOFF_CAP = 20.0
PACING = Pacing(BACKOFF_INITIAL, BACKOFF_CAP, jitter=0.2)  # many clients must not retry in step
JSON_HEADERS = {"Content-Type": "application/json"}  # the body goes out as prepared bytes
NOTICE_AFTER = 15.0  # seconds of silence on one attempt before saying we are still waiting


@dataclass
class ChatReply:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None


class ModelUnavailable(LLMError):
    """Transient: the endpoint did not give a usable answer in time. The run stays resumable."""

    kind = "model_unavailable"

    def __init__(self, reason: str, attempts: int, status: int | None = None) -> None:
        super().__init__(f"model endpoint unavailable: {reason}, {attempts} attempt(s)")
        self.attempts, self.status = attempts, status


class ModelRefused(LLMError):
    """Permanent: the endpoint refused the request; retrying the same request cannot help."""

    kind = "model_refused"

    def __init__(self, message: str, status: int | None, config_var: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.config_var = config_var  # set for 401/403: a configuration problem


class ChatModel(Protocol):
    def request_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]: ...

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        body: bytes | None = None,
    ) -> ChatReply:
        """`body`, when given, is `request_body(messages, tools)` already serialised."""
        ...


@dataclass(frozen=True)
class Endpoint:
    base_url: str | None
    key: str
    key_var: str | None  # which variable supplied the key


def endpoint_from_env() -> Endpoint:
    base = os.environ.get("DELTA_BASE_URL") or os.environ.get("OPENAI_BASE_URL") or None
    for var in ("DELTA_API_KEY", "OPENAI_API_KEY"):
        if key := os.environ.get(var):
            return Endpoint(base, key, var)
    if base is None:
        raise LLMError("no API key: set OPENAI_API_KEY (or DELTA_API_KEY)")
    return Endpoint(base, "unused", None)  # local servers (Ollama, llama.cpp) often take none


def retries_from_env(default: int) -> int:
    raw = os.environ.get("DELTA_LLM_MAX_RETRIES")
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_RETRIES_LIMIT:
        raise UsageError(
            f"DELTA_LLM_MAX_RETRIES={raw!r}: expected a whole number from 0 to {MAX_RETRIES_LIMIT}"
        )
    return value


def provider_endpoint(name: str, provider: ProviderSettings) -> Endpoint:
    """A named provider's endpoint: its base URL, its key from `api_key_env` (none: "unused",
    as local servers take)."""
    var = provider.api_key_env
    key = os.environ.get(var) if var else None
    if var and not key:
        raise LLMError(f"llm_provider {name}: its key variable {var} is not set")
    return Endpoint(provider.base_url, key or "unused", var)


def tuned(
    model: ChatModel, props: Mapping[str, str], providers: Mapping[str, ProviderSettings]
) -> ChatModel:
    """`model` with a pipeline node's settings (llm_model, llm_provider, reasoning_effort,
    temperature; checked before the run started). A model that is not ours is kept as is."""
    if not props or not isinstance(model, OpenAIChatModel):
        return model
    update: dict[str, Any] = {}
    if "llm_model" in props:
        update["model"] = props["llm_model"]
    if "reasoning_effort" in props:
        update["reasoning_effort"] = props["reasoning_effort"]
    if "temperature" in props:
        update["temperature"] = float(props["temperature"])
    endpoint = model.endpoint
    if (name := props.get("llm_provider")) is not None:
        if name not in providers:
            raise LLMError(f"llm_provider {name!r} is not in the agent's providers")
        endpoint = provider_endpoint(name, providers[name])
    return OpenAIChatModel(model.settings.model_copy(update=update), model.say, endpoint)


# -- what went wrong ---------------------------------------------------------------------------
@dataclass
class Failure:
    transient: bool
    summary: str  # "503 Service Unavailable", "connection refused", ...
    status: int | None = None
    retry_after: float | None = None
    detail: str = ""


def retry_after(headers: Any) -> float | None:
    """Seconds from `Retry-After` (seconds or an HTTP date) or `retry-after-ms`."""
    if headers is None:
        return None
    if ms := headers.get("retry-after-ms"):
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _message(e: openai.APIStatusError) -> str:
    body = e.body if isinstance(e.body, dict) else {}
    err = body.get("error", body) if isinstance(body, dict) else {}
    text = err.get("message") if isinstance(err, dict) else None
    return " ".join(str(text or e.message).split())[:300]


def classify(e: BaseException) -> Failure:
    import openai

    if isinstance(e, openai.APIStatusError):
        status = e.status_code
        phrase = getattr(e.response, "reason_phrase", "") or ""
        summary = f"{status} {phrase}".strip()
        transient = status in TRANSIENT_STATUS or status >= 500
        return Failure(transient, summary, status, retry_after(e.response.headers), _message(e))
    if isinstance(e, openai.APITimeoutError):
        return Failure(True, "timed out")
    if isinstance(e, openai.APIConnectionError):
        cause = e.__cause__
        why = "connection refused" if "refused" in str(cause).lower() else "cannot connect"
        return Failure(True, why, detail=str(cause or e)[:200])
    return Failure(True, "an unusable response", detail=f"{type(e).__name__}: {e}"[:200])


class BadBody(ValueError):
    """A 200 response whose body is not a chat completion."""


def parse_completion(raw: bytes) -> ChatReply:
    """A 200 body → the reply; BadBody when it is not a chat completion (truncated JSON,
    no choices, `message: null`...), which counts as transient."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadBody("the body is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list) or not doc["choices"]:
        raise BadBody("no choices in the body")
    choice = doc["choices"][0]
    msg = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(msg, dict):
        raise BadBody("the choice has no message")
    content = msg.get("content")
    calls = msg.get("tool_calls") or []
    if (content is not None and not isinstance(content, str)) or not isinstance(calls, list):
        raise BadBody("the message is not a chat message")
    if not all(isinstance(c, dict) for c in calls):
        raise BadBody("a tool call is not an object")
    finish = choice.get("finish_reason")
    return ChatReply(content, calls, doc, finish if isinstance(finish, str) else None)


_TLS: dict[tuple[str | None, str | None], ssl.SSLContext] = {}

# The transport under every model client this process builds; None: the network. Set only
# while the fork server rehearses a resume in itself (executors/rehearsal.py), which answers
# in-process, and None again before it forks.
TRANSPORT: Any = None


def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context (certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR as httpx
    reads them), made once per process and those two settings."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    if (ctx := _TLS.get(key)) is None:
        import httpx

        ctx = _TLS[key] = httpx.create_ssl_context()
    return ctx


class OpenAIChatModel:
    def __init__(
        self,
        settings: LLMSettings,
        say: Callable[[str], None] = lambda _: None,
        endpoint: Endpoint | None = None,
    ) -> None:
        # Check the endpoint now (a resume must fail before touching the run), but build the
        # SDK client on first use: `import openai` costs ~0.9 s of CPU, and many runs never
        # call out (a resume that asks again, a busy workspace, an ingested crash repair).
        self.endpoint = endpoint or endpoint_from_env()
        self.settings = settings
        self.retries = retries_from_env(settings.max_retries)
        self.say = say  # one line to the person (stderr) and the run's log

    @cached_property
    def client(self) -> openai.OpenAI:
        import openai

        return openai.OpenAI(
            api_key=self.endpoint.key,
            base_url=self.endpoint.base_url,
            max_retries=0,  # ours: visible, capped in total, Retry-After honoured
            timeout=self.settings.timeout_seconds,
            # The SDK's own client, with a TLS context made once per process (or once in the
            # warm fork server, for every resume it forks): a fresh one loads the CA bundle,
            # ~15-50 ms of each resume's close → exit.
            http_client=openai.DefaultHttpxClient(
                verify=tls_context(), **({} if TRANSPORT is None else {"transport": TRANSPORT})
            ),
        )

    def request_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.settings.model, "messages": messages}
        if tools:
            body |= {"tools": tools, "tool_choice": "auto"}
        if self.settings.temperature is not None:
            body["temperature"] = self.settings.temperature
        if self.settings.max_tokens is not None:
            body["max_tokens"] = self.settings.max_tokens
        if self.settings.reasoning_effort is not None:
            body["reasoning_effort"] = self.settings.reasoning_effort
        return body

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        body: bytes | None = None,
    ) -> ChatReply:
        if body is None:
            body = compact_json(self.request_body(messages, tools))
        attempts = 1 + self.retries
        deadline = time.monotonic() + self.settings.total_timeout_seconds
        for attempt in range(1, attempts + 1):
            left = deadline - time.monotonic()
            try:
                return self._attempt(body, max(1.0, min(self.settings.timeout_seconds, left)))
            except Exception as e:  # every failure is classified; Ctrl-C is not an Exception
                failure = self._failure(e)
            if not failure.transient:
                raise self._refused(failure)
            if attempt == attempts:
                raise ModelUnavailable(failure.summary, attempt, failure.status)
            wait = self._wait(attempt, failure)
            if time.monotonic() + wait >= deadline:
                total = self.settings.total_timeout_seconds
                raise ModelUnavailable(
                    f"{failure.summary}; gave up at the {total:g} s total cap "
                    "(llm.total_timeout_seconds)",
                    attempt,
                    failure.status,
                )
            self.say(
                f"model endpoint {failure.summary}, retrying in {wait:.1f} s "
                f"(attempt {attempt + 1}/{attempts})"
            )
            time.sleep(wait)
        raise AssertionError("unreachable")

    def _failure(self, e: Exception) -> Failure:
        if isinstance(e, BadBody):
            return Failure(True, "a 200 response that is not a chat completion", detail=str(e))
        return classify(e)

    def _wait(self, attempt: int, failure: Failure) -> float:
        wait = PACING.delay(attempt)
        if failure.retry_after is not None:
            if failure.retry_after > BACKOFF_CAP:
                self.say(
                    f"model endpoint asked to wait {failure.retry_after:.0f} s (Retry-After); "
                    f"waiting at most {BACKOFF_CAP:.0f} s before the next attempt"
                )
            wait = min(max(wait, failure.retry_after), BACKOFF_CAP)
        return float(wait)

    def _refused(self, f: Failure) -> ModelRefused:
        detail = f": {f.detail}" if f.detail else ""
        if f.status in (401, 403):
            var = self.endpoint.key_var or "OPENAI_API_KEY (none is set)"
            return ModelRefused(
                f"model endpoint answered {f.summary}{detail}; check the key in {var} "
                "(and DELTA_BASE_URL / OPENAI_BASE_URL)",
                f.status,
                var,
            )
        return ModelRefused(f"model endpoint answered {f.summary}{detail}", f.status)

    def _attempt(self, body: bytes, timeout: float) -> ChatReply:
        import httpx2  # the HTTP package of openai 3.x (pinned in pyproject.toml)

        after = min(NOTICE_AFTER, timeout / 2)
        notice = threading.Timer(after, self._still_waiting, args=(time.monotonic(),))
        notice.daemon = True
        notice.start()
        try:
            resp = self.client.post(
                "/chat/completions",
                content=body,
                cast_to=httpx2.Response,
                options={"timeout": timeout, "headers": JSON_HEADERS},
            )
            raw = resp.read()
        finally:
            notice.cancel()
        return parse_completion(raw)

    def _still_waiting(self, since: float) -> None:
        self.say(f"still waiting for the model endpoint ({time.monotonic() - since:.0f} s so far)")
