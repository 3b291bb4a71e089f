"""Lower bounds on a request's prompt tokens from byte lengths, and the context-window refusal:
what lets a prompt that cannot fit a context window be refused without tokenizing it (seconds of
CPU and gigabytes of memory for tens of megabytes of text).

No token of the tokenizer stands for more bytes than its longest vocabulary entry (an entry's
UTF-8 length is at least the bytes it decodes to, for byte-level, metaspace and byte-fallback
vocabularies alike), so a text of N bytes is at least N / longest tokens; the bound is halved on
top, for normalizers that shorten text before it is split.

Two bounds, one per moment. Before rendering only the text of user turns is counted, because
every chat template renders it whole; every other part of a request (system, assistant turns,
tool calls and results, tool definitions) may be dropped, trimmed or cut by a template, so those
are bounded once the template has written the prompt text and before it is tokenized, which is
exact for every part and every template and costs a fraction of tokenizing.
"""

from __future__ import annotations

from smg.pipeline.tokenizers import Tokenizer
from smg.protocol.content import TextBlock, ToolResultBlock
from smg.protocol.errors import ApiError
from smg.protocol.request import CountTokensRequest, CreateMessageRequest

_MAX_UTF8_BYTES_PER_CHAR = 4


def context_exceeded(limit: int, tokens: int, *, at_least: bool = False) -> ApiError:
    """The refusal of a prompt longer than a context window of `limit` tokens (`at_least`: the
    count is a bound, the prompt was not tokenized)."""
    count = f"at least {tokens}" if at_least else str(tokens)
    return ApiError(
        400,
        f"This model's maximum context length is {limit} tokens. However, your request has {count} input "
        "tokens. Please reduce the length of the input.",
        code="context_length_exceeded",
    )


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


def _floor(tokenizer: Tokenizer, nbytes: int) -> int:
    return nbytes // (2 * tokenizer.longest_token_bytes)


def prompt_token_floor(tokenizer: Tokenizer, request: CreateMessageRequest | CountTokensRequest) -> int:
    """At most the number of tokens `render_prompt` would produce for `request`."""
    return _floor(tokenizer, _user_text_bytes(request))


def check_rendered(tokenizer: Tokenizer, text: str, limit: int) -> None:
    """Refuse a rendered prompt whose length alone proves it has more than `limit` tokens."""
    if _floor(tokenizer, _MAX_UTF8_BYTES_PER_CHAR * len(text)) <= limit:
        return  # short enough that even four bytes a character could fit: no copy made
    floor = _floor(tokenizer, len(text.encode("utf-8", "surrogatepass")))
    if floor > limit:
        raise context_exceeded(limit, floor, at_least=True)
