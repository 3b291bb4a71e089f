"""A lower bound on a request's prompt tokens, computed from byte lengths before anything is
rendered or tokenized: what lets a prompt that cannot fit any context window be refused in
microseconds instead of after seconds of rendering and gigabytes of memory.

No token of the tokenizer stands for more bytes than its longest vocabulary entry (an entry's
UTF-8 length is at least the bytes it decodes to, for byte-level, metaspace and byte-fallback
vocabularies alike), so a text of N bytes is at least N / longest tokens. Only the text of user
turns is counted, because every chat template renders it; the bound is halved on top, for
normalizers that shorten text before it is split.
"""

from __future__ import annotations

from smg.pipeline.tokenizers import Tokenizer
from smg.protocol.content import TextBlock, ToolResultBlock
from smg.protocol.request import CountTokensRequest, CreateMessageRequest


def _user_text_bytes(request: CreateMessageRequest | CountTokensRequest) -> int:
    total = 0
    for message in request.messages:
        if message.role != "user":
            continue
        content = message.content
        if isinstance(content, str):
            total += len(content.encode("utf-8", "surrogatepass"))
            continue
        for block in content:
            if isinstance(block, TextBlock):
                total += len(block.text.encode("utf-8", "surrogatepass"))
            elif isinstance(block, ToolResultBlock) and isinstance(block.content, str):
                total += len(block.content.encode("utf-8", "surrogatepass"))
    return total


def prompt_token_floor(tokenizer: Tokenizer, request: CreateMessageRequest | CountTokensRequest) -> int:
    """At most the number of tokens `render_prompt` would produce for `request`."""
    return _user_text_bytes(request) // (2 * tokenizer.longest_token_bytes)
