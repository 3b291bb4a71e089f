"""Cross-field request rules: the shapes the public Messages API refuses that no single field
can refuse on its own (behaviors.md B.4–B.8).

Each rule is a pure function over parsed models that raises `invalid_request(message, code)`,
the message naming the offending field the way the public API names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from smg.protocol.content import TextBlock, ToolResultBlock, ToolUseBlock
from smg.protocol.errors import ApiError, invalid_request
from smg.protocol.request import (
    CountTokensRequest,
    CreateMessageRequest,
    InputMessage,
    McpServer,
    Thinking,
    ThinkingEnabled,
    ToolChoice,
    ToolChoiceNone,
    ToolChoiceTool,
)
from smg.protocol.tools import McpToolset, Tool, tool_matches, tool_name

INTERLEAVED_THINKING_BETA = "interleaved-thinking"


def validate_create_message(req: CreateMessageRequest, *, anthropic_beta: str | None = None) -> None:
    """Every cross-field rule of `POST /v1/messages`, first failure wins."""
    check_unique_tool_names(req.tools)
    check_mcp_servers(req.tools, req.mcp_servers)
    check_tool_choice(req.tool_choice, req.tools)
    check_message_contents(req.messages)
    check_tool_pairing(req.messages)
    check_thinking_budget(req.thinking, req.max_tokens, anthropic_beta)


def validate_count_tokens(req: CountTokensRequest) -> None:
    """The same message, tool and tool_choice rules, for a body without `max_tokens`."""
    check_unique_tool_names(req.tools)
    servers = (req.model_extra or {}).get("mcp_servers")
    check_mcp_servers(req.tools, servers if isinstance(servers, list) else None)
    check_tool_choice(req.tool_choice, req.tools)
    check_message_contents(req.messages)
    check_tool_pairing(req.messages)


def check_unique_tool_names(tools: Sequence[Tool] | None) -> None:
    """Named tools (all but `mcp_toolset` entries) have distinct names.

    Parsing already refuses a duplicate on the raw list, before any per-tool error; this
    covers tool lists assembled in code (e.g. MCP tools replacing an `mcp_toolset`).
    """
    seen: set[str] = set()
    for tool in tools or ():
        name = tool_name(tool)
        if name is None:
            continue
        if name in seen:
            raise invalid_request("tools: Tool names must be unique.", "duplicate_tool_names")
        seen.add(name)


def check_mcp_servers(tools: Sequence[Tool] | None, mcp_servers: Sequence[McpServer | object] | None) -> None:
    if any(isinstance(t, McpToolset) for t in tools or ()) and not mcp_servers:
        raise invalid_request("mcp_servers is required when mcp_toolset tools are present", "mcp_servers_required")


def check_tool_choice(tool_choice: ToolChoice | None, tools: Sequence[Tool] | None) -> None:
    if tool_choice is None or isinstance(tool_choice, ToolChoiceNone):
        return
    if not tools:
        raise invalid_request(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            "tool_choice_requires_tools",
        )
    if isinstance(tool_choice, ToolChoiceTool) and not any(tool_matches(t, tool_choice.name) for t in tools):
        raise invalid_request(
            f"Invalid value for 'tool_choice': tool '{tool_choice.name}' not found in 'tools'.",
            "tool_choice_tool_not_found",
        )


def check_message_contents(messages: Sequence[InputMessage]) -> None:
    """Content is non-empty except in a final assistant prefill, which must not end in
    whitespace; text blocks are non-empty. `system` messages are exempt."""
    last = len(messages) - 1
    for index, message in enumerate(messages):
        if message.role == "system":
            continue
        final_assistant = index == last and message.role == "assistant"
        content = message.content
        # `isspace` stops at the first other character; `strip` would copy a prompt of megabytes.
        empty = (not content or content.isspace()) if isinstance(content, str) else not content
        if empty and not final_assistant:
            raise invalid_request(
                f"messages.{index}: {message.role} messages must have non-empty content",
                "empty_content",
            )
        if isinstance(content, list) and any(
            isinstance(b, TextBlock) and (not b.text or b.text.isspace()) for b in content
        ):
            raise invalid_request(f"messages.{index}: text content blocks must be non-empty", "empty_text_block")
        if final_assistant:
            tail: str | None
            if isinstance(content, str):
                tail = content
            else:
                tail = content[-1].text if content and isinstance(content[-1], TextBlock) else None
            if tail and tail[-1].isspace():
                raise invalid_request(
                    "messages: final assistant content cannot end with trailing whitespace",
                    "prefill_trailing_whitespace",
                )


@dataclass
class _Turn:
    role: str
    at: int
    messages: list[tuple[int, InputMessage]] = field(default_factory=list)


def _turns(messages: Sequence[InputMessage]) -> list[_Turn]:
    """User and assistant turns: consecutive same-role messages merged, `system` skipped."""
    turns: list[_Turn] = []
    for index, message in enumerate(messages):
        if message.role == "system":
            continue
        if not turns or turns[-1].role != message.role:
            turns.append(_Turn(message.role, index))
        turns[-1].messages.append((index, message))
    return turns


def _unanswered(at: int, ids: Sequence[str]) -> ApiError:
    return invalid_request(
        f"messages.{at}: `tool_use` ids were found without `tool_result` blocks immediately "
        f"after: {', '.join(ids)}. Each `tool_use` block must have a corresponding "
        "`tool_result` block in the next message.",
        "tool_use_without_tool_result",
    )


def check_tool_pairing(messages: Sequence[InputMessage]) -> None:
    """Each `tool_use` of an assistant turn is answered exactly once by a `tool_result` in
    the next user turn, and each `tool_result` answers a call of the turn right before."""
    pending: list[str] = []
    pending_at = 0
    for turn in _turns(messages):
        if turn.role == "assistant":
            if pending:
                raise _unanswered(pending_at, pending)
            pending = [
                block.id
                for _, message in turn.messages
                if isinstance(message.content, list)
                for block in message.content
                if isinstance(block, ToolUseBlock)
            ]
            pending_at = turn.at
            continue
        answered: set[str] = set()
        for index, message in turn.messages:
            if isinstance(message.content, str):
                continue
            for position, block in enumerate(message.content):
                if not isinstance(block, ToolResultBlock):
                    continue
                tool_id = block.tool_use_id
                if tool_id not in pending:
                    raise invalid_request(
                        f"messages.{index}.content.{position}: unexpected `tool_use_id` found "
                        f"in `tool_result` blocks: {tool_id}. Each `tool_result` block must "
                        "have a corresponding `tool_use` block in the previous message.",
                        "unexpected_tool_use_id",
                    )
                if tool_id in answered:
                    raise invalid_request(
                        f"messages.{index}.content.{position}: `tool_result` blocks must each "
                        f"answer a different `tool_use_id`: {tool_id} is answered twice.",
                        "duplicate_tool_result",
                    )
                answered.add(tool_id)
        missing = [tool_id for tool_id in pending if tool_id not in answered]
        if missing:
            raise _unanswered(pending_at, missing)
        pending = []
    if pending:
        raise _unanswered(pending_at, pending)


def check_thinking_budget(thinking: Thinking | None, max_tokens: int, anthropic_beta: str | None) -> None:
    """`budget_tokens` stays under `max_tokens`, unless `max_tokens` is 0 (nothing is
    generated) or the interleaved-thinking beta lifts the cap."""
    if not isinstance(thinking, ThinkingEnabled) or max_tokens == 0:
        return
    if anthropic_beta and INTERLEAVED_THINKING_BETA in anthropic_beta.lower():
        return
    if thinking.budget_tokens >= max_tokens:
        raise invalid_request(
            "thinking.budget_tokens: must be less than max_tokens "
            f"(budget_tokens {thinking.budget_tokens} >= max_tokens {max_tokens})",
            "thinking_budget_exceeds_max_tokens",
        )
