"""Test doubles shipped with the product (after `structlog.testing`): real implementations of
the seams, for the test suite, benchmarks and anyone embedding deltad.

    FakeLLM        an OpenAI-compatible HTTP server on 127.0.0.1, scripted (faults included)
    ScriptedModel  an in-process ChatModel with the same script vocabulary
    daemon         a real `deltad serve` subprocess and its JSON log (tests, benches)
    stub           a stand-in resume client for daemon tests
    slackapi       Slack's Web API on 127.0.0.1 (records calls, scripted faults), and signed
                   interaction requests made with slack_sdk's own signer
"""

from .fakellm import FakeLLM, tool_call
from .model import ScriptedModel

__all__ = ["FakeLLM", "ScriptedModel", "tool_call"]
