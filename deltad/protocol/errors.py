"""Errors raised by the protocol layer. Each carries a one-line, user-facing message."""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class: something on disk is not what the protocol promises."""


class CorruptFile(ProtocolError):
    """A state file exists but cannot be parsed or validated."""


class UnsafeFile(ProtocolError):
    """A file where a regular file belongs is a symlink, FIFO, too large or not UTF-8."""


class IllegalTransition(ProtocolError):
    """A status change that the state table does not allow."""


class Busy(ProtocolError):
    """Another process holds the workspace lock."""
