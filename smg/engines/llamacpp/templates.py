"""Chat templates the tokenizer export can ship instead of a GGUF's own.

Small ChatML models (SmolLM2 and the like) carry a template that concatenates `message['content']`
and knows nothing of tools, so a turn holding a `tool_use` (content empty, `tool_calls` set) or a
tool result fails to render. `CHATML_TOOLS` is ChatML with tools in the Hermes format the gateway's
`qwen` tool parser reads: the tool list in the system turn, each call as
`<tool_call>{"name": …, "arguments": …}</tool_call>`, results as `<tool_response>` in a user turn.
"""

from __future__ import annotations

import json
import re

CHATML_TOOLS = r"""{%- macro render_content(content) -%}
    {%- if content is none -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- else -%}
        {%- for part in content -%}
            {%- if part is string -%}{{- part -}}
            {%- elif part.type == 'text' -%}{{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools or has_system or default_system -%}
    {{- '<|im_start|>system\n' -}}
    {%- if has_system -%}
        {{- render_content(messages[0].content) -}}
    {%- elif default_system -%}
        {{- default_system -}}
    {%- endif -%}
    {%- if tools -%}
        {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" -}}
        {{- "You are provided with function signatures within <tools></tools> XML tags:\n<tools>" -}}
        {%- for tool in tools -%}
            {{- "\n" + (tool | tojson) -}}
        {%- endfor -%}
        {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within " -}}
        {{- "<tool_call></tool_call> XML tags:\n<tool_call>\n" -}}
        {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' -}}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role == 'system' and loop.first -%}
    {%- elif message.role == 'assistant' -%}
        {%- set content = render_content(message.content) -%}
        {{- '<|im_start|>assistant\n' + content -}}
        {%- for call in message.tool_calls or [] -%}
            {%- set call = call.function if call.function is defined else call -%}
            {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
            {%- if call.arguments is string -%}{{- call.arguments -}}
            {%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

# A ChatML template that writes a system turn of its own when the conversation has none.
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system(?:\\n|\n)(.+?)<\|im_end\|>")


def is_chatml(template: str) -> bool:
    return "<|im_start|>" in template and "<|im_end|>" in template


def handles_tools(template: str) -> bool:
    """Whether a template reads the tool list or the calls of an assistant turn."""
    return "tools" in template or "tool_calls" in template


def chatml_with_tools(original: str) -> str:
    """`CHATML_TOOLS`, keeping the default system prompt `original` writes when there is none."""
    found = _DEFAULT_SYSTEM.search(original)
    if found is None or "{" in found.group(1):
        return CHATML_TOOLS
    return "{%- set default_system = " + json.dumps(found.group(1), ensure_ascii=False) + " -%}\n" + CHATML_TOOLS
