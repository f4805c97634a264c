"""Test doubles shipped with the product (after `structlog.testing`): real implementations of
deltad's own seams, for its test suite, benchmarks and anyone embedding deltad.

    FakeLLM          an OpenAI-compatible HTTP server on 127.0.0.1, scripted (faults included)
    ScriptedModel    an in-process ChatModel with the same script vocabulary
    executor_contract  the contract suite every job executor passes (a third party's too)
    stub             a stand-in resume client (the `resume_command` seam) for daemon tests;
                     a module the warm fork server can run (`python -m deltad.testing.stub`)

This repository's own harness (a daemon runner, a Slurm cluster, Slack and webhook stand-ins,
a watch tree without a kernel) lives in tests/support/, outside the wheel.
"""

from .fakellm import FakeLLM, tool_call
from .model import ScriptedModel

__all__ = ["FakeLLM", "ScriptedModel", "tool_call"]
