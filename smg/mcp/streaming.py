"""The tool loop's stream, sans-IO: every round's upstream events in, the client's events out
(behaviors.md I.5).

- `message_start` of the first round only;
- content blocks re-indexed on one counter across rounds (an upstream index past 1024 is an
  error); a `tool_use` block starts as `mcp_tool_use` (`mcptoolu_` id, `server_name`, empty
  input), its `input_json_delta`s follow unchanged;
- each result is its own `mcp_tool_result` block (start and stop, no delta);
- upstream `message_delta`/`message_stop` are held back: the stream ends with one
  `message_delta` carrying the final stop reason and the usage summed over rounds, then
  `message_stop`;
- `ping`, `error` and unknown events pass through (the loop ends the stream on `error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from smg.mcp.blocks import mcp_id, mcp_tool_result_start
from smg.protocol.fold import BlockFold

MAX_UPSTREAM_INDEX = 1024


class StreamRewriteError(ValueError):
    """An upstream event the rewriter cannot place."""


@dataclass
class Round:
    """What one model call said, once its `message_stop` arrived."""

    fold: BlockFold = field(default_factory=BlockFold)
    stop_reason: str | None = None
    stop_sequence: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    complete: bool = False

    def tool_uses(self) -> list[dict[str, Any]]:
        return [b for b in self.fold.content() if b.get("type") == "tool_use"]

    @property
    def usage(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


class StreamRewriter:
    def __init__(self, owners: Mapping[str, str]) -> None:
        self._owners = owners
        self._next_index = 0
        self._indices: dict[int, int] = {}
        self._started = False
        self.rounds: list[Round] = []

    @property
    def current(self) -> Round:
        return self.rounds[-1]

    def begin_round(self) -> None:
        self._indices = {}
        self.rounds.append(Round())

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        kind = event.get("type")
        current = self.current
        if kind == "message_start":
            usage = (event.get("message") or {}).get("usage") or {}
            current.input_tokens = _count(usage.get("input_tokens"))
            current.output_tokens = _count(usage.get("output_tokens"))
            if self._started:
                return []
            self._started = True
            return [event]
        if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
            return [self._block(event)]
        if kind == "message_delta":
            delta = event.get("delta") or {}
            current.stop_reason = delta.get("stop_reason", current.stop_reason)
            current.stop_sequence = delta.get("stop_sequence", current.stop_sequence)
            usage = event.get("usage") or {}
            if usage.get("input_tokens") is not None:
                current.input_tokens = _count(usage["input_tokens"])
            if usage.get("output_tokens") is not None:
                current.output_tokens = _count(usage["output_tokens"])
            return []
        if kind == "message_stop":
            current.complete = True
            return []
        return [event]

    def _block(self, event: dict[str, Any]) -> dict[str, Any]:
        upstream = event.get("index")
        if not isinstance(upstream, int) or upstream < 0:
            raise StreamRewriteError(f"Upstream {event.get('type')} without a valid index")
        if upstream > MAX_UPSTREAM_INDEX:
            raise StreamRewriteError(f"Upstream content block index {upstream} exceeds maximum ({MAX_UPSTREAM_INDEX})")
        self.current.fold.feed(event)
        out = dict(event)
        if event["type"] == "content_block_start":
            self._indices[upstream] = self._take_index()
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                out["content_block"] = {
                    "type": "mcp_tool_use",
                    "id": mcp_id(str(block.get("id", ""))),
                    "name": block.get("name"),
                    "server_name": self._owners.get(str(block.get("name")), ""),
                    "input": {},
                }
        elif upstream not in self._indices:
            raise StreamRewriteError(f"Upstream {event['type']} for block {upstream}, which never started")
        out["index"] = self._indices[upstream]
        return out

    def _take_index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index

    def tool_result(self, tool_use_id: str, text: str, is_error: bool) -> list[dict[str, Any]]:
        index = self._take_index()
        return [
            {"type": "content_block_start", "index": index,
             "content_block": mcp_tool_result_start(tool_use_id, text, is_error)},
            {"type": "content_block_stop", "index": index},
        ]  # fmt: skip

    def finish(self) -> list[dict[str, Any]]:
        """The closing events, after the final round."""
        final = self.current
        usage = {
            "input_tokens": sum(r.input_tokens for r in self.rounds),
            "output_tokens": sum(r.output_tokens for r in self.rounds),
        }
        delta = {"stop_reason": final.stop_reason, "stop_sequence": final.stop_sequence}
        return [{"type": "message_delta", "delta": delta, "usage": usage}, {"type": "message_stop"}]


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
