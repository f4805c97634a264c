"""The model client's TLS context is made once per process (engine/llm.py): every resume the
warm fork server forks shares the one it made, unless the trust settings differ."""

from __future__ import annotations

import ssl

import pytest

from deltad.agent import LLMSettings
from deltad.engine.llm import Endpoint, OpenAIChatModel, tls_context


def test_made_once_and_again_for_other_trust_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first = tls_context()
    assert isinstance(first, ssl.SSLContext) and tls_context() is first
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))  # httpx reads it: another context
    assert tls_context() is not first


def test_the_sdk_client_uses_it() -> None:
    model = OpenAIChatModel(
        LLMSettings(model="m"), endpoint=Endpoint("http://127.0.0.1:9/v1", "k", None)
    )
    pool = model.client._client._transport._pool  # httpx's: the context it was given
    assert pool._ssl_context is tls_context()
