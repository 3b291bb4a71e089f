"""Ids of the blocks the gateway builds.

A `tool_use` id the model did not write is derived from the message id and the call's position,
so recomputing a journaled response (offline replay) gives the same ids byte for byte.
"""

from __future__ import annotations

import hashlib


def tool_use_id(message_id: str, index: int) -> str:
    """`toolu_` + 24 hex characters, stable for (message, call index)."""
    return "toolu_" + hashlib.sha256(f"{message_id}:{index}".encode()).hexdigest()[:24]


def from_parser_id(parser_id: str) -> str:
    """A model-written id as the client sees it: `call_X` becomes `toolu_X`; others are kept
    (Kimi's `functions.f:N`, an id already `toolu_…`)."""
    return "toolu_" + parser_id[5:] if parser_id.startswith("call_") else parser_id
