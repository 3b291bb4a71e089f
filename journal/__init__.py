"""The journal: the event vocabulary of a request and its SQLite storage.

This package is the ground floor: it imports nothing of `smg` or `replay`.
"""

from journal.events import (
    Block,
    Completed,
    Counted,
    Error,
    Event,
    McpCall,
    McpConnect,
    McpResult,
    ModelCall,
    ModelResult,
    Received,
    Rejected,
    Rendered,
    Routed,
    StreamOpened,
    Tokens,
    Upstream,
    Validated,
    event_from_dict,
)

__all__ = [
    "Block",
    "Completed",
    "Counted",
    "Error",
    "Event",
    "McpCall",
    "McpConnect",
    "McpResult",
    "ModelCall",
    "ModelResult",
    "Received",
    "Rejected",
    "Rendered",
    "Routed",
    "StreamOpened",
    "Tokens",
    "Upstream",
    "Validated",
    "event_from_dict",
]
