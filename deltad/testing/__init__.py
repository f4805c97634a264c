"""Test doubles shared by the test suite and the benchmarks (after `structlog.testing`)."""

from .fakellm import FakeLLM, tool_call

__all__ = ["FakeLLM", "tool_call"]
