"""A streamed answer folded back into its content blocks, as a client SDK folds it.

Deltas are applied to the block at their `index`; `input_json_delta` fragments are joined and
parsed when the block stops (input that is not JSON becomes `{}`). The JSON projection of a
stream and the MCP tool loop both read streams this way.
"""

from __future__ import annotations

from typing import Any

import orjson


class BlockFold:
    """A streamed answer's content blocks, folded from its events as an SDK would, keyed by
    the upstream's own indices."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}

    def feed(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        index = event.get("index")
        if not isinstance(index, int):
            return
        if kind == "content_block_start":
            block = event.get("content_block")
            self.blocks[index] = dict(block) if isinstance(block, dict) else {}
        elif kind == "content_block_delta":
            block = self.blocks.get(index)
            delta = event.get("delta") or {}
            if block is None or not isinstance(delta, dict):
                return
            dtype = delta.get("type")
            if dtype == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif dtype == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif dtype == "signature_delta":
                block["signature"] = block.get("signature", "") + str(delta.get("signature", ""))
            elif dtype == "input_json_delta":
                self._json[index] = self._json.get(index, "") + str(delta.get("partial_json", ""))
            elif dtype == "citations_delta" and "citation" in delta:
                block["citations"] = [*(block.get("citations") or []), delta["citation"]]
        elif kind == "content_block_stop" and index in self._json:
            raw = self._json.pop(index)
            try:
                self.blocks[index]["input"] = orjson.loads(raw) if raw.strip() else {}
            except orjson.JSONDecodeError:
                self.blocks[index]["input"] = {}

    def content(self) -> list[dict[str, Any]]:
        return [self.blocks[i] for i in sorted(self.blocks)]
