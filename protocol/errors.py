"""Errors raised when bytes from another process are not a valid agentgym message."""

from __future__ import annotations


class ProtocolError(ValueError):
    """A frame could not be decoded: the message names what was wrong and where."""


class VersionMismatch(ProtocolError):
    """The peer speaks another protocol version."""

    def __init__(self, theirs: int, ours: int) -> None:
        super().__init__(
            f"peer speaks agentgym protocol version {theirs}, this build speaks {ours}; "
            "run the same agentgym release on the learner and on every actor"
        )
        self.theirs = theirs
        self.ours = ours
